import json
import logging
import warnings

import pytest
from typer.testing import CliRunner

from tiergate.cache.training.export import known_noise_to
from tiergate.gateway.cache_cli import cache_app

runner = CliRunner()


def test_score_pairs_one_line_out_per_pair_in_order(embedder_dir) -> None:
    lines = [
        json.dumps({"a": "How do I invest my money wisely?", "b": "How can I invest my money wisely?"}),
        json.dumps({"a": "What happened in 2002?", "b": "What happened in 1992?"}),
        "not json",
        json.dumps({"a": 1, "b": "x"}),
        "",
        json.dumps({"a": "same text", "b": "same text"}),
    ]
    res = runner.invoke(cache_app, ["score-pairs", "-", "--embedder", str(embedder_dir)],
                        input="\n".join(lines) + "\n")
    assert res.exit_code == 0, res.output
    out = [json.loads(line) for line in res.stdout.strip().splitlines()]
    assert len(out) == 5
    assert out[0]["hit"] is True and out[0]["similarity"] > 0.9
    assert out[1]["hit"] is False
    assert out[2] == {"line": 3, "error": out[2]["error"]} and "JSON" in out[2]["error"]
    assert "error" in out[3] and out[3]["line"] == 4
    assert out[4]["hit"] is True


def test_score_pairs_threshold_override(embedder_dir, tmp_path) -> None:
    f = tmp_path / "pairs.jsonl"
    f.write_text(json.dumps({"a": "How do I invest my money wisely?", "b": "How can I invest my money wisely?"}))
    res = runner.invoke(cache_app, ["score-pairs", str(f), "--embedder", str(embedder_dir), "--threshold", "0.999"])
    assert res.exit_code == 0 and json.loads(res.stdout)["hit"] is False


def test_score_pairs_missing_embedder_is_a_clear_error(tmp_path) -> None:
    res = runner.invoke(cache_app, ["score-pairs", "-", "--embedder", str(tmp_path / "none")], input="{}\n")
    assert res.exit_code == 2 and "export-embedder" in res.output


def test_invalidate_needs_a_target_and_a_redis(monkeypatch) -> None:
    monkeypatch.delenv("TIERGATE_REDIS_URL", raising=False)
    assert runner.invoke(cache_app, ["invalidate"]).exit_code != 0
    res = runner.invoke(cache_app, ["invalidate", "--all"])
    assert res.exit_code == 2 and "admin/cache/invalidate" in res.output


def test_export_is_skipped_when_already_there(embedder_dir) -> None:
    res = runner.invoke(cache_app, ["export-embedder", "--out", str(embedder_dir)])
    assert res.exit_code == 0 and res.stdout.strip() == str(embedder_dir)
    assert "skipping" in res.output


def test_the_known_noise_of_an_export_goes_to_its_log_and_nothing_else_does(tmp_path, capsys) -> None:
    """Set-up prints its own progress: torch's tracer warnings, the ONNX exporter's advice and onnxruntime's
    pre-processing hint (what an export of all-MiniLM-L6-v2 printed) land in the log; other warnings still show."""
    log = tmp_path / "export.log"
    with pytest.warns(RuntimeWarning, match="something new"), known_noise_to(log):
        warnings.warn("Converting a tensor to a Python boolean might cause the trace to be incorrect.",
                      UserWarning, stacklevel=2)
        warnings.warn("Exporting aten::index operator of advanced indexing in opset 17 is achieved by ...",
                      UserWarning, stacklevel=2)
        logging.getLogger().warning("Please consider to run pre-processing before quantization. Refer to ...")
        warnings.warn("something new", RuntimeWarning, stacklevel=2)
    text = log.read_text()
    assert "Converting a tensor" in text and "advanced indexing" in text and "pre-processing" in text
    assert "something new" not in text
    err = capsys.readouterr().err
    assert "Converting a tensor" not in err and "pre-processing" not in err


# Issue 39: opposites the embedder puts above the default threshold (0.94), each a hit before the opposites guard.
OPPOSITES = [
    ("What is the maximum daily dose of acetaminophen for adults?",
     "What is the minimum daily dose of acetaminophen for adults?"),  # 0.958
    ("Is it legal to drive barefoot in California?", "Is it illegal to drive barefoot in California?"),  # 0.984
    ("Is it safe to eat raw cookie dough?", "Is it unsafe to eat raw cookie dough?"),  # 0.982
    ("Should I take ibuprofen before meals?", "Should I take ibuprofen after meals?"),  # 0.964
    ("How do I sort a list in ascending order in Python?",
     "How do I sort a list in descending order in Python?"),  # 0.956
    ("Is it possible to run Windows apps on a Mac?", "Is it impossible to run Windows apps on a Mac?"),  # 0.962
]


def test_score_pairs_never_answers_a_question_with_its_opposite(embedder_dir) -> None:
    lines = [json.dumps({"a": a, "b": b}) for a, b in OPPOSITES]
    lines.append(json.dumps({"a": "How do I invest my money wisely?", "b": "How can I invest my money wisely?"}))
    res = runner.invoke(cache_app, ["score-pairs", "-", "--embedder", str(embedder_dir)], input="\n".join(lines))
    assert res.exit_code == 0, res.output
    *opposites, paraphrase = [json.loads(line) for line in res.stdout.strip().splitlines()]
    for (a, b), row in zip(OPPOSITES, opposites, strict=True):
        assert row["similarity"] >= 0.94, (a, b, row)  # close enough to be a hit on the cosine alone
        assert row["hit"] is False and row["reason"] == "opposites", (a, b, row)
    assert paraphrase["hit"] is True
