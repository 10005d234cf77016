"""API keys → tenants. Keys are kept only as SHA-256 digests and are never logged.

A key file (YAML) lists tenants with their priority tier and limits, and the keys that map to them.
With no keys configured, the documented demo key `tg-demo-key` maps to the tenant `demo`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from tiergate.core import tracing
from tiergate.core.errors import unauthorized
from tiergate.core.types import Priority

__all__ = ["DEMO_KEY", "Authenticator", "KeyFileError", "KeyRing", "Tenant", "hash_key"]

DEMO_KEY = "tg-demo-key"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Tenant:
    id: str
    priority: Priority = Priority.NORMAL
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_tokens: int | None = None  # cap on any single request's max_tokens
    max_concurrency: int | None = None


class _TenantSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    priority: str = "normal"
    requests_per_minute: int | None = Field(default=None, gt=0)
    tokens_per_minute: int | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)
    max_concurrency: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _priority_known(self) -> _TenantSpec:
        Priority.parse(self.priority)
        return self


class _KeySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant: str
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    key: str | None = Field(default=None, min_length=8)

    @model_validator(mode="after")
    def _one_of(self) -> _KeySpec:
        if (self.sha256 is None) == (self.key is None):
            raise ValueError("give exactly one of `sha256` (preferred) or `key`")
        return self


class _KeyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenants: dict[str, _TenantSpec]
    keys: list[_KeySpec]

    @model_validator(mode="after")
    def _tenants_exist(self) -> _KeyFile:
        for i, k in enumerate(self.keys):
            if k.tenant not in self.tenants:
                raise ValueError(f"keys[{i}].tenant {k.tenant!r} is not one of the tenants: {sorted(self.tenants)}")
        return self


class KeyFileError(ValueError):
    pass


def _line_of(doc: object, loc: tuple[object, ...]) -> str:
    """Best-effort 'line N' for a pydantic error location, from ruamel's node marks."""
    node, line = doc, None
    for part in loc:
        try:
            lc = node.lc  # type: ignore[attr-defined]
            line = (lc.key(part) if isinstance(part, str) else lc.item(part))[0] + 1
            node = node[part]  # type: ignore[index]
        except Exception:
            break
    return f"line {line}" if line else "?"


class Authenticator(Protocol):
    """What a route needs of the keys: a tenant for a bearer header, or a 401 (`KeyRing`, `gateway.keys.Keys`)."""

    def authenticate(self, authorization: str | None) -> Tenant: ...

    def identify(self, authorization: str | None) -> tuple[Tenant, str]:
        """The tenant and the key's SHA-256 (what per-key budgets and usage are kept by), or a 401."""
        ...


class KeyRing:
    """Resolves a bearer key to its tenant in O(1); immutable once built."""

    def __init__(self, tenants_by_hash: dict[str, Tenant]) -> None:
        self._by_hash = dict(tenants_by_hash)

    def __len__(self) -> int:
        return len(self._by_hash)

    def tenants(self) -> list[Tenant]:
        return sorted({t.id: t for t in self._by_hash.values()}.values(), key=lambda t: t.id)

    def digests(self) -> frozenset[str]:
        """The SHA-256 digests of the keys it knows."""
        return frozenset(self._by_hash)

    def authenticate(self, authorization: str | None) -> Tenant:
        """Return the tenant for an `Authorization: Bearer KEY` header, or raise a 401 OpenAIError."""
        with tracing.span("auth"):
            return self.resolve(authorization)[0]

    def identify(self, authorization: str | None) -> tuple[Tenant, str]:
        with tracing.span("auth"):
            return self.resolve(authorization)

    def resolve(self, authorization: str | None) -> tuple[Tenant, str]:
        """The tenant for an `Authorization: Bearer KEY` header and the key's digest, or a 401 OpenAIError."""
        if not authorization:
            raise unauthorized("Missing API key: send `Authorization: Bearer <key>`.")
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise unauthorized("Malformed Authorization header: expected `Bearer <key>`.")
        digest = hash_key(key.strip())
        tenant = self._by_hash.get(digest)
        if tenant is None:
            raise unauthorized("Invalid API key.")
        return tenant, digest

    @classmethod
    def demo(cls) -> KeyRing:
        return cls({hash_key(DEMO_KEY): Tenant("demo", Priority.NORMAL)})

    @classmethod
    def from_inline(cls, spec: str) -> KeyRing:
        """`key=tenant[:priority],key2=tenant2` — handy for tests and one-off set-ups."""
        out: dict[str, Tenant] = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            key, sep, rest = item.partition("=")
            if not sep or not key or not rest:
                raise KeyFileError(f"TIERGATE_API_KEYS entry {item.split('=')[0]!r}…: expected key=tenant[:priority]")
            tenant, _, prio = rest.partition(":")
            out[hash_key(key)] = Tenant(tenant, Priority.parse(prio or "normal"))
        return cls(out)

    @classmethod
    def from_file(cls, path: Path) -> KeyRing:
        try:
            doc = YAML(typ="rt").load(path.read_text())
        except (OSError, YAMLError) as exc:
            raise KeyFileError(f"{path}: cannot read key file: {exc}") from None
        try:
            spec = _KeyFile.model_validate(doc)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "(top level)"
            raise KeyFileError(f"{path}:{_line_of(doc, err['loc'])}: field `{field}`: {err['msg']}") from None
        tenants = {
            name: Tenant(
                name,
                Priority.parse(t.priority),
                t.requests_per_minute,
                t.tokens_per_minute,
                t.max_tokens,
                t.max_concurrency,
            )
            for name, t in spec.tenants.items()
        }
        return cls({(k.sha256 or hash_key(k.key or "")): tenants[k.tenant] for k in spec.keys})
