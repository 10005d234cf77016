"""Render chat messages into a prompt the way the model was trained to read them.

- The model's own Jinja template (GGUF `tokenizer.chat_template`), rendered sandboxed: a template is data
  from a file, not code we trust.
- A model without one (Gemma 3's pretrained GGUF, for one) gets the template llama.cpp itself knows for its
  architecture (`llama_chat_apply_template` with a built-in name such as `gemma`), so the prompt is exactly
  what llama.cpp's own server would build.
- Otherwise ChatML. `choose_template` picks, and the node logs which one it uses (`origin`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from datetime import datetime
from types import ModuleType
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["CHATML", "BuiltinTemplate", "ChatTemplate", "ChatTemplateError", "choose_template"]

# GGUF `general.architecture` → the name of llama.cpp's built-in template for models that ship none.
LLAMA_CPP_TEMPLATES = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma",
                       "phi3": "phi3", "qwen2": "chatml", "qwen3": "chatml"}

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template could not render these messages (the template itself raised, or is broken)."""


class ChatTemplate:
    """A compiled chat template plus the special-token strings templates refer to."""

    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or CHATML
        self.is_default = source is None
        self.origin = "chatml-fallback" if source is None else "gguf"
        self.renders_tools = "tools" in self.source
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined)

        def raise_exception(message: str) -> None:
            raise ChatTemplateError(message)

        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(self.source)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the model's chat template does not compile: {e}") from None
        self._bos = bos_token
        self._eos = eos_token

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text for `messages` (dicts with role/content, as OpenAI sends them)."""
        try:
            return self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos,
                eos_token=self._eos,
                tools=tools,
            )
        except ChatTemplateError:
            raise
        except Exception as e:  # noqa: BLE001 - jinja2 errors, or a template indexing a missing field
            raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None


class BuiltinTemplate:
    """One of llama.cpp's own chat templates, by name, applied by llama.cpp (`llama_chat_apply_template`)."""

    def __init__(self, llama_cpp: ModuleType, name: str) -> None:
        self._ll = llama_cpp
        self.name = name
        self.origin = f"llama.cpp:{name}"
        self.is_default = False
        self.renders_tools = False

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        ll = self._ll
        encoded = [(str(m.get("role", "")).encode(), str(m.get("content") or "").encode()) for m in messages]
        chat = (ll.llama_chat_message * len(encoded))()
        for i, (role, content) in enumerate(encoded):
            chat[i].role, chat[i].content = role, content
        size = 2 * sum(len(r) + len(c) for r, c in encoded) + 256
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = ll.llama_chat_apply_template(self.name.encode(), chat, len(encoded), add_generation_prompt, buf, size)
            if n < 0:
                raise ChatTemplateError(f"llama.cpp's {self.name!r} chat template cannot render these messages")
            if n <= size:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = n
        raise ChatTemplateError(f"llama.cpp's {self.name!r} chat template output kept growing")


def choose_template(llama_cpp: ModuleType, source: str | None, architecture: str, bos_token: str = "",
                    eos_token: str = "") -> ChatTemplate | BuiltinTemplate:
    """The model's own template; else llama.cpp's for its architecture; else ChatML."""
    if source:
        return ChatTemplate(source, bos_token, eos_token)
    name = LLAMA_CPP_TEMPLATES.get(architecture)
    if name is not None:
        return BuiltinTemplate(llama_cpp, name)
    return ChatTemplate(None, bos_token, eos_token)
