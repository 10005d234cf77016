"""What the client conformance tests share (tests/integration/test_python_clients*.py): the questions, the tool and
the response model whose answers the small models here know, and a recorder of what a client sent."""

from __future__ import annotations

import json
from typing import Any

import httpx
import litellm
from langchain_core.tools import tool
from pydantic import BaseModel, Field

__all__ = ["CAPITAL_PROMPT", "CAPITAL_QUESTION", "KEY", "WEATHER_PROMPT", "WEATHER_SCHEMA", "WEATHER_TOOL",
           "CityCountry", "Wire", "get_weather"]

litellm.suppress_debug_info = True  # its banners on every error; the errors themselves still raise

KEY = "tg-demo-key"
WEATHER_PROMPT = "What is the weather in Paris? Use the tool."
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
                                                 "parameters": WEATHER_SCHEMA}}
CAPITAL_PROMPT = "What is the capital of France? Answer with one word."
CAPITAL_QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


class Wire:
    """What a client sent to the gateway and the headers it got back, recorded by httpx event hooks."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.headers: list[httpx.Headers] = []

    def _request(self, request: httpx.Request) -> None:
        self.sent.append(json.loads(request.content))

    def _response(self, response: httpx.Response) -> None:
        self.headers.append(response.headers)

    async def _arequest(self, request: httpx.Request) -> None:
        self._request(request)

    async def _aresponse(self, response: httpx.Response) -> None:
        self._response(response)

    def client(self) -> httpx.Client:
        return httpx.Client(timeout=120, event_hooks={"request": [self._request], "response": [self._response]})

    def async_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=120, event_hooks={"request": [self._arequest],
                                                           "response": [self._aresponse]})


@tool
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"Sunny, 24 degrees Celsius in {city}."


class CityCountry(BaseModel):
    """A country's capital city."""

    # The docstring and the field's description are part of the prompt (the tool's description, the schema): with
    # them SmolLM2-135M answers CAPITAL_QUESTION right in both instructor modes; without, in TOOLS mode it does not.

    capital: str = Field(description="the capital city")
    country: str
