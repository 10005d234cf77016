"""One pending change of the node's LoRA adapter, applied by the decode thread once no slot is busy.

llama.cpp applies an adapter to the whole context, so a swap waits for the requests in the slots to finish (each
is answered by one adapter from its first token to its last), then forgets every slot's KV: a prefix computed under
the old adapter must not be reused under the new one.

Tested in `tests/edge_node/server/test_adapter.py`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from tiergate.edge_node.engine.runtime import LlamaRuntime, ModelLoadError
from tiergate.edge_node.engine.slots import SlotTable

__all__ = ["LoraSwap"]

log = structlog.get_logger("edge_node.engine")


@dataclass(slots=True)
class LoraSwap:
    path: Path | None  # None: the plain model
    done: threading.Event = field(default_factory=threading.Event)
    error: ModelLoadError | None = None

    def apply(self, rt: LlamaRuntime, slots: SlotTable) -> None:
        """Decode thread, no slot busy: swap, forget the KV; a refused adapter leaves the current one serving."""
        try:
            rt.set_lora(self.path)
            for slot in slots.slots:
                slots.reset(slot)
            log.info("lora adapter swapped", lora=str(self.path) if self.path else None)
        except ModelLoadError as exc:
            self.error = exc
        finally:
            self.done.set()

    def wait(self, alive: Callable[[], bool]) -> bool:
        """Block until applied (True) or the engine has died (False); raises the adapter's refusal."""
        while not self.done.wait(0.5):
            if not alive():
                return False
        if self.error is not None:
            raise self.error
        return True
