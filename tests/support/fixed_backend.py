"""A backend that answers every completion with the same bytes, for tests of what the gateway does with a backend's
answer whatever it is (garbage, an error in a 200, a stream with an error frame): `fixed_backend`."""

from __future__ import annotations

from aiohttp import web

__all__ = ["fixed_backend"]


def fixed_backend(json_body: bytes, frames: list[bytes] | None = None, *, status: int = 200) -> web.Application:
    """Answers every JSON request with `status` and `json_body`, every stream with `frames` (default: the JSON
    body as the one event) and then `[DONE]`; `/health` says it is ready."""
    events = [json_body] if frames is None else frames

    async def complete(request: web.Request) -> web.StreamResponse:
        if not (await request.json()).get("stream"):
            return web.Response(status=status, body=json_body, content_type="application/json")
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for frame in [*events, b"[DONE]"]:
            await resp.write(b"data: " + frame + b"\n\n")
        return resp

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "slots": 4, "busy": 0, "queued": 0})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_get("/health", health)
    return app
