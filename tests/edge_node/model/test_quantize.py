"""F16 GGUF → 4-bit GGUF through llama.cpp's own quantizer, in process: the output's tensor types, and every
refusal as one clear line (bad arguments before llama.cpp is touched, llama.cpp's own reason after)."""

from __future__ import annotations

import gguf
import pytest

from tiergate.edge_node.model.demo_model import build_demo_model
from tiergate.edge_node.model.quantize import QUANT_TYPES, QuantizeError, quantize

pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def f16(tmp_path_factory: pytest.TempPathFactory):
    return build_demo_model(tmp_path_factory.mktemp("f16"), size="tiny", quant="f16", seed=0).gguf


def tensor_types(path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


@pytest.mark.parametrize(("qtype", "weights"), [("q4_0", "Q4_0"), ("Q4_K_M", "Q4_K")])
def test_weights_become_4_bit_and_norms_stay_f32(f16, tmp_path, qtype, weights) -> None:
    out = quantize(f16, tmp_path / "out.gguf", qtype, show_progress=qtype.islower())
    assert out == tmp_path / "out.gguf"
    types = tensor_types(out)
    assert types["blk.0.attn_q.weight"] == weights
    assert types["blk.0.attn_norm.weight"] == "F32"
    assert tensor_types(f16)["blk.0.attn_q.weight"] == "F16"
    assert out.stat().st_size < f16.stat().st_size / 2.5


def test_the_types_offered_are_llama_cpp_file_types() -> None:
    import llama_cpp  # optional dependency: the edge extra

    assert set(QUANT_TYPES) == {"q4_0", "q4_k_m"}
    for name in QUANT_TYPES.values():
        assert isinstance(getattr(llama_cpp, name), int)


def test_an_unknown_type_is_refused_with_the_choices(f16, tmp_path) -> None:
    with pytest.raises(QuantizeError, match="unknown quantization type 'q8_0': choose one of q4_0, q4_k_m"):
        quantize(f16, tmp_path / "o.gguf", "q8_0", show_progress=False)


def test_bad_paths_are_refused_before_llama_cpp_runs(f16, tmp_path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(QuantizeError, match="not a GGUF"):
        quantize(text, tmp_path / "o.gguf", show_progress=False)
    with pytest.raises(QuantizeError, match="model file not found"):
        quantize(tmp_path / "missing.gguf", tmp_path / "o.gguf", show_progress=False)
    with pytest.raises(QuantizeError, match="output path must differ from the input path"):
        quantize(f16, f16.parent / "." / f16.name, show_progress=False)
    with pytest.raises(QuantizeError, match="output directory does not exist"):
        quantize(f16, tmp_path / "nowhere" / "o.gguf", show_progress=False)
    assert not (tmp_path / "o.gguf").exists()


def test_llama_cpps_own_refusal_is_one_line_and_leaves_no_output(edge_model, tmp_path) -> None:
    out = tmp_path / "requantized.gguf"
    with pytest.raises(QuantizeError) as caught:
        quantize(edge_model.gguf, out, "q4_k_m", show_progress=False)  # already Q4_0: llama.cpp won't requantize
    message = str(caught.value)
    assert message.startswith(f"llama.cpp could not quantize {edge_model.gguf.name}: ")
    assert "\n" not in message and "requantiz" in message
    assert not out.exists()
