"""`POST /admin/lora`: swap the node's LoRA adapter while it serves, dropping no request.

Only files in the folder the node was started with (`--lora-dir`) can be named, by file name: an API caller
never chooses a path on the node. `{"adapter": "v2.gguf"}` applies that adapter, `{"adapter": null}` serves the
plain model. The engine pauses admission, lets the requests in its slots finish, swaps, and resumes
(`Engine.swap_lora`); the answer says which adapter now serves. Without `--lora-dir` the route answers 404.

Tested in `tests/edge_node/server/test_adapter.py`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from tiergate.core.errors import OpenAIError, bad_request, not_found
from tiergate.core.http import error_response
from tiergate.edge_node.engine.engine import EngineError
from tiergate.edge_node.engine.runtime import ModelLoadError
from tiergate.edge_node.server.state import ServerState

__all__ = ["LoraSwap"]


class _Body(msgspec.Struct, forbid_unknown_fields=True):
    adapter: str | None


class LoraSwap:
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def _path(self, name: str | None) -> Path | None:
        folder = self.state.lora_dir
        if folder is None:
            raise not_found("adapter swaps are off: start the node with --lora-dir")
        if name is None:
            return None
        if Path(name).name != name or name in (".", "..") or not name.endswith(".gguf"):
            raise bad_request("adapter must be the file name of a .gguf in the node's --lora-dir", param="adapter")
        path = folder / name
        if not path.is_file():
            raise not_found(f"no adapter {name!r} in the node's --lora-dir", param="adapter")
        return path

    async def handle(self, request: Request) -> Response:
        try:
            body = msgspec.json.decode(await request.body(), type=_Body)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return error_response(bad_request(f"body must be {{\"adapter\": FILE_NAME or null}}: {exc}"))
        try:
            path = self._path(body.adapter)
            await asyncio.to_thread(self.state.engine.swap_lora, path)
        except OpenAIError as exc:
            return error_response(exc)
        except ModelLoadError as exc:
            return error_response(bad_request(str(exc), code="bad_adapter", param="adapter"))
        except EngineError as exc:
            return error_response(OpenAIError(409, str(exc), code="swap_refused"))
        lora = self.state.engine.rt.lora_path
        return Response(msgspec.json.encode({"lora": lora.name if lora else None}), media_type="application/json")
