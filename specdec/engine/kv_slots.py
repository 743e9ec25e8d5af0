"""Which cache slot holds which sequence, and how much of a new call's input it already holds.

Engines are called the TensorRT-LLM way: every call carries the sequence's full token ids, and
the engine reuses whatever prefix it has cached (KV cache reuse). A sequence is identified by
its request id; its slot remembers the tokens whose keys/values it holds, including draft tokens
that a verification wrote and the target then rejected. The next call's ids reveal how many of
them were right: the common prefix is reused and everything after it is overwritten.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np


class CacheFullError(RuntimeError):
    """Every slot is held by a sequence in the current batch."""


@dataclass
class Slot:
    index: int
    key: str | None = None  # the sequence holding it; None when free
    tokens: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    last_used: float = 0.0


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class SlotTable:
    def __init__(self, num_slots: int):
        self.slots = [Slot(i) for i in range(num_slots)]
        self.by_key: dict[str, Slot] = {}
        self._anonymous = itertools.count()
        self.evictions = 0

    def acquire(self, key: str, input_ids: np.ndarray, busy: set[int]) -> tuple[int, int, str]:
        """Slot for the sequence `key` ("" for a one-off call), the number of leading input
        tokens whose cache can be reused, and the key under which the slot is now held."""
        if not key:
            key = f"\0anonymous-{next(self._anonymous)}"
        slot = self.by_key.get(key)
        if slot is None or slot.index in busy:
            if slot is not None:
                raise CacheFullError(f"sequence {key!r} appears twice in one batch")
            slot = self._take_slot(busy)
            slot.key = key
            slot.tokens = np.empty(0, dtype=np.int64)
            self.by_key[key] = slot
        slot.last_used = time.monotonic()
        # The last input token is always recomputed: its logits are the ones the call needs.
        reuse = min(common_prefix(slot.tokens, input_ids), len(input_ids) - 1)
        return slot.index, reuse, key

    def _take_slot(self, busy: set[int]) -> Slot:
        free = [s for s in self.slots if s.key is None]
        if free:
            return free[0]
        # Evict the least recently used sequence not in this batch: an abandoned sequence, or
        # one that will recompute its prefix if it comes back.
        candidates = [s for s in self.slots if s.index not in busy]
        if not candidates:
            raise CacheFullError(f"all {len(self.slots)} KV cache slots are in use by this batch")
        victim = min(candidates, key=lambda s: s.last_used)
        self.evictions += 1
        self._free(victim)
        return victim

    def record(self, index: int, tokens: np.ndarray) -> None:
        """The slot now holds keys/values for exactly these tokens."""
        self.slots[index].tokens = tokens

    def release(self, key: str) -> bool:
        slot = self.by_key.get(key)
        if slot is None:
            return False
        self._free(slot)
        return True

    def _free(self, slot: Slot) -> None:
        if slot.key is not None:
            self.by_key.pop(slot.key, None)
        slot.key = None
        slot.tokens = np.empty(0, dtype=np.int64)

    @property
    def in_use(self) -> int:
        return sum(s.key is not None for s in self.slots)
