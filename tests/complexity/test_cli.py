"""`tiergate classifier`: training is reproducible, the model it writes loads, and bad data is refused."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from complexity.cli import classifier_app

runner = CliRunner()


def _labelled(path: Path, n: int = 300) -> Path:
    """Synthetic labelled data: math-looking prompts gain from the strong model, chit-chat does not."""
    import random

    rnd = random.Random(7)
    lines = []
    for i in range(n):
        hard = i % 2 == 0
        prompt = (f"Compute the integral of x^{i % 7} * sin({i}x) dx from 0 to {i}.\nA. {i}\nB. {2 * i}\nAnswer:"
                  if hard else f"Which city is famous for its {rnd.choice(['bridges', 'food', 'museums'])}?")
        weak = (not hard) or rnd.random() < 0.2
        strong = rnd.random() < 0.9
        lines.append(json.dumps({"prompt": prompt, "weak_correct": weak, "strong_correct": strong}))
    lines.insert(5, "garbage")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_train_is_reproducible_and_the_model_loads(tmp_path):
    data = _labelled(tmp_path / "labelled.jsonl")
    outs = [tmp_path / "a.json", tmp_path / "b.json"]
    for out in outs:
        r = runner.invoke(classifier_app, ["train", "--data", str(data), "--out", str(out)])
        assert r.exit_code == 0, r.output
        assert "skipped: not JSON" in r.output
    assert outs[0].read_bytes() == outs[1].read_bytes()
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["rows"] == 300 and summary["skipped_lines"] == 1 and summary["in_sample_apgr"] > 0.6
    from complexity.model import ComplexityModel

    m = ComplexityModel.load(outs[0])
    hard = m.score("Compute the integral of x^3 * sin(5x) dx from 0 to 9.\nA. 1\nB. 2\nAnswer:")
    easy = m.score("Which city is famous for its bridges?")
    assert hard > easy
    r = runner.invoke(classifier_app, ["evaluate", "--data", str(data), "--model", str(outs[0])])
    assert r.exit_code == 0, r.output
    ev = json.loads(r.stdout)
    assert ev["rows"] == 300 and ev["apgr"] > 0.6 and 0 < ev["escalated_for_pgr50"] < ev["escalated_for_pgr80"] <= 1


def test_train_refuses_too_little_data(tmp_path):
    data = tmp_path / "tiny.jsonl"
    data.write_text(json.dumps({"prompt": "a", "weak_correct": True, "strong_correct": True}) + "\n")
    r = runner.invoke(classifier_app, ["train", "--data", str(data), "--out", str(tmp_path / "m.json")])
    assert r.exit_code == 2 and "need at least 50" in r.output
