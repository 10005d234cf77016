"""In-process nearest-neighbour index over cache entries, one space per namespace.

A search only ever looks inside the request's own namespace (tenant, model, parameters, context), so a
semantic hit cannot cross tenants by construction, whatever the vectors look like.

Each space is a flat float32 matrix (exact brute force: ~0.5 ms at 20k rows) plus, once the space outgrows
`hnsw_at`, a usearch HNSW graph (int8, cosine) that the flat part is flushed
into in small chunks by `maintain()` from a background thread. New entries are therefore searchable at
once, and a search never waits for a large build: the lock is held for one chunk at a time.

Redis has no vector search on stock Redis 7, so every gateway process keeps this index and follows the
shared store's change stream (see `cache.redis.store`).
"""

from __future__ import annotations

import contextlib
import heapq
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

__all__ = ["VectorIndex"]

_FLUSH_CHUNK = 128


@dataclass(slots=True)
class _Meta:
    label: int
    namespace: str
    tenant_tag: str
    expires_at: float


@dataclass(slots=True)
class _Space:
    dim: int
    vecs: np.ndarray = field(init=False)
    labels: np.ndarray = field(init=False)
    n: int = 0
    row: dict[int, int] = field(default_factory=dict)
    hnsw: object | None = None  # usearch.index.Index
    in_hnsw: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.vecs = np.zeros((16, self.dim), np.float32)
        self.labels = np.zeros(16, np.int64)

    @property
    def size(self) -> int:
        return self.n + len(self.in_hnsw)

    def add(self, label: int, vec: np.ndarray) -> None:
        if self.n == len(self.labels):
            cap = 2 * len(self.labels)
            self.vecs = np.resize(self.vecs, (cap, self.dim))
            self.labels = np.resize(self.labels, cap)
        self.vecs[self.n] = vec
        self.labels[self.n] = label
        self.row[label] = self.n
        self.n += 1

    def add_many(self, labels: np.ndarray, vecs: np.ndarray) -> None:
        need = self.n + len(labels)
        if need > len(self.labels):
            cap = max(need, 2 * len(self.labels))
            self.vecs = np.resize(self.vecs, (cap, self.dim))
            self.labels = np.resize(self.labels, cap)
        self.vecs[self.n:need] = vecs
        self.labels[self.n:need] = labels
        for i, lab in enumerate(labels.tolist()):
            self.row[lab] = self.n + i
        self.n = need

    def shrink(self) -> None:
        """Give back the flat buffer's memory once most of it moved into the graph."""
        cap = len(self.labels)
        if cap > 64 and cap > 4 * self.n:
            keep = max(2 * self.n, 16)
            self.vecs = self.vecs[:keep].copy()
            self.labels = self.labels[:keep].copy()

    def remove(self, label: int) -> None:
        r = self.row.pop(label, None)
        if r is not None:
            last = self.n - 1
            if r != last:
                self.vecs[r] = self.vecs[last]
                moved = int(self.labels[last])
                self.labels[r] = moved
                self.row[moved] = r
            self.n = last
        elif label in self.in_hnsw:
            self.in_hnsw.discard(label)
            self.hnsw.remove(label)  # type: ignore[attr-defined]

    def search(self, q: np.ndarray, k: int) -> list[tuple[int, float]]:
        found: dict[int, float] = {}
        if self.n:
            sims = self.vecs[: self.n] @ q
            top = np.argpartition(-sims, k - 1)[:k] if self.n > k else np.arange(self.n)
            for i in top:
                found[int(self.labels[i])] = float(sims[i])
        if self.in_hnsw:
            m = self.hnsw.search(q, k, threads=1)  # type: ignore[attr-defined]
            for key, dist in zip(m.keys.tolist(), m.distances.tolist(), strict=False):
                if key in self.in_hnsw and key not in found:
                    found[int(key)] = 1.0 - float(dist)  # usearch "cos" distance is 1 - cosine
        # Up to k from each part: graph similarities are int8 approximations, so the caller re-scores
        # all candidates exactly rather than trusting a merged top k.
        return sorted(found.items(), key=lambda kv: -kv[1])


