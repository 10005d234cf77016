"""Loopback ports for the servers that tests and benchmarks start, and a raw wait for a redis-server."""

from __future__ import annotations

import socket

__all__ = ["free_port", "redis_answers"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_answers(port: int, timeout_s: float = 0.5) -> bool:
    """Whether a redis-server on this port answers PING now (raw RESP: no client library needed to wait)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False
