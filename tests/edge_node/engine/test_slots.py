"""Which slot a request gets (edge_node.engine.slots.SlotTable.prepare), with a stand-in for llama.cpp's memory calls."""

from __future__ import annotations

from types import SimpleNamespace

from tiergate.edge_node.engine.slots import SlotTable


class _Memory:
    def memory_seq_rm(self, mem, seq, p0, p1) -> bool:
        return True

    def memory_seq_cp(self, mem, src, dst, p0, p1) -> None:
        return None


def _table(n: int, kv_unified: bool = False) -> SlotTable:
    rt = SimpleNamespace(n_seq_max=n, fast=_Memory(), memory=object(), cfg=SimpleNamespace(kv_unified=kv_unified))
    return SlotTable(rt)  # type: ignore[arg-type]


def _admit(table: SlotTable, prompt: list[int]) -> int:
    req = SimpleNamespace(prompt=prompt, n_prompt_done=0, cached=0, slot=None, admitted_at=None, sampler=None)
    slot = table.prepare(req, table.free())  # type: ignore[arg-type]
    table.occupy(slot, req)  # type: ignore[arg-type]
    return slot.seq


def test_busy_slots_stay_consecutive_so_llama_cpp_decodes_them_together() -> None:
    """With a KV stream per slot, llama.cpp batches only consecutive sequence ids: requests fill holes and
    extend the busy run instead of scattering over never-used slots."""
    table = _table(16)
    for s in table.slots[8:]:
        s.tokens = [9] * 3  # cached earlier: the old rule picked the empty slots 0-7 first, then these
    table.slots[5].tokens = [7] * 40
    seqs = [_admit(table, [100 + i, 1, 2, 3]) for i in range(4)]
    assert sorted(seqs) == list(range(seqs[0], seqs[0] + 4))  # one run
    first = table.slots[seqs[1]]
    table.release(first.request)  # a hole in the middle
    assert _admit(table, [200, 1, 2, 3]) == seqs[1]  # filled first


def test_a_shared_prefix_still_wins_over_keeping_runs_compact() -> None:
    table = _table(8)
    table.slots[6].tokens = list(range(40))
    assert _admit(table, [1000, 1]) == 0
    assert _admit(table, list(range(30)) + [5000]) == 6  # 30 cached tokens beat adjacency to slot 0


def test_one_kv_buffer_keeps_the_least_cached_rule() -> None:
    table = _table(4, kv_unified=True)
    table.slots[1].tokens = [1] * 10
    table.slots[2].tokens = [1] * 2
    table.slots[3].tokens = [1] * 5
    assert _admit(table, [7, 7]) == 0  # empty first
    assert _admit(table, [8, 8]) == 2  # then least cached, adjacency plays no part


def test_the_shared_template_prefix_is_copied_into_each_slot_of_a_burst() -> None:
    """One request ran; then a burst shares its first 24 tokens (chat template, system prompt). Each new slot
    gets them by copy from the busy one instead of prefilling them again (they were not copied below 32)."""
    table = _table(8)
    shared = list(range(24))
    first = _admit(table, [*shared, 500, 501])
    table.slots[first].tokens = [*shared, 500, 501, 502]  # prefilled and generating
    reqs = []
    for i in range(3):
        req = SimpleNamespace(prompt=[*shared, 600 + i, 1], n_prompt_done=0, cached=0, slot=None, admitted_at=None,
                              sampler=None)
        slot = table.prepare(req, table.free())  # type: ignore[arg-type]
        table.occupy(slot, req)  # type: ignore[arg-type]
        reqs.append(req)
    assert [r.cached for r in reqs] == [24, 24, 24]