class VectorIndex:
    """Thread-safe; every method is cheap except `maintain`, meant for a background thread."""

    def __init__(self, dim: int, *, hnsw_at: int = 20_000) -> None:
        self.dim = dim
        self.hnsw_at = hnsw_at
        self._lock = threading.RLock()
        self._meta: dict[str, _Meta] = {}
        self._ids: dict[int, str] = {}
        self._spaces: dict[str, _Space] = {}
        self._expiry: list[tuple[float, int]] = []
        self._next = 1

    def __len__(self) -> int:
        return len(self._meta)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._meta

    def upsert(self, entry_id: str, namespace: str, tenant_tag: str, vector: np.ndarray,
               expires_at: float) -> None:
        vec = np.asarray(vector, np.float32).reshape(-1)
        if vec.shape[0] != self.dim:
            raise ValueError(f"vector has {vec.shape[0]} dimensions, index has {self.dim}")
        with self._lock:
            self._remove_locked(entry_id)
            label = self._new_label(entry_id, namespace, tenant_tag, expires_at)
            self._space(namespace).add(label, vec)

    def upsert_many(self, entry_ids: list[str], namespaces: list[str], tenant_tags: list[str],
                    vectors: np.ndarray, expires_at: list[float]) -> None:
        """Bulk load (initial scan, benchmarks): grouped by namespace, one numpy copy per group."""
        vectors = np.asarray(vectors, np.float32).reshape(len(entry_ids), self.dim)
        with self._lock:
            groups: dict[str, list[int]] = {}
            labels = np.zeros(len(entry_ids), np.int64)
            for i, eid in enumerate(entry_ids):
                self._remove_locked(eid)
                labels[i] = self._new_label(eid, namespaces[i], tenant_tags[i], expires_at[i])
                groups.setdefault(namespaces[i], []).append(i)
            for ns, rows in groups.items():
                idx = np.asarray(rows)
                self._space(ns).add_many(labels[idx], vectors[idx])

    def remove(self, entry_id: str) -> bool:
        with self._lock:
            return self._remove_locked(entry_id)

    def remove_tenant(self, tenant_tag: str) -> int:
        with self._lock:
            doomed = [eid for eid, m in self._meta.items() if m.tenant_tag == tenant_tag]
            for eid in doomed:
                self._remove_locked(eid)
            return len(doomed)

    def remove_where(self, doomed: Callable[[str, str], bool]) -> int:
        """Remove every entry for which `doomed(entry_id, tenant_tag)` is true (e.g. one Cluster shard's)."""
        with self._lock:
            ids = [eid for eid, m in self._meta.items() if doomed(eid, m.tenant_tag)]
            for eid in ids:
                self._remove_locked(eid)
            return len(ids)

    def clear(self) -> None:
        with self._lock:
            self._meta.clear()
            self._ids.clear()
            self._spaces.clear()
            self._expiry.clear()

    def search(self, namespace: str, vector: np.ndarray, k: int, *,
               now: float | None = None) -> list[tuple[str, float]]:
        """Nearest (entry_id, cosine) in `namespace`, best first, unexpired only: up to k exact ones from the
        flat part plus up to k approximate ones from the HNSW graph (re-score them before trusting them)."""
        now = time.time() if now is None else now
        with self._lock:
            space = self._spaces.get(namespace)
            if space is None or space.size == 0:
                return []
            out = []
            for label, sim in space.search(np.asarray(vector, np.float32).reshape(-1), k):
                eid = self._ids.get(label)
                if eid is None:
                    continue
                m = self._meta[eid]
                if m.namespace == namespace and m.expires_at > now:
                    out.append((eid, sim))
            return out

    def expire(self, now: float | None = None, limit: int = 1_000_000_000) -> int:
        """Drop up to `limit` expired entries (call again while it returns `limit`: keeps lock holds short)."""
        now = time.time() if now is None else now
        removed = 0
        with self._lock:
            while self._expiry and self._expiry[0][0] <= now and removed < limit:
                exp, label = heapq.heappop(self._expiry)
                eid = self._ids.get(label)
                if eid is not None and self._meta[eid].expires_at == exp:
                    self._remove_locked(eid)
                    removed += 1
        return removed

    def maintain(self, threads: int = 1) -> int:
        """Move flat rows of large namespaces into their HNSW graphs; returns rows moved. Blocking.

        One thread by default (cores are shared); bulk loads (benchmarks) may pass more.
        """
        moved = 0
        with self._lock:
            todo = [ns for ns, s in self._spaces.items() if s.size > self.hnsw_at and s.n >= _FLUSH_CHUNK]
        for ns in todo:
            while True:
                with self._lock:
                    space = self._spaces.get(ns)
                    if space is None or space.n < _FLUSH_CHUNK:
                        break
                    if space.hnsw is None:
                        space.hnsw = _new_hnsw(self.dim)
                    start = space.n - _FLUSH_CHUNK * threads
                    start = max(start, 0)
                    labels = space.labels[start:space.n].copy()
                    space.hnsw.add(labels, space.vecs[start:space.n], threads=threads)  # type: ignore[attr-defined]
                    for lab in labels.tolist():
                        del space.row[lab]
                        space.in_hnsw.add(lab)
                    space.n = start
                    moved += len(labels)
                time.sleep(0)  # let a waiting search take the lock between chunks
            with self._lock:
                space = self._spaces.get(ns)
                if space is not None:
                    space.shrink()
        return moved

    def _space(self, namespace: str) -> _Space:
        space = self._spaces.get(namespace)
        if space is None:
            space = self._spaces[namespace] = _Space(self.dim)
        return space

    def _new_label(self, entry_id: str, namespace: str, tenant_tag: str, expires_at: float) -> int:
        label = self._next
        self._next += 1
        self._meta[entry_id] = _Meta(label, namespace, tenant_tag, float(expires_at))
        self._ids[label] = entry_id
        heapq.heappush(self._expiry, (float(expires_at), label))
        return label

    def _remove_locked(self, entry_id: str) -> bool:
        m = self._meta.pop(entry_id, None)
        if m is None:
            return False
        self._ids.pop(m.label, None)
        space = self._spaces.get(m.namespace)
        if space is not None:
            space.remove(m.label)
            if space.size == 0:
                del self._spaces[m.namespace]
        return True


def _new_hnsw(dim: int) -> object:
    # Importing onnxruntime (1.31) after usearch (2.26) segfaults the process; the other order is fine. The
    # embedder imports onnxruntime lazily, so make sure it is loaded before usearch whatever ran first.
    with contextlib.suppress(ImportError):
        import onnxruntime  # noqa: F401
    from usearch.index import Index  # start-up time: only namespaces past hnsw_at need it

    # int8 keeps 1M x 384 under ~0.5 GB; candidates are re-scored exactly from the stored float32 vectors.
    return Index(ndim=dim, metric="cos", dtype="i8", connectivity=16, expansion_add=64, expansion_search=64)
