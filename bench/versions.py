"""The pinned versions of what the benchmarks compare tiergate with: one place, so every benchmark measures the same
baseline and a result file can say which one it was.

Each baseline lives outside the product's virtualenv (its dependencies would clash with ours) and is built or
installed by `python -m bench.anchors` (see bench/anchors.py), from a registry package of exactly this version.
"""

from __future__ import annotations

__all__ = ["LITELLM", "LITELLM_SPEC", "LITELLM_VENV", "LLAMA_CPP_PYTHON", "LLAMA_CPP_PYTHON_CMAKE_ARGS",
           "LLAMA_CPP_SERVER_VENV", "LLAMA_SERVER_CMAKE_ARGS", "PY_SPY", "TOOLS_VENV", "VLLM_ROUTER", "VLLM_ROUTER_VENV"]

# llama.cpp's own C++ server is built from the llama.cpp sources vendored in this llama-cpp-python source package,
# the same version the edge node runs (pyproject.toml pins it), so both sides of bench/edge share one llama.cpp.
LLAMA_CPP_PYTHON = "0.3.36"

# The same code-generation flags as scripts/setup.sh gives the Python build (portable AVX2 variant, OpenMP,
# Release, position-independent code), and no web UI: its assets are not in the source package, and the build
# would otherwise try to download them.
LLAMA_SERVER_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)

# llama-cpp-python's own server (`python -m llama_cpp.server`) in a virtualenv of its own: its extras (FastAPI,
# sse-starlette, ...) are not the product's. Same version, so pip reuses the wheel it built for the product.
LLAMA_CPP_SERVER_VENV = ".venv-llama-cpp-server"
# What scripts/setup.sh builds llama-cpp-python with, for a machine where pip has no wheel cached yet.
LLAMA_CPP_PYTHON_CMAKE_ARGS = "-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF"

# The vLLM project's Rust router (cache-aware policy), a manylinux wheel with a Python launcher.
VLLM_ROUTER = "0.1.17"
VLLM_ROUTER_VENV = ".venv-vllm-router"

# py-spy, the sampling profiler bench/edge/profile.py uses (a tool, not a baseline; its own virtualenv too).
PY_SPY = "0.4.3"
TOOLS_VENV = ".venv-bench-tools"

# LiteLLM: the proxy for bench/overhead and the complexity router for bench/router share this one virtualenv.
LITELLM = "1.108.7"
LITELLM_SPEC = f"litellm[proxy]=={LITELLM}"
LITELLM_VENV = ".venv-litellm"
