"""The list of adaptations to llama.cpp's server tests and its documentation say the same, and skips match as meant."""

from __future__ import annotations

from pathlib import Path

from tests.llama_server.adaptations import EDGE_SURFACES, NATIVE, SKIPS, SUBSTITUTIONS, skip_reason

DOC = (Path(__file__).parent / "ADAPTATIONS.md").read_text()


def test_every_skip_and_substitution_is_in_adaptations_md():
    for _, pattern, reason in SKIPS:
        assert f"`{pattern}`" in DOC and reason in DOC, pattern
    for module, old, new, why in SUBSTITUTIONS:
        assert " ".join(old.split()).replace("|", "\\|") in DOC and why in DOC, (module, old)
        assert " ".join(new.split()) in DOC


def test_first_match_wins_and_an_empty_reason_runs_the_test():
    assert skip_reason("edge", "test_compat_anthropic.py::test_anthropic_messages_basic") == EDGE_SURFACES
    assert skip_reason("gateway", "test_compat_anthropic.py::test_anthropic_messages_basic") is None
    assert skip_reason("edge", "test_completion.py::test_completion_stream_with_openai_library") is None
    assert NATIVE in (skip_reason("edge", "test_completion.py::test_n_probs") or "")
    assert skip_reason("gateway", "test_chat_completion.py::test_chat_completions_multiple_choices") is None
