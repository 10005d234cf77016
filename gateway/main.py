"""ASGI entry point for uvicorn workers: `uvicorn gateway.main:app` (settings from TIERGATE_* variables).

The settings' refusal of the demo key on a public bind address reads TIERGATE_HOST: `tiergate serve` binds to
it, but uvicorn started by hand with its own `--host` does not tell the app; set TIERGATE_HOST to the same
address (or configure keys) when running it that way. Run it with `--no-proxy-headers` too, as `tiergate serve`
does: the edge registration reads the scope's client as the socket's peer (gateway.edge_auth), and refuses
requests carrying proxy headers as not local either way. Started by hand, uvicorn also uses its own HTTP protocol
unless given `--http tiergate.core.serving:HeadTimeoutProtocol`: without it a request's head has no deadline."""

from tiergate.core.serving import head_timeout_protocol
from tiergate.gateway.app import create_app
from tiergate.gateway.settings import Settings

_settings = Settings()
head_timeout_protocol(_settings.header_timeout_s)  # `tiergate serve --workers N`: each worker's own deadline
app = create_app(_settings)
