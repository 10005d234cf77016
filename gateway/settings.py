"""Gateway settings, from `TIERGATE_*` environment variables (or keyword arguments in tests).

Tested in `tests/gateway/test_app.py`, `tests/gateway/test_auth.py`, `tests/gateway/test_distill.py` and
others.
"""

from __future__ import annotations

import ipaddress
import re
import ssl
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tiergate.core.edge_identity import is_loopback
from tiergate.core.paths import tiergate_home
from tiergate.policies.loader import DEFAULT_POLICY

__all__ = ["Settings", "is_loopback"]

_KEY = re.compile(r"[!-~]{16,}")  # a bearer key: printable ASCII, no spaces
_SECRET = re.compile(r"[!-~]{32,}")
_ORIGIN = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?|https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")


class Settings(BaseSettings):
    """Everything a gateway process is configured with; the policy file holds the routing itself."""

    # hide_input_in_errors: a validation error must not print the other settings (the admin key among them)
    model_config = SettingsConfigDict(env_prefix="TIERGATE_", extra="ignore", hide_input_in_errors=True)

    host: str = "127.0.0.1"  # bind address of `tiergate serve`; not loopback: the demo key is refused (below)
    port: int = 8080
    policy: Path = DEFAULT_POLICY
    redis_url: str | None = None  # None: every piece of shared state lives in this process
    api_keys_file: Path | None = None  # YAML: tenants and (hashed) keys; see docs/configuration.md
    api_keys: str | None = None  # inline "key=tenant:priority,..." for quick set-ups
    # accept the documented demo key `tg-demo-key` (tenant "demo") when no keys are configured, on a loopback bind
    # address only: with any other `host` and no keys, the settings are refused (`_no_public_demo_key`)
    demo_key: bool = True
    admin_key: str | None = None
    # Edge registration (gateway.edge_auth, docs/reliability.md "Threat model"): per-node keys derived from this
    # secret (`tiergate edge node-key ID`); and/or a shared token that lets a node register an id no one holds. With
    # neither, only processes on this machine (a loopback socket, no proxy headers) may register.
    edge_secret: str | None = None
    edge_token: str | None = None
    # networks a registered node's URL may point into ("10.0.0.0/8,fd00::/8"); unset: any address but the ones
    # never allowed (link-local, the metadata services, multicast, unspecified; loopback only from loopback)
    edge_networks: str | None = None
    # a PEM bundle of the CAs that sign the certificates of https:// backends (edge nodes, vLLM); unset: the
    # system's CAs. Backends' API keys: per node (derived) or the tier's `api_key_env` in the policy
    backend_ca_file: Path | None = None
    # /metrics: a bearer key it requires when set (unset: open to whoever reaches the port), and whether its series
    # may carry tenant ids (false: summed over tenants, per-tenant gauges left out; gateway.metrics.exposition)
    metrics_key: str | None = None
    metrics_tenant_labels: bool = True
    embedder: Path | None = None  # ONNX embedder dir; None disables the semantic half of the cache
    distill_file: Path = Field(default_factory=lambda: tiergate_home() / "distill.jsonl")  # records without Redis
    cache: bool = True
    cache_store: Literal["auto", "vectorset", "stream"] = "auto"  # Redis layout: auto (vector sets on Redis 8, else stream) | vectorset | stream
    # Redis 8: VSIM inside the search script (one round trip, on Redis's main thread) or threaded (docs/cache.md)
    cache_vset_search: Literal["script", "threaded"] = "script"
    cache_judge_url: str | None = None  # error-bounded rules: an OpenAI-compatible model judging answers
    cache_judge_model: str | None = None  # (default judge: the cache's embedder); see docs/cache.md
    cache_judge_key: str | None = None
    # error-bounded rules: a cross-encoder verifier folder (`tiergate cache train-verifier`); see docs/cache.md
    cache_verifier: Path | None = None
    cache_shadow_concurrency: int = Field(default=4, ge=1)  # shadow checks of sampled hits running at once (gateway.shadow)
    max_body_bytes: int = 1 << 20
    header_timeout_s: float = Field(default=10.0, gt=0)  # a request's line and headers, from the connection's start
    body_timeout_s: float = Field(default=30.0, gt=0)  # its body, from its headers' end: else 408
    max_connections: int | None = Field(default=None, ge=1)  # per process; past it new requests get 503 (uvicorn)
    max_prompt_chars: int = 400_000
    # answers one completion request may ask for (`n` × prompts), each served as a request of its own (gateway.fanout)
    max_choices: int = Field(default=8, ge=1, le=128)
    # /v1/embeddings (gateway.embeddings): the name the cache's embedder is served under, and texts per request
    embeddings_model: str = Field(default="tiergate-embed", min_length=1, max_length=256)
    embeddings_max_inputs: int = Field(default=256, ge=1, le=2048)
    # browser origins allowed to call the API ("https://app.example.com,http://localhost:3000", or "*"); unset: no
    # CORS headers at all, and a browser's preflight gets 405 (docs/configuration.md "CORS")
    cors_origins: str | None = None
    log_format: str = "json"  # json | console
    log_level: str = "info"
    workers: int = 1
    graceful_shutdown_s: float = 30.0  # how long in-flight streams may run on after SIGTERM
    drain_delay_s: float = 2.0  # after SIGTERM: /readyz says 503 this long (load balancers notice) before the listener closes

    @field_validator("redis_url", "api_keys_file", "api_keys", "admin_key", "edge_secret", "edge_token",
                     "edge_networks", "backend_ca_file", "metrics_key", "embedder", "cache_judge_url",
                     "cache_judge_model", "cache_judge_key", "cache_verifier", "cors_origins", mode="before")
    @classmethod
    def _empty_is_unset(cls, v: object) -> object:
        """`TIERGATE_EMBEDDER=` (empty) means "not set", not the current directory."""
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("metrics_key")
    @classmethod
    def _metrics_key_is_a_key(cls, v: str | None) -> str | None:
        if v is not None and not _KEY.fullmatch(v):
            raise ValueError("TIERGATE_METRICS_KEY must be at least 16 printable ASCII characters without spaces "
                             "(e.g. `openssl rand -hex 16`)")
        return v

    @field_validator("edge_secret")
    @classmethod
    def _edge_secret_is_long(cls, v: str | None) -> str | None:
        if v is not None and not _SECRET.fullmatch(v):
            raise ValueError("TIERGATE_EDGE_SECRET must be at least 32 printable ASCII characters without spaces "
                             "(e.g. `openssl rand -hex 32`): every node's key is derived from it")
        return v

    @field_validator("edge_networks")
    @classmethod
    def _networks_parse(cls, v: str | None) -> str | None:
        if v is not None:
            for item in v.split(","):
                try:
                    ipaddress.ip_network(item.strip(), strict=False)
                except ValueError:
                    raise ValueError(f"TIERGATE_EDGE_NETWORKS: {item.strip()!r} is not a network like 10.0.0.0/8 "
                                     f"or fd00::/8 (comma-separated)") from None
        return v

    @field_validator("backend_ca_file")
    @classmethod
    def _ca_file_loads(cls, v: Path | None) -> Path | None:
        if v is not None:
            try:
                ssl.create_default_context(cafile=str(v))
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"TIERGATE_BACKEND_CA_FILE={str(v)!r}: not a readable PEM file of CA "
                                 f"certificates: {exc}") from None
        return v

    @field_validator("cors_origins")
    @classmethod
    def _origins_parse(cls, v: str | None) -> str | None:
        for origin in (v or "").split(","):
            o = origin.strip()
            if o and o != "*" and not _ORIGIN.fullmatch(o):
                raise ValueError(f"TIERGATE_CORS_ORIGINS: {o[:80]!r} is not an origin like https://app.example.com "
                                 f"or http://localhost:3000 (scheme, host and port only; comma-separated, or *)")
        return v

    def cors_origin_list(self) -> list[str]:
        """TIERGATE_CORS_ORIGINS parsed (empty: CORS off)."""
        return [o.strip() for o in (self.cors_origins or "").split(",") if o.strip()]

    def edge_network_list(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        """TIERGATE_EDGE_NETWORKS parsed (empty: unset)."""
        items = (self.edge_networks or "").split(",")
        return [ipaddress.ip_network(i.strip(), strict=False) for i in items if i.strip()]

    def backend_ssl(self) -> ssl.SSLContext | None:
        """The TLS context verifying https:// backends against TIERGATE_BACKEND_CA_FILE (None: the system's CAs)."""
        return ssl.create_default_context(cafile=str(self.backend_ca_file)) if self.backend_ca_file else None

    @model_validator(mode="after")
    def _no_public_demo_key(self) -> Settings:
        """The demo key is public (it is in the README): never serve it where others can reach the gateway."""
        if self.demo_key and not self.api_keys_file and not self.api_keys and not is_loopback(self.host):
            raise ValueError(
                f"TIERGATE_DEMO_KEY: the public demo key `tg-demo-key` would be accepted on the non-loopback bind "
                f"address TIERGATE_HOST={self.host!r}; configure keys (TIERGATE_API_KEYS_FILE or TIERGATE_API_KEYS), "
                f"or set TIERGATE_DEMO_KEY=false, or bind to 127.0.0.1")
        return self

