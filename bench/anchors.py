"""The baselines the benchmarks compare with, built or installed once from registry packages at bench/versions.py's pins.

    .venv/bin/python -m bench.anchors [llama-server] [llama-cpp-server] [vllm-router] [litellm]   (default: all)

- `llama-server`: llama.cpp's C++ server, compiled from the llama.cpp sources vendored in the llama-cpp-python
  source package (PyPI; pip's cache makes a second download free) with the Python build's flags, cached under
  `tiergate_home()/anchors/` like the wheel pip caches: ~10-20 min on 2 cores the first time, then nothing.
- `llama-cpp-server` (llama-cpp-python's own server), `vllm-router`, `litellm`: their own virtualenvs beside the product's (their dependencies clash with ours),
  each recording the requirement it was made with, so a later pin change reinstalls instead of silently reusing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench import versions
from tiergate.core.paths import tiergate_home

__all__ = ["ensure_litellm", "ensure_llama_cpp_server", "ensure_llama_server", "ensure_venv", "ensure_vllm_router",
           "llama_server_path"]

REPO = Path(__file__).resolve().parent.parent
_PIN_FILE = "tiergate-pin.txt"


def llama_server_path() -> Path:
    return tiergate_home() / "anchors" / f"llama-server-{versions.LLAMA_CPP_PYTHON}" / "llama-server"


def ensure_llama_server(log=print) -> Path:
    """The cached binary, building it first when missing (the build's flags are written beside it)."""
    binary = llama_server_path()
    if binary.exists():
        return binary
    out = binary.parent
    with tempfile.TemporaryDirectory(prefix="tg-llama-server-") as tmp:
        log(f"==> downloading the llama-cpp-python {versions.LLAMA_CPP_PYTHON} source package (pip's cache if there)")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                        f"llama-cpp-python=={versions.LLAMA_CPP_PYTHON}", "-d", tmp], check=True)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        src = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
        build = Path(tmp) / "build"
        jobs = str(os.cpu_count() or 2)
        log(f"==> building llama-server from {src.relative_to(tmp)} ({jobs} jobs; ~10-20 min on 2 cores)")
        t0 = time.monotonic()
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        subprocess.run(["cmake", "-S", str(src), "-B", str(build), *gen, *versions.LLAMA_SERVER_CMAKE_ARGS],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs], check=True,
                       stdout=subprocess.DEVNULL)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy2(build / "bin" / "llama-server", binary.with_suffix(".tmp"))
        cc = subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
        (out / "build.json").write_text(json.dumps({
            "llama_cpp_python": versions.LLAMA_CPP_PYTHON, "cmake_args": list(versions.LLAMA_SERVER_CMAKE_ARGS),
            "compiler": cc[0] if cc else None, "build_s": round(time.monotonic() - t0),
            "built": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=2))
        binary.with_suffix(".tmp").rename(binary)
    log(f"==> {binary}")
    return binary


def ensure_venv(name: str, requirement: str, log=print, env: dict[str, str] | None = None) -> Path:
    """`REPO/name` with `requirement` installed; reinstalled when the recorded requirement differs. Returns bin/."""
    venv = REPO / name
    pin = venv / _PIN_FILE
    if pin.exists() and pin.read_text().strip() == requirement:
        return venv / "bin"
    log(f"==> {name}: pip install {requirement}")
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    requirement], check=True, env=os.environ | (env or {}))
    pin.write_text(requirement + "\n")
    return venv / "bin"


def ensure_litellm(log=print) -> Path:
    """bin/ of the LiteLLM virtualenv: the proxy (bench/overhead) and the router module (bench/router)."""
    return ensure_venv(versions.LITELLM_VENV, versions.LITELLM_SPEC, log)


def ensure_llama_cpp_server(log=print) -> Path:
    """bin/ of a virtualenv with llama-cpp-python's server: the same version (and wheel) as the product's."""
    return ensure_venv(versions.LLAMA_CPP_SERVER_VENV, f"llama-cpp-python[server]=={versions.LLAMA_CPP_PYTHON}", log,
                       env={"CMAKE_ARGS": versions.LLAMA_CPP_PYTHON_CMAKE_ARGS})


def ensure_vllm_router(log=print) -> Path:
    return ensure_venv(versions.VLLM_ROUTER_VENV, f"vllm-router=={versions.VLLM_ROUTER}", log)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    todo = {"llama-server": ensure_llama_server, "llama-cpp-server": ensure_llama_cpp_server,
            "vllm-router": ensure_vllm_router, "litellm": ensure_litellm}
    ap.add_argument("which", nargs="*", help=f"any of {', '.join(todo)} (default: all)")
    args = ap.parse_args()
    if bad := [w for w in args.which if w not in todo]:
        ap.error(f"unknown: {', '.join(bad)}")
    for which in args.which or todo:
        todo[which]()


if __name__ == "__main__":
    main()
