"""Token bytes → text deltas that are safe to stream.

Two things must be held back before text can go to a client: bytes of a UTF-8 character split over
several tokens (byte-level BPE does that for anything outside ASCII), and a tail that might be the
beginning of a stop string (if it completes, it must never have been sent). Everything else is
released at once, so streaming stays token by token.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

__all__ = ["TextStream"]


class TextStream:
    """Feed token bytes, get (text to emit, stop string hit)."""

    __slots__ = ("_decoder", "_pending", "_stops", "_text_len", "stopped")

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._stops = tuple(s for s in stop if s)
        self._text_len = 0
        self.stopped = False

    @property
    def emitted_chars(self) -> int:
        return self._text_len

    def feed(self, data: bytes) -> str:
        """Add one token's bytes; return text that can be sent now. Sets `stopped` on a stop string."""
        if self.stopped:
            return ""
        text = self._decoder.decode(data)
        if not text:
            return ""
        if not self._stops:
            self._text_len += len(text)
            return text
        pending = self._pending + text
        cut = -1
        for s in self._stops:
            i = pending.find(s)
            if i != -1 and (cut == -1 or i < cut):
                cut = i
        if cut != -1:
            self.stopped = True
            self._pending = ""
            out = pending[:cut]
        else:
            hold = self._stop_prefix_len(pending)
            out = pending[: len(pending) - hold]
            self._pending = pending[len(pending) - hold :]
        self._text_len += len(out)
        return out

    def flush(self) -> str:
        """End of generation: release held text (a stop-string prefix that never completed, bad bytes as U+FFFD)."""
        if self.stopped:
            return ""
        out = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        self._text_len += len(out)
        return out

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        best = 0
        for s in self._stops:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best
