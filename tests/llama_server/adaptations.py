"""llama-server's own tests, staged to run against `edge-node serve` and the gateway: what is changed, what skipped.

`stage(dest)` copies the five test modules tiergate runs from llama-cpp-python's sdist (training/converters.py
fetches it) with the expected texts tuned to SmolLM2 (`SUBSTITUTIONS`), and puts stand-ins for their `utils.py`
and `conftest.py` beside them. `SKIPS` says which tests are not run and why; ADAPTATIONS.md and
docs/reliability.md list the same. A substitution whose text is no longer in the source fails the staging, so a
new llama.cpp release cannot silently run a different test.
"""

from __future__ import annotations

import fnmatch
import shutil
from pathlib import Path

__all__ = ["EDGE_SURFACES", "GATEWAY_MODULES", "MODULES", "SKIPS", "SLOW", "SUBSTITUTIONS", "skip_reason", "stage"]

MODULES = ("test_chat_completion.py", "test_completion.py", "test_tool_call.py", "test_compat_oai_responses.py",
           "test_compat_anthropic.py")
GATEWAY_MODULES = ("test_compat_oai_responses.py", "test_compat_anthropic.py")

NATIVE = "llama-server's native API, out of scope"
SLOW = ("marked slow: downloads a multi-GB model from Hugging Face (Qwen, Llama 3.x, Gemma, ...) that tiergate does "
        "not package; llama.cpp's own CI runs these only with SLOW_TESTS=1")

TINY = "SmolLM2 samples at the test's temperature 0.8 without a seed, so any word, not tinyllama's story words"

# (module, old text, new text, why)
SUBSTITUTIONS: list[tuple[str, str, str, str]] = [
    ("test_chat_completion.py",
     '("1 2 3 4 5 6", 77, 0),\n        ("1 2 3 4 5 6", 77, 76),\n        ("1 2 3 4 5 9", 77, 51),\n'
     '        ("1 2 3 9 9 9", 77, 47),',
     '("1 2 3 4 5 6", 26, 0),\n        ("1 2 3 4 5 6", 26, 25),\n        ("1 2 3 4 5 9", 26, 19),\n'
     '        ("1 2 3 9 9 9", 26, 15),',
     "SmolLM2's prompt and prefix-cache token counts for the same four prompts (its tokenizer and template)"),
    ("test_completion.py", 'match_regex("(going|bed)+", output_text)', 'match_regex("\\\\w+", output_text)',
     "SmolLM2 samples at OpenAI's default temperature 1 without a seed (the request sets neither), so any word, "
     "not tinyllama's"),
    ("test_compat_oai_responses.py", 'match_regex("(Suddenly)+", res.output_text)',
     'match_regex("\\\\w+", res.output_text)', TINY),
    ("test_compat_oai_responses.py", 'match_regex("(Suddenly)+", r.response.output_text)',
     'match_regex("\\\\w+", r.response.output_text)', TINY),
]

EDGE_SURFACES = ("the edge node serves OpenAI's chat and completions API only; Responses and Anthropic Messages are "
                 "the gateway's surfaces, translated to chat for every tier (docs/api-surfaces.md), so this module "
                 "runs against the gateway in front of the node")
IMAGES = ("an image reaching a text-only tier is the client's 400 (the edge refuses image parts, an image in a "
          "tool result is refused while decoding), not llama-server's 500 'image input is not supported'")
THINKING = ("earlier turns' thinking blocks are dropped: the tiers do not reason (docs/api-surfaces.md)")
SAMPLING = ("llama-server's server-wide sampling defaults (`--seed 42`, `--temp 0.8`): the node has none, a request "
            "without them samples at OpenAI's defaults, unseeded")

FINGERPRINT = ("asserts `system_fingerprint` starts with llama-server's build tag (`b<build>`); tiergate sends no "
               "`system_fingerprint` (an optional OpenAI field) and llama-cpp-python exposes no build number")
FIRST_CHUNK = ("asserts the first streamed chunk's `delta.content` is null; the node sends `\"\"` there, as OpenAI does")
TEMPLATE = ("llama-server's `--chat-template` override and `__verbose` prompt echo: the node always renders the GGUF's "
            "own template and has no debug echo")

