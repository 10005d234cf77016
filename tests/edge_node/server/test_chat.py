import pytest

from tiergate.edge_node.model.demo_model import CHAT_TEMPLATE
from tiergate.edge_node.server.chat import ChatTemplate, ChatTemplateError, choose_template


def test_model_template_renders_messages_and_generation_prompt():
    t = ChatTemplate(CHAT_TEMPLATE, bos_token="<s>", eos_token="</s>")
    out = t.render([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert out == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert not t.is_default


def test_missing_template_falls_back_to_chatml():
    t = ChatTemplate(None)
    assert t.is_default
    assert t.render([{"role": "user", "content": "x"}]).endswith("<|im_start|>assistant\n")


def test_template_can_use_special_tokens_and_raise():
    t = ChatTemplate("{{ bos_token }}{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}"
                     "{% endif %}{{ messages[0]['content'] }}", bos_token="<s>")
    assert t.render([{"role": "user", "content": "a"}]) == "<s>a"
    with pytest.raises(ChatTemplateError, match="user first"):
        t.render([{"role": "system", "content": "a"}])


def test_broken_or_hostile_templates_fail_cleanly():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}")
    sneaky = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        sneaky.render([{"role": "user", "content": "x"}])


def test_a_model_without_a_template_gets_llama_cpps_own_for_its_architecture():
    import llama_cpp  # optional dependency: the edge extra

    gemma = choose_template(llama_cpp, None, "gemma3")
    assert gemma.origin == "llama.cpp:gemma"
    assert gemma.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]) == \
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert choose_template(llama_cpp, None, "mystery").origin == "chatml-fallback"
    assert choose_template(llama_cpp, "{{ messages[0]['content'] }}", "gemma3").origin == "gguf"
