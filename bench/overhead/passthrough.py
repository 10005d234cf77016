"""The floor for any Python gateway here: uvicorn + Starlette + one pooled aiohttp client, and nothing else.

No auth, no parsing, no classification, no cache: the body goes up as bytes and the answer comes back as
bytes (SSE relayed chunk by chunk). bench/overhead runs it beside tiergate so that the gateway's added
latency can be read against what the extra hop alone costs on the same machine.

Run: python -m bench.overhead.passthrough --port 9002 --upstream http://127.0.0.1:9001
"""

from __future__ import annotations

import argparse
import contextlib

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


def make_app(upstream: str) -> Starlette:
    state: dict[str, aiohttp.ClientSession] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        state["s"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        yield
        await state["s"].close()

    async def relay(request: Request) -> Response:
        body = await request.body()
        resp = await state["s"].post(upstream + request.url.path, data=body,
                                     headers={"content-type": "application/json"})
        if resp.content_type == "text/event-stream":
            async def chunks():
                try:
                    async for chunk in resp.content.iter_any():
                        yield chunk
                finally:
                    resp.release()
            return StreamingResponse(chunks(), status_code=resp.status, media_type="text/event-stream")
        data = await resp.read()
        resp.release()
        return Response(data, status_code=resp.status, media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b"ok")

    return Starlette(routes=[Route("/v1/chat/completions", relay, methods=["POST"]),
                             Route("/v1/completions", relay, methods=["POST"]),
                             Route("/health", health)], lifespan=lifespan)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", required=True)
    args = ap.parse_args()
    uvicorn.run(make_app(args.upstream.rstrip("/")), host="127.0.0.1", port=args.port, loop="uvloop",
                http="httptools", log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
