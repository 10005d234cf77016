"""Resolve `--model`: a packaged model's name (`edge_node.model.packaged`, e.g. `smollm2-135m-instruct`), a local GGUF
path, or a Hugging Face reference `org/repo[:file.gguf]`.

Hub references need `huggingface_hub` and network access (or a warm local cache); when either is
missing the error says so in one line rather than failing deep inside a download.
"""

from __future__ import annotations

import re
from pathlib import Path

from tiergate.edge_node.model.model_file import ModelFileError
from tiergate.edge_node.model.packaged import is_packaged, packaged_path

__all__ = ["is_hub_ref", "resolve_model"]

_HUB_REF = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<file>[^:]+\.gguf))?$")


def is_hub_ref(ref: str) -> bool:
    """`org/repo` or `org/repo:file.gguf` that is not an existing local path."""
    if Path(ref).exists():
        return False
    m = _HUB_REF.match(ref)
    # `dir/model.gguf` is a (missing) local path; `org/repo:model.gguf` names a file in a Hub repo.
    return m is not None and (m.group("file") is not None or not ref.endswith(".gguf"))


def _pick_gguf(files: list[str]) -> str | None:
    ggufs = sorted(f for f in files if f.endswith(".gguf"))
    if not ggufs:
        return None
    for pref in ("q4_k_m", "q4_0", "q4"):
        for f in ggufs:
            if pref in f.lower():
                return f
    return ggufs[0]


def resolve_model(ref: str) -> Path:
    """A local path to a GGUF file. Raises ModelFileError with a one-line reason."""
    if is_packaged(ref):
        return packaged_path(ref)
    if not is_hub_ref(ref):
        return Path(ref).expanduser()
    m = _HUB_REF.match(ref)
    assert m is not None
    repo, filename = m.group("repo"), m.group("file")
    try:
        import huggingface_hub as hf  # optional dependency: only for a Hugging Face reference
    except ImportError:
        raise ModelFileError(
            f"{ref!r} is not a local file, and huggingface_hub is not installed to fetch it from the Hub"
        ) from None
    try:
        if filename is None:
            filename = _pick_gguf(hf.list_repo_files(repo))
            if filename is None:
                raise ModelFileError(f"Hugging Face repo {repo} has no .gguf file; name one as {repo}:FILE.gguf")
        try:
            return Path(hf.hf_hub_download(repo, filename, local_files_only=True))
        except Exception:  # noqa: BLE001 - not in the local cache: try the network
            return Path(hf.hf_hub_download(repo, filename))
    except ModelFileError:
        raise
    except Exception as e:  # noqa: BLE001 - any hub/network failure becomes one clear line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelFileError(
            f"could not fetch {ref} from the Hugging Face Hub (offline or not found?): {first[:200]}."
            " Download the GGUF elsewhere and pass its local path to --model"
        ) from None