# (target: edge, gateway or * for both, "module::test[params]" glob, reason); the first match wins
SKIPS: list[tuple[str, str, str]] = [
    # test_chat_completion.py
    ("*", "test_chat_completion.py::test_chat_completion[[]*", FINGERPRINT),
    ("*", "test_chat_completion.py::test_chat_completion_stream[[]*", f"{FINGERPRINT}; and {FIRST_CHUNK}"),
    ("*", "test_chat_completion.py::test_chat_completion_with_openai_library", FINGERPRINT),
    ("*", "test_chat_completion.py::test_logprobs_stream", FIRST_CHUNK),
    ("*", "test_chat_completion.py::test_chat_template", TEMPLATE),
    ("*", "test_chat_completion.py::test_chat_template_assistant_prefill*", TEMPLATE),
    ("*", "test_chat_completion.py::test_chat_template_continue_final_message_vllm_compat", TEMPLATE),
    ("*", "test_chat_completion.py::test_apply_chat_template", f"{NATIVE}: `/apply-template`"),
    ("*", "test_chat_completion.py::test_completion_with_json_schema*", f"{NATIVE}: a top-level `json_schema` field"),
    ("*", "test_chat_completion.py::test_completion_with_grammar*", f"{NATIVE}: a GBNF `grammar` field"),
    ("*", "test_chat_completion.py::test_completion_with_invalid_grammar", f"{NATIVE}: a GBNF `grammar` field"),
    ("*", "test_chat_completion.py::test_chat_completion_with_timings_per_token", f"{NATIVE}: `timings_per_token`"),
    ("*", "test_chat_completion.py::test_logit_bias", f"{NATIVE}: `/tokenize` (to find the tokens to bias)"),
    ("*", "test_chat_completion.py::test_context_size_exceeded*",
     "llama-server's own error (`type: exceed_context_size_error` with `n_prompt_tokens`, `n_ctx`); tiergate answers "
     "OpenAI's 400 `context_length_exceeded`, which the gateway reads to move the request to a larger tier"),
    ("*", "test_chat_completion.py::test_return_progress*", f"{NATIVE}: `return_progress`"),
    ("edge", "test_chat_completion.py::test_chat_completions_multiple_choices",
     "`n: 2` (and llama-server's `id_slot`): the node refuses n > 1 with `unsupported_parameter`, and the gateway "
     "fans such a request out over it"),
    ("*", "test_chat_completion.py::test_chat_completions_token_count",
     f"{NATIVE}: `/chat/completions/input_tokens`"),
    ("*", "test_chat_completion.py::test_verbose_debug", TEMPLATE),
    ("*", "test_chat_completion.py::test_chat_template_continue_final_message_mutual_exclusion",
     "`add_generation_prompt` / `continue_final_message` (vLLM's and llama-server's template switches): the node "
     "does not model them, so it cannot find them in conflict"),
    ("*", "test_chat_completion.py::test_completion_with_response_format[[]response_format0-*",
     "llama-server's `schema` inside `response_format: {type: json_object}`; OpenAI's json_object has none (the "
     "node gives any JSON object), a schema goes in `json_schema`"),
    ("*", "test_chat_completion.py::test_invalid_chat_completion_req[[]messages7[]]",
     "two assistant messages in a row are a valid conversation in OpenAI's API; llama-server refuses them"),
    ("edge", "test_compat_oai_responses.py::*", EDGE_SURFACES),
    ("edge", "test_compat_anthropic.py::*", EDGE_SURFACES),
    ("*", "test_compat_oai_responses.py::test_responses_stream_with_llama_telemetry",
     f"{NATIVE}: `timings_per_token`, `return_progress` (llama-server's `timings` and `prompt_progress`)"),
    ("*", "test_compat_anthropic.py::test_anthropic_tool_result_with_image", IMAGES),
    ("*", "test_compat_anthropic.py::test_anthropic_vision_format_accepted", IMAGES),
    ("*", "test_compat_anthropic.py::test_anthropic_vision_base64_with_multimodal_model",
     "needs tinygemma3 with its vision projector from Hugging Face; no tier here reads images"),
    ("*", "test_compat_anthropic.py::test_anthropic_empty_messages",
     "`messages: []` is a 400, as in Anthropic's API (llama-server accepts it and makes up a prompt)"),
    ("*", "test_compat_anthropic.py::test_anthropic_thinking_history_in_count_tokens", THINKING),
    ("*", "test_compat_anthropic.py::test_anthropic_thinking_history_in_template",
     f"{NATIVE}: `/apply-template`; and {THINKING}"),
    ("*", "test_compat_anthropic.py::test_anthropic_thinking_with_reasoning_model*",
     "needs DeepSeek-R1-Distill-Qwen-7B from Hugging Face; the tiers here do not reason"),
    # test_tool_call.py (its slow tests are skipped for SLOW)
    ("*", "test_tool_call.py::test_completion_without_tool_call_fast[[]*-CompletionMode.STREAMED[]]",
     f"their stream reader {FIRST_CHUNK}"),
    # test_completion.py: all but the two openai-library tests call llama-server's own `/completion` API
    ("*", "test_completion.py::test_completion_with_openai_library", FINGERPRINT),
    ("*", "test_completion.py::test_completion_stream_with_openai_library", ""),
    ("*", "test_completion.py::*", f"{NATIVE}: `/completion`, `/tokenize`, `/slots`, `n_probs`, `timings`"),
]


def skip_reason(target: str, nodeid: str) -> str | None:
    """Why a test (`module::name[params]`) is not run against `target`, or None when it runs."""
    for where, pattern, reason in SKIPS:
        if where in (target, "*") and fnmatch.fnmatchcase(nodeid, pattern):
            return reason or None  # an empty reason: runs (an exception to a broader pattern below it)
    return None


def stage(source: Path, dest: Path) -> Path:
    """Their suite in `dest`, ready for `pytest dest/unit`: adapted modules, stand-ins, their pytest.ini."""
    here = Path(__file__).parent
    (dest / "unit").mkdir(parents=True, exist_ok=True)
    for module in MODULES:
        text = (source / "unit" / module).read_text()
        for name, old, new, _why in SUBSTITUTIONS:
            if name == module:
                if old not in text:
                    raise ValueError(f"{module}: {old!r} is not in llama.cpp's test any more")
                text = text.replace(old, new)
        (dest / "unit" / module).write_text(text)
    shutil.copy(source / "pytest.ini", dest / "pytest.ini")
    shutil.copy(here / "stand_in_utils.py", dest / "utils.py")
    shutil.copy(here / "stand_in_conftest.py", dest / "conftest.py")
    return dest
