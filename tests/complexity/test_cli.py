"""`tiergate classifier`: training from several files is reproducible, evaluation is per source, bad data is refused."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tiergate.complexity.cli import classifier_app
from tiergate.complexity.model import ComplexityModel

from .conftest import synthetic, write_jsonl

runner = CliRunner()


def test_train_from_several_files_is_reproducible_and_the_model_loads(tmp_path):
    files = [write_jsonl(tmp_path / f"{k}.jsonl", synthetic(k, 150)) for k in ("chat", "writing", "lookup")]
    with files[0].open("a") as fh:
        fh.write("garbage\n")
    args = [a for f in files for a in ("--data", str(f))] + ["--no-expert", "--license", "synthetic, CC0"]
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    for out in outs:
        r = runner.invoke(classifier_app, ["train", *args, "--out", str(out)])
        assert r.exit_code == 0, r.output
        assert "chat.jsonl:151: skipped: not JSON" in r.output
    assert outs[0].read_bytes() == outs[1].read_bytes()
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["rows"] == 450 and summary["skipped_lines"] == 1
    assert set(summary["sources"]) == {"chat", "writing", "lookup"}
    m = ComplexityModel.load(outs[0])
    assert m.meta["trained_on"]["license"] == "synthetic, CC0"

    r = runner.invoke(classifier_app, ["evaluate", *[a for f in files for a in ("--data", str(f))],
                                       "--model", str(outs[0])])
    assert r.exit_code == 0, r.output
    ev = json.loads(r.stdout.strip().splitlines()[-1])
    assert ev["rows"] == 450 and ev["apgr"] > 0.6 and 0 < ev["escalated_for_pgr50"] < ev["escalated_for_pgr80"] <= 1
    assert set(ev["sources"]) == {"chat", "writing", "lookup"} and ev["sources"]["chat"]["rows"] == 150


def test_select_picks_a_design_with_three_sources(tmp_path):
    files = [write_jsonl(tmp_path / f"{k}.jsonl", synthetic(k, 80)) for k in ("chat", "writing", "lookup")]
    out = tmp_path / "m.json"
    r = runner.invoke(classifier_app, ["train", *[a for f in files for a in ("--data", str(f))], "--select",
                                       "--no-expert", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["selection"]["designs_tried"] > 1


def test_train_refuses_too_little_data(tmp_path):
    data = tmp_path / "tiny.jsonl"
    data.write_text(json.dumps({"prompt": "a", "weak_correct": True, "strong_correct": True}) + "\n")
    r = runner.invoke(classifier_app, ["train", "--data", str(data), "--out", str(tmp_path / "m.json")])
    assert r.exit_code == 2 and "need at least 50" in r.output and not (tmp_path / "m.json").exists()


def test_evaluate_says_when_apgr_is_undefined(tmp_path):
    rows = [dict(r, weak_correct=0.5, strong_correct=0.5) for r in synthetic("chat", 20)]
    r = runner.invoke(classifier_app, ["evaluate", "--data", str(write_jsonl(tmp_path / "flat.jsonl", rows))])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["apgr"] is None and out["rows"] == 20  # both models equally good: nothing to recover


def test_evaluate_refuses_a_model_it_cannot_read(tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps({"format": "tiergate-complexity/2"}))
    data = write_jsonl(tmp_path / "d.jsonl", synthetic("chat", 5))
    r = runner.invoke(classifier_app, ["evaluate", "--data", str(data), "--model", str(bad)])
    assert r.exit_code == 2 and "retrain it" in r.output
