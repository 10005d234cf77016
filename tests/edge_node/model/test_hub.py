import pytest

from tiergate.edge_node.model.hub import is_hub_ref, resolve_model
from tiergate.edge_node.model.model_file import ModelFileError


def test_local_paths_are_not_hub_refs(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert not is_hub_ref(str(f))
    assert resolve_model(str(f)) == f
    assert not is_hub_ref("models/missing.gguf")  # a path-like name that does not exist stays a path
    assert not is_hub_ref("/abs/path")


def test_hub_refs():
    assert is_hub_ref("TheOrg/Some-Model-GGUF")
    assert is_hub_ref("TheOrg/Some-Model-GGUF:model.Q4_K_M.gguf")
    assert not is_hub_ref("a/b/c")


def test_offline_hub_ref_fails_with_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelFileError) as exc:
        resolve_model("no-such-org/no-such-model:file.gguf")
    msg = str(exc.value)
    assert "Hugging Face" in msg and "\n" not in msg
