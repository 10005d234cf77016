"""ASGI entry point for uvicorn workers: `uvicorn gateway.main:app` (settings from TIERGATE_* variables)."""

from tiergate.gateway.app import create_app

app = create_app()
