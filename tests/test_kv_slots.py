from __future__ import annotations

import numpy as np
import pytest

from specdec.engine.kv_slots import CacheFullError, SlotTable, common_prefix


def ids(*t):
    return np.array(t, dtype=np.int64)


def test_common_prefix():
    assert common_prefix(ids(1, 2, 3), ids(1, 2, 4, 5)) == 2
    assert common_prefix(ids(), ids(1)) == 0
    assert common_prefix(ids(1, 2), ids(1, 2)) == 2


def test_reuse_the_verified_prefix_and_drop_rejected_drafts():
    table = SlotTable(2)
    slot, reuse, _ = table.acquire("a", ids(1, 2, 3), set())
    assert reuse == 0
    table.record(slot, ids(1, 2, 3, 7, 8))  # context + two drafts were written
    slot2, reuse, _ = table.acquire("a", ids(1, 2, 3, 7, 9), set())  # 7 accepted, 8 rejected
    assert slot2 == slot and reuse == 4


def test_the_last_input_token_is_always_recomputed():
    table = SlotTable(1)
    slot, _, _ = table.acquire("a", ids(1, 2), set())
    table.record(slot, ids(1, 2))
    assert table.acquire("a", ids(1, 2), set())[1] == 1


def test_release_and_eviction():
    table = SlotTable(2)
    table.acquire("a", ids(1), set())
    b, _, _ = table.acquire("b", ids(1), set())
    assert table.in_use == 2
    assert table.release("a") and table.in_use == 1 and not table.release("a")
    table.acquire("c", ids(1), set())  # takes a's free slot
    d, _, _ = table.acquire("d", ids(1), {b})  # full: evicts the LRU slot not in this batch
    assert table.evictions == 1 and d != b


def test_full_batch_raises():
    table = SlotTable(1)
    s, _, _ = table.acquire("a", ids(1), set())
    with pytest.raises(CacheFullError):
        table.acquire("b", ids(1), {s})
    with pytest.raises(CacheFullError):
        table.acquire("a", ids(1), {s})  # the same sequence twice in one batch


def test_anonymous_calls_get_a_fresh_slot():
    table = SlotTable(2)
    s1, _, k1 = table.acquire("", ids(1, 2), set())
    s2, _, k2 = table.acquire("", ids(1, 2), {s1})
    assert k1 != k2 and s1 != s2
