"""Spec loading: shipped specs validate; every invalid spec is rejected naming file, line, column and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiergate.cloud_pool.spec import Eagle3, Ngram, SpecError, load_spec, parse_spec

SPECS = Path(__file__).resolve().parents[2] / "cloud_pool" / "specs"

BASE = "name: t\nmodel: org/model\n"


def problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(text, "spec.yaml")
    return [str(p) for p in info.value.problems]


def test_shipped_specs_are_valid() -> None:
    tp4 = load_spec(SPECS / "llama-3.3-70b-tp4.yaml")
    tp8 = load_spec(SPECS / "llama-3.3-70b-tp8.yaml")
    tiny = load_spec(SPECS / "cpu-tiny.yaml")
    assert (tp4.tensor_parallel_size, tp8.tensor_parallel_size) == (4, 8)
    assert isinstance(tp4.speculative, Eagle3) and isinstance(tp8.speculative, Eagle3)
    assert tp4.model == tp8.model == "meta-llama/Llama-3.3-70B-Instruct"
    assert tiny.device == "cpu" and isinstance(tiny.speculative, Ngram)
    assert tp4.model_name == tp8.model_name == tiny.model_name == "tiergate-cloud"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (BASE + "tensor_parallel_size: 0\n", "spec.yaml:3:23: tensor_parallel_size: Input should be greater than or equal to 1 (got 0)"),
        (BASE + "gpu_memory_utilization: 1.5\n", "spec.yaml:3:25: gpu_memory_utilization: Input should be less than or equal to 1"),
        (BASE + "speculative:\n  method: eagle\n", "spec.yaml:4:11: speculative.method: unknown method 'eagle'; allowed: eagle3, draft_model, ngram, none"),
        (BASE + "speculative:\n  method: eagle3\n", "spec.yaml:4:3: speculative.model: Field required"),
        (BASE + "speculative:\n  num_speculative_tokens: 3\n", "spec.yaml:3:1: speculative: missing 'method'"),
        (BASE + "speculative:\n  method: ngram\n  num_speculative_tokens: 0\n", "spec.yaml:5:27: speculative.num_speculative_tokens: Input should be greater than or equal to 1"),
        (BASE + "speculative:\n  method: ngram\n  lookup: 2\n", "spec.yaml:5:3: speculative.lookup: unknown field; allowed: extra, method, num_speculative_tokens, prompt_lookup_max, prompt_lookup_min"),
        (BASE + "tensor_paralel_size: 4\n", "spec.yaml:3:1: tensor_paralel_size: unknown field; allowed: block_size,"),
        (BASE + "device: tpu\n", "spec.yaml:3:9: device: Input should be 'cuda' or 'cpu' (got 'tpu')"),
        (BASE + "kubernetes:\n  model_cache:\n    size: 10GB\n", "spec.yaml:5:11: kubernetes.model_cache.size: String should match pattern"),
        ("name: t\n", "spec.yaml:1:1: model: Field required"),
        (BASE + "tensor_parallel_size: 4\nnodes: 3\n", "spec.yaml:4:8: nodes: tensor_parallel_size x pipeline_parallel_size = 4 GPUs does not split evenly over 3 nodes"),
        (BASE + "device: cpu\nnodes: 2\n", "spec.yaml:4:8: nodes: multi-node serving needs device: cuda"),
        (BASE + "speculative:\n  method: ngram\n  prompt_lookup_min: 5\n", "spec.yaml:5:22: speculative.prompt_lookup_min: must be <= prompt_lookup_max"),
        (BASE + "device: cpu\nblock_size: 16\n", "spec.yaml:4:13: block_size: vLLM's CPU backend needs a multiple of 32"),
        (BASE + "extra_args: [--max-num-seqs, '8', --tensor-parallel-size=2]\n", "spec.yaml:3:35: extra_args.2: --tensor-parallel-size is set by the spec field 'tensor_parallel_size'"),
        (BASE + "model: [unclosed\n", "spec.yaml:4:1: invalid YAML"),
        ("- a list\n", "spec.yaml:1:1: the spec must be a YAML mapping"),
    ],
)
def test_invalid_specs_name_position_and_field(text: str, expected: str) -> None:
    found = problems(text)
    assert any(p.startswith(expected) for p in found), found


def test_all_problems_are_reported_at_once() -> None:
    found = problems(BASE + "tensor_parallel_size: 0\nport: 99999\nfoo: 1\n")
    assert [p.split(": ")[1] for p in found] == ["tensor_parallel_size", "port", "foo"]


def test_unreadable_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")


def test_defaults_and_derived_values() -> None:
    spec = parse_spec(BASE + "tensor_parallel_size: 8\npipeline_parallel_size: 2\nnodes: 2\n")
    assert spec.world_size == 16 and spec.gpus_per_node == 8 and spec.uses_ray
    assert spec.model_name == "org/model" and spec.speculative.method == "none"
