"""llama.cpp's own Python converters, from the llama-cpp-python source package the edge node is built from.

The converter must match the llama.cpp that loads its output, so it comes from the same release's sdist
(`vendor/llama.cpp`), the way bench/anchors.py builds llama-server: downloaded once with pip (pip's cache if
there), and only the converters, their `conversion/` package and `gguf-py/` kept under the tiergate home.
TIERGATE_LLAMA_CPP_SRC points at an unpacked `vendor/llama.cpp` instead. llama-server's own test suite
(`tools/server/tests/`, which tests/integration/test_llama_server_suite.py runs against the edge node and the
gateway) comes from the same sdist the same way, kept in a folder of its own.

Tested in `tests/training/test_pipeline.py`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tiergate.core.paths import tiergate_home

__all__ = ["LLAMA_CPP_PYTHON", "ConversionError", "convert_lora", "llama_cpp_sources", "llama_server_tests"]

LLAMA_CPP_PYTHON = "0.3.36"  # the edge extra's pin: converter and runtime from one release
_KEEP = ("convert_lora_to_gguf.py", "convert_hf_to_gguf.py", "conversion/", "gguf-py/")
_SERVER_TESTS = ("tools/server/tests/",)


class ConversionError(RuntimeError):
    """A converter failed; carries the tail of its output."""


def _wanted(name: str, keep: tuple[str, ...]) -> bool:
    _, sep, rest = name.partition("/vendor/llama.cpp/")
    return bool(sep) and any(rest == k or (k.endswith("/") and rest.startswith(k)) for k in keep)


def llama_cpp_sources() -> Path:
    """The folder holding `convert_lora_to_gguf.py` (downloaded and unpacked on first use)."""
    if env := os.environ.get("TIERGATE_LLAMA_CPP_SRC"):
        return Path(env)
    return _unpacked(_KEEP, tiergate_home() / "llama.cpp-converters" / LLAMA_CPP_PYTHON)


def llama_server_tests() -> Path:
    """llama-server's own pytest suite (`utils.py`, `conftest.py`, `unit/`), downloaded and unpacked on first use."""
    if env := os.environ.get("TIERGATE_LLAMA_CPP_SRC"):
        return Path(env) / "tools" / "server" / "tests"
    return _unpacked(_SERVER_TESTS, tiergate_home() / "llama.cpp-server-tests" / LLAMA_CPP_PYTHON) \
        / "tools" / "server" / "tests"


def _unpacked(keep: tuple[str, ...], dest: Path) -> Path:
    """`dest` holding the sdist's `vendor/llama.cpp` paths in `keep` (fetched with pip unless already there)."""
    if all((dest / k).exists() for k in keep):
        return dest
    with tempfile.TemporaryDirectory(prefix="tg-llama-src-") as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                        f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", tmp], check=True)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, members=[m for m in tar.getmembers() if _wanted(m.name, keep)], filter="data")
        src = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
        staging = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(src, staging)
        staging.rename(dest)
    return dest


def convert_lora(adapter_dir: Path, base_dir: Path, out: Path) -> Path:
    """`convert_lora_to_gguf.py`: the peft adapter in `adapter_dir`, over the HF base in `base_dir`, to an f16 GGUF."""
    src = llama_cpp_sources()
    adapter_dir, base_dir, out = adapter_dir.resolve(), base_dir.resolve(), out.resolve()  # it runs in `src`
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(src / "gguf-py")]), "NO_LOCAL_GGUF": ""}
    cmd = [sys.executable, str(src / "convert_lora_to_gguf.py"), "--base", str(base_dir), "--outtype", "f16",
           "--outfile", str(out), str(adapter_dir)]
    done = subprocess.run(cmd, cwd=src, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not out.exists():
        raise ConversionError(f"convert_lora_to_gguf.py exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    return out
