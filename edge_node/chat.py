"""Render chat messages into a prompt with the model's own Jinja chat template (GGUF metadata).

The template comes from `tokenizer.chat_template`, so each model formats conversations the way it
was trained to; models without one fall back to ChatML. Rendering is sandboxed: a template is data
from a file, not code we trust.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["CHATML", "ChatTemplate", "ChatTemplateError"]

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
