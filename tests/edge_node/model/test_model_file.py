import pytest

from tiergate.edge_node.model.demo_model import build_demo_model
from tiergate.edge_node.model.model_file import ModelFileError, check_gguf, check_memory


@pytest.fixture(scope="module")
def f16_model(tmp_path_factory):
    return build_demo_model(tmp_path_factory.mktemp("f16"), size="tiny", quant="f16").gguf


def test_reads_what_the_node_needs(f16_model):
    info = check_gguf(f16_model)
    assert (info.architecture, info.n_layer, info.n_embd, info.n_head, info.n_head_kv) == ("llama", 2, 256, 4, 4)
    assert info.name == "tiergate-demo-tiny" and "<|im_start|>" in info.chat_template
    assert info.kv_bytes(1000) == 2 * 2 * 1000 * 256 * 2


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p, good: None, "model file not found"),
        (lambda p, good: p.write_text("hello"), "not a GGUF"),
        (lambda p, good: p.write_bytes(good[:200]), "corrupt"),
        (lambda p, good: p.write_bytes(good[: len(good) - 1000]), "corrupt"),
        (lambda p, good: p.write_bytes(b"GGUF" + b"\xff" * 100), "corrupt"),
    ],
)
def test_bad_files_are_one_clear_line(tmp_path, f16_model, make, message):
    p = tmp_path / "m.gguf"
    make(p, f16_model.read_bytes())
    with pytest.raises(ModelFileError) as exc:
        check_gguf(p)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_directory_is_not_a_model(tmp_path):
    with pytest.raises(ModelFileError, match="not a file"):
        check_gguf(tmp_path)


def test_memory_check_counts_weights_and_kv_cache(f16_model):
    info = check_gguf(f16_model)
    need = check_memory(info, 1024, available=1 << 40)
    assert need > info.size_bytes + info.kv_bytes(1024)
    with pytest.raises(ModelFileError, match="too large for memory.*KV cache"):
        check_memory(info, 1024, available=need - 1)
    # layers on a GPU do not count against host memory
    assert check_memory(info, 1024, available=need - 1, gpu_layers=info.n_layer) < need
    # -1 is llama.cpp's "every layer": the same as naming them all
    assert check_memory(info, 1024, available=need - 1, gpu_layers=-1) == check_memory(
        info, 1024, available=need - 1, gpu_layers=info.n_layer)
