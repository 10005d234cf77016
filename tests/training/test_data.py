"""The export read back, deduplicated and split so that no paraphrase of a held-out question is trained on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiergate.training.data import Example, ExportError, cluster_ids, dedupe, load_export, split


def _ex(prompt: str, answer: str, pos: int) -> Example:
    return Example((("user", prompt),), answer, pos)


def _write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_both_export_shapes_load_in_capture_order(tmp_path: Path) -> None:
    f = _write(tmp_path / "x.jsonl", [
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"},
                      {"role": "assistant", "content": "4"}]},
        {"prompt": "capital of France:", "completion": "Paris"},
    ])
    rows = load_export(f)
    assert [r.answer for r in rows] == ["4", "Paris"] and rows[0].chat[0] == {"role": "system", "content": "be brief"}
    assert rows[0].prompt_text == "2+2?" and rows[1].position == 2


@pytest.mark.parametrize(("line", "says"), [
    ("not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', "at least 2"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "x"}]}', "end with the assistant"),
    ('{"text": "x"}', "'messages'"),
])
def test_a_bad_line_is_named_by_file_and_line(tmp_path: Path, line: str, says: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt": "a", "completion": "b"}\n\n' + line + "\n")
    with pytest.raises(ExportError) as err:
        load_export(f)
    assert str(err.value).startswith(f"{f}:3: ") and says in str(err.value)


def test_dedupe_keeps_the_first_of_each_normalised_pair() -> None:
    rows = [_ex("What is 2+2?", "4", 1), _ex("what is 2+2", "4.", 2), _ex("What is 2+2?", "four", 3)]
    assert [r.position for r in dedupe(rows)] == [1, 3]


def test_paraphrases_share_a_cluster_through_their_answer() -> None:
    rows = [_ex("capital of France?", "Paris", 1), _ex("France's capital city is", "paris", 2),
            _ex("capital of Peru?", "Lima", 3), _ex("Capital of Peru", "Lima, Peru", 4)]
    ids = cluster_ids(rows)
    assert ids[0] == ids[1] and ids[2] == ids[3] and ids[0] != ids[2]


def test_the_split_holds_out_the_newest_and_whole_clusters_only() -> None:
    rows = []
    for i in range(100):  # 50 questions, each asked twice in different words, in capture order
        q = i // 2
        rows.append(_ex(f"what is {q} plus one?" if i % 2 else f"{q}+1 = ?", str(q + 1), i))
    parts = split(rows, heldout_share=0.3, newest_share=0.1)
    train_answers = {r.answer for r in parts.train}
    held_answers = {r.answer for r in parts.heldout}
    assert not train_answers & held_answers  # no paraphrase of a held-out question was trained on
    assert {r.position for r in rows[90:]} <= {r.position for r in parts.heldout}  # the newest tenth
    assert 30 <= len(parts.heldout) <= 32 and len(parts.train) + len(parts.heldout) == 100
    assert split(rows, 0.3, 0.1) == parts  # stable: the same export gives the same split
    assert split([], 0.3, 0.1).train == []
