import subprocess
import sys

import numpy as np
import pytest

from tiergate.cache.index import VectorIndex

DIM = 32


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    basis = rng.standard_normal((8, DIM)).astype(np.float32)  # low rank, like real embeddings
    x = rng.standard_normal((n, 8)).astype(np.float32) @ basis
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_search_finds_the_nearest_in_its_namespace_only() -> None:
    idx = VectorIndex(DIM)
    v = unit(np.random.default_rng(0), 3)
    idx.upsert("a-1", "ns1", "a", v[0], expires_at=2e9)
    idx.upsert("b-1", "ns2", "b", v[0], expires_at=2e9)  # same vector, another namespace
    idx.upsert("a-2", "ns1", "a", v[1], expires_at=2e9)
    got = idx.search("ns1", v[0], 4)
    assert next(eid for eid, _ in got) == "a-1" and pytest.approx(got[0][1], abs=1e-5) == 1.0
    assert {eid for eid, _ in got} == {"a-1", "a-2"}
    assert idx.search("ns3", v[0], 4) == []


def test_upsert_replaces_and_remove_forgets() -> None:
    idx = VectorIndex(DIM)
    v = unit(np.random.default_rng(1), 2)
    idx.upsert("a-1", "ns", "a", v[0], expires_at=2e9)
    idx.upsert("a-1", "ns", "a", v[1], expires_at=2e9)
    assert len(idx) == 1 and idx.search("ns", v[1], 1)[0][0] == "a-1"
    assert idx.remove("a-1") and not idx.remove("a-1")
    assert len(idx) == 0 and idx.search("ns", v[1], 1) == []


def test_expired_entries_are_not_returned_and_get_swept() -> None:
    idx = VectorIndex(DIM)
    v = unit(np.random.default_rng(2), 2)
    idx.upsert("a-old", "ns", "a", v[0], expires_at=100.0)
    idx.upsert("a-new", "ns", "a", v[1], expires_at=300.0)
    assert [e for e, _ in idx.search("ns", v[0], 2, now=200.0)] == ["a-new"]
    assert idx.expire(now=200.0) == 1 and "a-old" not in idx and "a-new" in idx


def test_remove_tenant_and_clear() -> None:
    idx = VectorIndex(DIM)
    v = unit(np.random.default_rng(3), 4)
    for i, tag in enumerate(["t1", "t1", "t2", "t2"]):
        idx.upsert(f"{tag}-{i}", f"ns-{tag}", tag, v[i], expires_at=2e9)
    assert idx.remove_tenant("t1") == 2 and len(idx) == 2
    idx.clear()
    assert len(idx) == 0


def test_large_namespaces_move_to_hnsw_and_stay_searchable() -> None:
    rng = np.random.default_rng(4)
    n = 1000
    v = unit(rng, n)
    idx = VectorIndex(DIM, hnsw_at=300)
    ids = [f"t-{i}" for i in range(n)]
    idx.upsert_many(ids, ["ns"] * n, ["t"] * n, v, [2e9] * n)
    moved = idx.maintain()
    assert moved >= n - 300  # most rows now live in the graph
    found = sum(ids[i] in [e for e, _ in idx.search("ns", v[i], 4)] for i in range(0, n, 10))
    assert found >= 95  # HNSW is approximate; on low-rank data it finds (almost) all
    assert idx.remove("t-0") and all(e != "t-0" for e, _ in idx.search("ns", v[0], 4))
    idx.upsert("t-new", "ns", "t", v[0], expires_at=2e9)  # new rows are searchable before any flush
    assert idx.search("ns", v[0], 1)[0][0] == "t-new"


def test_wrong_dimension_is_refused() -> None:
    with pytest.raises(ValueError):
        VectorIndex(DIM).upsert("x-1", "ns", "x", np.ones(DIM + 1), expires_at=2e9)


def test_onnxruntime_still_imports_after_an_hnsw_graph_was_built() -> None:
    # usearch loaded before onnxruntime used to crash the process at onnxruntime's import.
    code = (
        "import numpy as np\n"
        "from tiergate.cache.index import VectorIndex\n"
        "idx = VectorIndex(8, hnsw_at=10)\n"
        "v = np.random.default_rng(0).standard_normal((300, 8)).astype(np.float32)\n"
        "v /= np.linalg.norm(v, axis=1, keepdims=True)\n"
        "idx.upsert_many([f't-{i}' for i in range(300)], ['ns'] * 300, ['t'] * 300, v, [2e9] * 300)\n"
        "assert idx.maintain() > 0\n"
        "import onnxruntime\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_flat_buffer_is_given_back_after_a_flush() -> None:
    rng = np.random.default_rng(5)
    v = unit(rng, 2000)
    idx = VectorIndex(DIM, hnsw_at=100)
    idx.upsert_many([f"t-{i}" for i in range(2000)], ["ns"] * 2000, ["t"] * 2000, v, [2e9] * 2000)
    space = idx._spaces["ns"]
    assert len(space.labels) >= 2000
    idx.maintain()
    assert space.n < 128 and len(space.labels) <= max(2 * space.n, 16)
    assert idx.search("ns", v[1999], 4)[0][0] == "t-1999"
