"""Which cache slot holds which sequence, and how much of a new call's input it already holds.

Engines are called the TensorRT-LLM way: every call carries the sequence's full token ids, and
the engine reuses whatever prefix it has cached (KV cache reuse). A sequence is identified by
its request id; its slot remembers the tokens whose keys/values it holds. The next call's ids
reveal how many of them still hold: the common prefix is reused and everything after it is
overwritten.

Across requests (prefix caching): a released slot keeps its keys/values until a sequence takes
it, and a new sequence starts from the longest prefix of its input that a free slot holds (a
chat template's system prompt, an earlier turn of a conversation), among the slots released
under its own cache salt only: requests of different salts never reuse each other's prefixes
(nor learn by timing what others asked), and a benchmark gives each arm its own. Where that
slot holds more than the prefix (another prompt after a shared system prompt), the prefix is
copied into the free slot released longest ago, so that the other prompt stays for whoever asks
it next: taken in place, every slot would end up holding one chain of prompts, each overwriting
the last, and fewer prompt tokens reused (benchmarks/prefix_reuse.py counts them). A row's
keys and values depend only on the tokens before it (model.py), so a reused prefix holds exactly
what a new prefill would write.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


class CacheFullError(RuntimeError):
    """Every slot is held by a sequence in the current batch."""


@dataclass
class Slot:
    index: int
    key: str | None = None  # the sequence holding it; None when free
    # the tokens whose keys/values it holds (a free slot: what its last sequence left)
    tokens: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    salt: str = ""  # the cache salt of the sequence that wrote them
    last_used: float = 0.0


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class Acquired(NamedTuple):
    index: int  # the slot
    reuse: int  # leading input tokens whose keys/values the slot holds (after the copy)
    key: str  # the key under which the slot is now held
    copy_from: int | None = None  # the slot whose keys/values of those tokens to copy first


class SlotTable:
    def __init__(self, num_slots: int, share_prefixes: bool = True):
        """share_prefixes: a new sequence may reuse a released slot's prefix (see above)."""
        self.slots = [Slot(i) for i in range(num_slots)]
        self.share_prefixes = share_prefixes
        self.by_key: dict[str, Slot] = {}
        self._anonymous = itertools.count()
        self.evictions = 0
        self.shared_tokens = 0  # tokens new sequences reused from a prefix an ended one left

    def acquire(self, key: str, input_ids: np.ndarray, busy: set[int], salt: str = "") -> Acquired:
        """The slot for the sequence `key` ("" for a one-off call) and how much of the input it
        can reuse. The slot's tokens are cut to those: the call overwrites the rest, and a call
        that fails midway must leave no claim on positions it may have written."""
        if not key:
            key = f"\0anonymous-{next(self._anonymous)}"
        slot, source = self.by_key.get(key), None
        new = slot is None or slot.index in busy
        if new:
            if slot is not None:
                raise CacheFullError(f"sequence {key!r} appears twice in one batch")
            slot, source = self._take_slot(busy, input_ids, salt)
            slot.key, slot.salt = key, salt
            self.by_key[key] = slot
        slot.last_used = time.monotonic()
        # The last input token is always recomputed: its logits are the ones the call needs.
        reuse = min(common_prefix(slot.tokens, input_ids), len(input_ids) - 1)
        slot.tokens = slot.tokens[:reuse]
        self.shared_tokens += reuse if new else 0
        return Acquired(slot.index, reuse, key, source if reuse else None)

    def _take_slot(self, busy: set[int], input_ids: np.ndarray, salt: str) -> tuple[Slot, int | None]:
        """A slot for a new sequence, holding the longest prefix of its input there is, and the
        slot to copy that prefix from (None: it holds it already, or there is none)."""
        free = [s for s in self.slots if s.key is None and s.index not in busy]
        if not free:
            # Evict the least recently used sequence not in this batch: an abandoned sequence,
            # or one that will recompute its prefix if it comes back.
            candidates = [s for s in self.slots if s.index not in busy]
            if not candidates:
                raise CacheFullError(f"all {len(self.slots)} KV cache slots are in use by this batch")
            free = [min(candidates, key=lambda s: s.last_used)]
            self.evictions += 1
            self._free(free[0])

        def shared(s: Slot) -> int:
            return common_prefix(s.tokens, input_ids) if self.share_prefixes and s.salt == salt else 0

        oldest = min(free, key=lambda s: s.last_used)  # released longest ago: the least likely asked again
        best = max(free, key=lambda s: (shared(s), -s.last_used))
        length = shared(best)
        if best is oldest or length == len(best.tokens):  # nothing of it lost in place
            best.tokens = best.tokens[:length]
            return best, None
        oldest.tokens = best.tokens[:length]
        return oldest, (best.index if length else None)

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
        """Free the slot; its tokens stay for a later sequence that starts with them."""
        if slot.key is not None:
            self.by_key.pop(slot.key, None)
        slot.key = None
        slot.last_used = time.monotonic()

    @property
    def in_use(self) -> int:
        return sum(s.key is not None for s in self.slots)
