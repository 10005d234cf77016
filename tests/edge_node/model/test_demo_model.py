import json

import gguf
import numpy as np
import pytest
from tokenizers import Tokenizer

from tiergate.edge_node.model.demo_model import CHAT_TEMPLATE, SHAPES, build_demo_model


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_demo_model(tmp_path_factory.mktemp("demo"), size="tiny", quant="f16", seed=0)


def test_same_seed_same_bytes(built, tmp_path):
    again = build_demo_model(tmp_path, size="tiny", quant="f16", seed=0)
    assert again.gguf.read_bytes() == built.gguf.read_bytes()
    assert again.tokenizer_json.read_bytes() == built.tokenizer_json.read_bytes()
    other = build_demo_model(tmp_path / "s1", size="tiny", quant="f16", seed=1)
    assert other.gguf.read_bytes() != built.gguf.read_bytes()


def test_tokenizer_json_matches_the_gguf_vocabulary(built):
    tok = Tokenizer.from_file(str(built.tokenizer_json))
    reader = gguf.GGUFReader(str(built.gguf))
    f = reader.fields["tokenizer.ggml.tokens"]
    gguf_tokens = [bytes(f.parts[i]).decode() for i in f.data]
    assert tok.get_vocab_size() == len(gguf_tokens) == SHAPES["tiny"].n_vocab
    assert all(tok.id_to_token(i) == t for i, t in enumerate(gguf_tokens))
    assert tok.encode("hello").ids[0] == tok.token_to_id("<s>")  # BOS like llama.cpp adds
    tmpl = reader.fields["tokenizer.chat_template"]
    assert bytes(tmpl.parts[tmpl.data[0]]).decode() == CHAT_TEMPLATE
    assert json.loads(built.tokenizer_json.read_text())["model"]["type"] == "BPE"


def test_unprintable_and_special_tokens_can_never_win(built):
    """Their output rows put a large negative weight on the constant residual dimension, nothing else."""
    reader = gguf.GGUFReader(str(built.gguf))
    t = {x.name: x for x in reader.tensors}
    out = np.asarray(t["output.weight"].data, dtype=np.float32)
    emb = np.asarray(t["token_embd.weight"].data, dtype=np.float32)
    f = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(f.parts[i]).decode() for i in f.data]
    banned = out[:, 0] < 0
    assert banned[tokens.index("<s>")] and banned[tokens.index("<|im_end|>")]
    assert not banned[tokens.index("Ġthe")]
    assert np.all(out[banned, 1:] == 0) and np.all(out[~banned, 0] == 0)
    assert np.all(emb[:, 0] > 0)  # every token carries the bias input
    for i in range(12):
        if f"blk.{i}.attn_output.weight" in t:
            assert np.all(np.asarray(t[f"blk.{i}.attn_output.weight"].data)[0] == 0)
            assert np.all(np.asarray(t[f"blk.{i}.ffn_down.weight"].data)[0] == 0)


def test_unknown_size_or_quant_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="unknown size"):
        build_demo_model(tmp_path, size="huge")
    with pytest.raises(ValueError, match="unknown quantization"):
        build_demo_model(tmp_path, quant="q2")  # type: ignore[arg-type]
