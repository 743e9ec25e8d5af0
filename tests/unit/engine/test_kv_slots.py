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
    slot, reuse, *_ = table.acquire("a", ids(1, 2, 3), set())
    assert reuse == 0
    table.record(slot, ids(1, 2, 3, 7, 8))  # context + two drafts were written
    slot2, reuse, *_ = table.acquire("a", ids(1, 2, 3, 7, 9), set())  # 7 accepted, 8 rejected
    assert slot2 == slot and reuse == 4


def test_the_last_input_token_is_always_recomputed():
    table = SlotTable(1)
    slot, *_ = table.acquire("a", ids(1, 2), set())
    table.record(slot, ids(1, 2))
    assert table.acquire("a", ids(1, 2), set())[1] == 1


def test_release_and_eviction():
    table = SlotTable(2)
    table.acquire("a", ids(1), set())
    b, *_ = table.acquire("b", ids(1), set())
    assert table.in_use == 2
    assert table.release("a") and table.in_use == 1 and not table.release("a")
    table.acquire("c", ids(1), set())  # takes a's free slot
    d, *_ = table.acquire("d", ids(1), {b})  # full: evicts the LRU slot not in this batch
    assert table.evictions == 1 and d != b


def test_full_batch_raises():
    table = SlotTable(1)
    s, *_ = table.acquire("a", ids(1), set())
    with pytest.raises(CacheFullError):
        table.acquire("b", ids(1), {s})
    with pytest.raises(CacheFullError):
        table.acquire("a", ids(1), {s})  # the same sequence twice in one batch


def test_anonymous_calls_get_a_fresh_slot():
    table = SlotTable(2)
    s1, _, k1, _ = table.acquire("", ids(1, 2), set())
    s2, _, k2, _ = table.acquire("", ids(1, 2), {s1})
    assert k1 != k2 and s1 != s2


# --- across requests: a released slot's prefix, for a new sequence of the same cache salt ---------
def test_a_new_sequence_starts_from_the_longest_prefix_a_free_slot_holds():
    """Copied into the slot released longest ago, so that what else the slot holds stays."""
    table = SlotTable(3)
    for key, tokens in (("a", ids(1, 2, 9)), ("b", ids(1, 2, 3, 4, 5)), ("c", ids(7))):
        slot, *_ = table.acquire(key, tokens, set())
        table.record(slot, tokens)
    a_slot, b_slot = table.by_key["a"].index, table.by_key["b"].index
    for key in "abc":
        table.release(key)
    got = table.acquire("d", ids(1, 2, 3, 4, 8, 8), set())
    assert (got.index, got.reuse, got.copy_from, table.shared_tokens) == (a_slot, 4, b_slot, 4)
    assert table.slots[a_slot].tokens.tolist() == [1, 2, 3, 4]
    assert table.slots[b_slot].tokens.tolist() == [1, 2, 3, 4, 5]  # kept for the next one


def test_a_conversation_goes_on_in_its_own_slot():
    """A slot whose tokens are all a prefix of the input loses nothing taken in place."""
    table = SlotTable(2)
    slot, *_ = table.acquire("turn 1", ids(1, 2, 3), set())
    table.record(slot, ids(1, 2, 3))
    table.release("turn 1")
    got = table.acquire("turn 2", ids(1, 2, 3, 4, 5), set())
    assert (got.index, got.reuse, got.copy_from) == (slot, 3, None)


def test_held_out_prompts_reuse_every_prefix_they_share():
    """Prompts of two tasks taking turns after one system prompt: each finds its own task's
    instructions, which a slot taken in place would have overwritten with the other task's."""
    system, tasks = [1, 2, 3], ([10, 11, 12], [20, 21, 22])
    table = SlotTable(4)
    reused = []
    for i in range(6):
        prompt = ids(*system, *tasks[i % 2], 100 + i)
        got = table.acquire(f"r{i}", prompt, set())
        table.record(got.index, prompt)
        table.release(f"r{i}")
        reused.append(got.reuse)
    assert reused == [0, 3, 6, 6, 6, 6]


def test_prefixes_are_shared_only_within_a_cache_salt():
    table = SlotTable(1)
    slot, *_ = table.acquire("a", ids(1, 2, 3), set(), salt="tenant 1")
    table.record(slot, ids(1, 2, 3))
    table.release("a")
    assert table.acquire("b", ids(1, 2, 3, 4), set(), salt="tenant 2")[1] == 0
    table.record(slot, ids(1, 2, 3, 4))
    table.release("b")
    assert table.acquire("c", ids(1, 2, 3, 4, 5), set(), salt="tenant 1")[1] == 0  # tenant 2 overwrote it
    off = SlotTable(1, share_prefixes=False)
    slot, *_ = off.acquire("a", ids(1, 2, 3), set())
    off.record(slot, ids(1, 2, 3))
    off.release("a")
    assert off.acquire("b", ids(1, 2, 3, 4), set())[1] == 0


def test_without_a_shared_prefix_the_slot_released_longest_ago_is_taken():
    table = SlotTable(2)
    for key, tokens in (("a", ids(1, 2)), ("b", ids(3, 4))):
        slot, *_ = table.acquire(key, tokens, set())
        table.record(slot, tokens)
    a_slot = table.by_key["a"].index
    table.release("a")
    table.release("b")
    assert table.acquire("c", ids(5, 6), set())[:2] == (a_slot, 0)


def test_a_call_claims_only_the_prefix_it_reused():
    """A call that fails midway may have written positions past its reused prefix: the slot must
    not claim the tokens that were there."""
    table = SlotTable(1)
    slot, *_ = table.acquire("a", ids(1, 2, 3, 4), set())
    table.record(slot, ids(1, 2, 3, 4))
    table.acquire("a", ids(1, 2, 9, 9), set())  # ... and the forward fails: no record()
    assert table.acquire("a", ids(1, 2, 3, 4, 5), set())[1] == 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_prefix_an_ended_request_left_gives_the_bits_of_a_new_prefill(tiny_target, dtype):
    from specdec.engine.engine import Engine, GenerationRequest
    from specdec.engine.ops import bf16_unsupported

    if dtype == "bfloat16" and (why := bf16_unsupported()):
        pytest.skip(why)
    shared = np.arange(40) % 90 + 3  # a system prompt: past a 32-position block of values
    first, second = np.concatenate([shared, [5, 6]]), np.concatenate([shared, [7, 8, 9]])

    def run(engine: Engine, prompt: np.ndarray, key: str, salt: str = ""):
        (result,) = engine.generate([GenerationRequest(prompt, 4, sequence_key=key, cache_salt=salt,
                                                       return_logits=True)])  # fmt: skip
        engine.release(key)
        return result

    engine = Engine(tiny_target, dtype=dtype, kv_slots=2, max_seq_len=128)
    run(engine, first, "a")
    reused = run(engine, second, "b")
    salted = run(engine, second, "c", salt="another tenant")
    alone = run(Engine(tiny_target, dtype=dtype, kv_slots=2, max_seq_len=128, kv_cache_reuse=False), second, "d")
    assert (reused.reused, salted.reused, alone.reused) == (len(shared), 0, 0)
    for result in (reused, salted):
        assert result.tokens.tolist() == alone.tokens.tolist()
        np.testing.assert_array_equal(result.logits, alone.logits)
