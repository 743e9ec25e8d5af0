"""The CPU kernels: right answers, and a row's result independent of the rest of the batch.

Bitwise row invariance is what makes speculation exact on CPU: a token verified inside a k-row
forward must get the same logits as the same token decoded alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from support.models import BF16_OPS_PARAMS, needs_amx, write_tiny_llama

import specdec.engine
from specdec.engine import KERNEL_SOURCES, amx, kernel_cache_dir, kernels
from specdec.engine.model import Llama, resolve_dtype
from specdec.engine.ops import CpuAvx512Bf16Ops, CpuBf16Ops, CpuOps, TorchOps


@pytest.fixture(scope="module")
def data():
    g = np.random.default_rng(0)
    return {
        "x": g.standard_normal((80, 96), dtype=np.float32),
        "w": g.standard_normal((192, 96), dtype=np.float32),
    }


def _rows_alone(fn, x: np.ndarray) -> np.ndarray:
    return np.concatenate([fn(x[i : i + 1]) for i in range(len(x))])


def _product(x: np.ndarray, w: np.ndarray, out: np.ndarray, accumulate: bool) -> np.ndarray:
    kernels.matmul(np.ascontiguousarray(x), kernels.pack_weight(w), out, accumulate)
    return out


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 14, 15, 17, 80])
def test_linear_rows_are_bitwise_independent_of_the_batch(data, rows):
    def linear(x):
        return _product(x, data["w"], np.empty((len(x), len(data["w"])), np.float32), False)

    x = data["x"][:rows]
    together = linear(x)
    assert np.array_equal(together, _rows_alone(linear, x))
    np.testing.assert_allclose(together, x @ data["w"].T, rtol=1e-4, atol=1e-4)


def test_linear_sums_each_dot_product_in_order_with_fused_multiply_adds(data):
    x, w = data["x"][:5], data["w"][:64]
    expected = np.zeros((5, 64), np.float32)
    # float64 holds each float32 product exactly; its sum, rounded to float32, is what fma gives
    # (barring a double-rounding tie, which this data does not hit)
    for k in range(x.shape[1]):
        expected = (
            expected.astype(np.float64) + x[:, k : k + 1].astype(np.float64) * w[:, k].astype(np.float64)
        ).astype(np.float32)
    assert np.array_equal(_product(x, w, np.empty((5, 64), np.float32), False), expected)


def test_accumulate_adds_the_product(data):
    x, w = data["x"][:6], data["w"]
    res = _product(x, w, np.ones((6, len(w)), np.float32), True)
    np.testing.assert_allclose(res, 1 + x @ w.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("accumulate", [False, True])
def test_a_last_partial_tile_computes_the_same_as_a_whole_one(data, accumulate):
    x, w = data["x"][:11], data["w"]  # 192 rows: whole tiles (of 32 or 16); 70: a last partial one
    whole = _product(x, w, np.ones((11, 192), np.float32), accumulate)
    partial = _product(x, w[:70], np.ones((11, 70), np.float32), accumulate)
    assert np.array_equal(partial, whole[:, :70])
    assert kernels.pack_weight(w[:70]).shape == (-(-70 // kernels.TILE), w.shape[1], kernels.TILE)


def test_exp_is_within_a_few_ulp_of_exp_and_stays_finite():
    x = np.concatenate([np.linspace(-100, 100, 20001, dtype=np.float32), np.float32([0, -87, 88, -1e30, 1e30])])
    got = np.array([kernels._exp(v) for v in x], dtype=np.float32)
    normal = (x >= -87) & (x <= 88)
    want = np.exp(x[normal].astype(np.float64))
    assert np.max(np.abs(got[normal] - want) / want) < 5e-7
    assert kernels._exp(np.float32(0)) == 1.0
    assert np.isnan(kernels._exp(np.float32("nan")))  # a NaN shows, as with np.exp
    assert np.all(np.isfinite(got)) and np.all(got > 0)  # held to the normal range outside it
    assert np.all(got[x < -87] <= np.exp(np.float32(-86.9))) and np.all(got[x > 88] >= np.exp(np.float32(87.9)))


def test_the_kernels_cache_moves_when_any_kernel_source_changes(tmp_path):
    """amx.py's cached kernels hold kernels.py's code: a change to either must not find the old cache."""
    package = Path(specdec.engine.__file__).parent
    for source in KERNEL_SOURCES:
        (tmp_path / source).write_bytes((package / source).read_bytes())
    assert kernel_cache_dir(tmp_path) == tmp_path / "__pycache__" / kernel_cache_dir(package).name
    for source in KERNEL_SOURCES:
        before = kernel_cache_dir(tmp_path)
        with open(tmp_path / source, "a") as f:
            f.write("\n")
        assert kernel_cache_dir(tmp_path) != before, source


def test_exp_of_a_nonpositive_number_is_exp_bit_for_bit():
    x = np.concatenate([-np.geomspace(1e-30, 1e30, 20001, dtype=np.float32), np.float32([0, -0.0, -87, -87.5])])
    got = np.array([kernels.exp_nonpositive(v) for v in x], dtype=np.float32)
    assert np.array_equal(got, np.array([kernels._exp(v) for v in x], dtype=np.float32))


@pytest.mark.parametrize("n", [1, 7, 8, 33, 351])
def test_row_max_is_the_maximum_of_the_row_prefix(rng, n):
    row = (rng.standard_normal(400) * 10).astype(np.float32)
    for values in (row, -np.abs(row), np.abs(row), np.float32([-0.0, 0.0] * 200), np.full(400, -np.inf, np.float32)):
        got = kernels.row_max(values, n)
        assert np.float32(got) == values[:n].max()


def test_swiglu_is_silu_of_the_gate_times_up(data):
    gate_up = data["x"][:7, :96] * 4  # gates well into both tails of the sigmoid
    out = np.empty((7, 48), np.float32)
    kernels.swiglu(gate_up, out)
    ref = torch.nn.functional.silu(torch.from_numpy(gate_up[:, :48])) * torch.from_numpy(gate_up[:, 48:])
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows", [1, 4, 33])
def test_rmsnorm_rows_independent_and_correct(data, rows):
    weight = np.linspace(0.5, 1.5, 96, dtype=np.float32)

    def norm(x):
        out = np.empty_like(x)
        kernels.rmsnorm(x, weight, 1e-5, out)
        return out

    x = data["x"][:rows]
    together = norm(x)
    assert np.array_equal(together, _rows_alone(norm, x))
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * weight
    np.testing.assert_allclose(together, ref, rtol=1e-5, atol=1e-5)


def _attention(q, keys, values, slots, positions):
    """kernels.attention over caches given as (S, G, T, Dh), the keys re-laid in its tiles."""
    s, g, t, dh = keys.shape
    tiles = np.ascontiguousarray(keys.reshape(s, g, t // kernels.TILE, kernels.TILE, dh).transpose(0, 1, 2, 4, 3))
    out = np.empty((len(q), q.shape[1] * dh), np.float32)
    kernels.attention(q, tiles, values, np.asarray(slots), np.asarray(positions), out)
    return out


@pytest.mark.parametrize("head_dim", [kernels.LANES, 3 * kernels.LANES, 64])
def test_attention_rows_are_bitwise_independent_of_the_batch_and_correct(head_dim):
    """A prefill spanning several key tiles, a 9-row verification and a decode row in one call:
    each row the same bits as alone, and softmax(q k / sqrt(Dh)) v over its own positions."""
    g = np.random.default_rng(1)
    n_slots, n_kv, n_heads, length = 3, 2, 6, 128
    keys, values = (g.standard_normal((n_slots, n_kv, length, head_dim), dtype=np.float32) for _ in range(2))
    slots = np.array([0] * 70 + [1] * 9 + [2])
    positions = np.array([*range(70), *range(40, 49), 100])
    q = g.standard_normal((len(slots), n_heads, head_dim), dtype=np.float32) * 2
    together = _attention(q, keys, values, slots, positions)
    alone = np.concatenate([_attention(q[i : i + 1], keys, values, slots[i : i + 1], positions[i : i + 1])
                            for i in range(len(q))])  # fmt: skip
    assert np.array_equal(together, alone)
    verification = slice(70, 79)  # alone in a call, its run splits in two blocks
    assert np.array_equal(_attention(q[verification], keys, values, slots[verification], positions[verification]),
                          together[verification])  # fmt: skip
    want = np.empty((len(q), n_heads, head_dim))
    for m, (s, pos) in enumerate(zip(slots, positions, strict=True)):
        for h in range(n_heads):
            kv = h // (n_heads // n_kv)
            scores = keys[s, kv, : pos + 1].astype(np.float64) @ q[m, h] / np.sqrt(head_dim)
            p = np.exp(scores - scores.max())
            want[m, h] = p / p.sum() @ values[s, kv, : pos + 1]
    np.testing.assert_allclose(together, want.reshape(len(q), -1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ops", [CpuOps, *BF16_OPS_PARAMS])
def test_a_new_cache_is_zeros(tiny_target, ops):
    """Positions never written hold no NaN for a product to multiply by a probability of 0."""
    cache = Llama(tiny_target, ops=ops()).new_cache(2, 64)
    assert not cache.k.float().any() and not cache.v.float().any()


@pytest.mark.parametrize("ops", [CpuOps, *BF16_OPS_PARAMS])
def test_weights_and_cache_start_on_a_cache_line(tiny_target, ops):
    """A tile's row or a vector off a 64-byte line touches two (kernels.line_aligned)."""
    model = Llama(tiny_target, ops=ops())
    cache = model.new_cache(2, 64)
    packed = [w.tiles for w in vars(model.layers).values() if hasattr(w, "tiles")] + [model.lm_head.tiles]
    assert packed and all(t.data_ptr() % kernels.CACHE_LINE == 0 for t in (*packed, cache.k, cache.v))


@pytest.mark.parametrize("ops", [CpuOps, *BF16_OPS_PARAMS])
def test_forward_rows_match_one_token_decoding_bit_for_bit(tiny_target, ops):
    """Prefill + a k-row verification in one call, mixed with another sequence, gives the same
    logits as decoding each token alone: the property greedy exactness stands on."""
    model = Llama(tiny_target, ops=ops())
    tokens = torch.randint(0, 96, (45,), generator=torch.Generator().manual_seed(0))  # past a tile of keys
    n = len(tokens)

    alone = model.new_cache(2, 64)
    one_by_one = torch.stack(
        [
            model.forward(alone, tokens[i : i + 1], torch.tensor([i]), torch.tensor([0]), torch.tensor([0]))[0]
            for i in range(n)
        ]
    )

    batched = model.new_cache(3, 64)
    other = torch.tensor([7, 7, 7, 7], dtype=torch.int64)  # another sequence in the same forward
    rows = torch.cat([tokens[:36], other, tokens[36:]])
    positions = torch.cat([torch.arange(36), torch.arange(4), torch.arange(36, n)])
    slots = torch.tensor([1] * 36 + [2] * 4 + [1] * (n - 36))
    want = torch.tensor([*range(36), *range(40, 40 + n - 36)])
    together = model.forward(batched, rows, positions, slots, want)
    assert torch.equal(together, one_by_one)


def _prompt_logits(model: Llama) -> torch.Tensor:
    """The logits of every position of an 8-token prompt."""
    tokens = torch.tensor([3, 14, 15, 92, 65, 35, 89, 79], dtype=torch.int64)
    args = (tokens, torch.arange(8), torch.zeros(8, dtype=torch.int64), torch.arange(8))
    return model.forward(model.new_cache(1, 32), *args)


def test_cpu_kernels_agree_with_the_torch_implementation(tiny_target):
    """Two independent implementations of the same forward (numba on CPU, torch for CUDA)."""
    cpu = Llama(tiny_target)
    assert isinstance(cpu.ops, CpuOps)
    torch.testing.assert_close(_prompt_logits(cpu), _prompt_logits(Llama(tiny_target, ops=TorchOps())),
                               rtol=1e-4, atol=1e-4)  # fmt: skip


@pytest.mark.parametrize(("n", "k"), [(960, 576), (576, 1536), (40, 50)])  # SmolLM2's q/k/v and down; padded
@pytest.mark.parametrize("bf16_ops", BF16_OPS_PARAMS)
def test_bf16_products_rows_are_bitwise_independent_of_the_batch(n, k, bf16_ops):
    """The bf16 products (AMX tiles; AVX-512 BF16 pairs): each row the same bits whatever shares
    its tiles, and the float32 sums of the bf16-rounded terms (a shape that fills no tile, too)."""
    ops = bf16_ops()
    g = torch.Generator().manual_seed(0)
    matrix = torch.randn(n, k, generator=g) / k**0.5
    w = ops.weight(matrix)
    x = torch.randn(300, k, generator=g)
    alone = torch.cat([ops.linear(row, w) for row in x.split(1)])
    for m in (1, 5, 9, 12, 14, 16, 17, 64, 130, 300):
        assert torch.equal(ops.linear(x[:m], w), alone[:m]), m
    bf16 = x.bfloat16().double() @ matrix.bfloat16().double().T  # the exact sums of the rounded terms
    torch.testing.assert_close(alone.double(), bf16, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("n", "k"), [(49152, 576), (1000, 64), (33, 40)])  # SmolLM2's lm_head; padded
@pytest.mark.parametrize("ops", [CpuOps, TorchOps, *BF16_OPS_PARAMS])
def test_linear_argmax_is_the_first_maximum_of_each_row_of_linear(n, k, ops):
    """linear_argmax (on AMX tiles without the product written out) is np.argmax of linear():
    ties go to the first column, across the kernel's tiles and spans of groups too, and a NaN
    counts as the maximum."""
    ops = ops()
    g = torch.Generator().manual_seed(1)
    matrix = torch.randn(n, k, generator=g) / k**0.5
    matrix[n - 1] = matrix[n // 2] = matrix[3]  # equal rows: equal logits in columns 3, n/2 and n - 1
    w = ops.weight(matrix)
    x = torch.randn(40, k, generator=g)
    x[2] = 0.0  # every logit 0: the first column
    x[7] = float("nan")  # every logit NaN: the first column
    for m in (1, 5, 16, 17, 33, 40):
        expected = ops.linear(x[:m], w).float().numpy().argmax(axis=1).tolist()
        assert ops.linear_argmax(x[:m], w) == expected, m
    favoured = torch.cat([x[:4], (matrix[3] * 10)[None]])  # its largest logit, three times: the first
    assert ops.linear_argmax(favoured, w)[-1] == 3


def _bf16(a: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).bfloat16().double().numpy()


# Each bf16 attention over the bf16 cache, with what positions it never wrote hold: anything for
# the AMX tiles (a NaN here), which copy the last block's; for vdpbf16ps whatever is finite: its
# pairs of positions read one past a row's last when their count is odd, times a probability of
# 0, where KVCache's zeros stand (here a stale value, as a rejected draft leaves).
BF16_ATTENTIONS = [
    pytest.param(amx.attention, -64, id="amx", marks=needs_amx),  # 0xFFC0: NaN
    pytest.param(
        kernels.attention, 0x4040, id="avx512_bf16",  # 3.0
        marks=pytest.mark.skipif(not kernels.AVX512_BF16, reason="no AVX-512 BF16"),
    ),
]  # fmt: skip


@pytest.mark.parametrize("head_dim", [16, 48, 64, 128])  # keys padded to 32; 1, 3, 4 and 2 x 4 value tiles
@pytest.mark.parametrize(("attention_kernel", "unwritten"), BF16_ATTENTIONS)
def test_bf16_attention_rows_are_bitwise_independent_of_the_batch_and_correct(head_dim, attention_kernel, unwritten):
    """A bf16 attention over a cache kernels.bf16_rope_store wrote: a prefill, a verification and
    a decode row in one call, each row the same bits as alone, and softmax(q k / sqrt(Dh)) v
    with q, k, v and the probabilities rounded to bf16."""
    g = np.random.default_rng(2)
    n_slots, n_kv, n_heads, max_len = 3, 2, 6, 160
    slots = np.array([0] * 70 + [1] * 50 + [2] * 101)
    positions = np.array([*range(70), *range(50), *range(101)])
    qkv = g.standard_normal((len(slots), (n_heads + 2 * n_kv) * head_dim), dtype=np.float32)
    angles = np.outer(np.arange(max_len), 10000.0 ** -(np.arange(0, head_dim, 2) / head_dim))
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    key_shape, value_shape = kernels.bf16_cache_shapes(n_slots, n_kv, max_len, head_dim)
    keys, values = np.full(key_shape, unwritten, np.int16), np.full(value_shape, unwritten, np.int16)
    q = np.empty((len(slots), n_heads, head_dim), np.float32)
    kernels.bf16_rope_store(qkv, cos, sin, positions, slots, n_heads, n_kv, q, keys, values)
    rows = np.array([*range(60, 70), *range(110, 120), 220])  # a prefill's end, 10 drafts, a step

    def attention(m: np.ndarray) -> np.ndarray:
        out = np.empty((len(m), n_heads * head_dim), np.float32)
        attention_kernel(q[m], keys, values, slots[m], positions[m], out)
        return out

    together = attention(rows)
    assert np.array_equal(together, np.concatenate([attention(rows[i : i + 1]) for i in range(len(rows))]))
    assert np.array_equal(attention(np.arange(70))[60:], together[:10])  # inside a whole prefill
    assert np.array_equal(attention(rows[10:20]), together[10:20])  # the verification alone
    k_all = qkv[:, n_heads * head_dim : (n_heads + n_kv) * head_dim].reshape(-1, n_kv, head_dim)
    want = np.empty((len(rows), n_heads, head_dim))
    for i, m in enumerate(rows):
        mine = (slots == slots[m]) & (positions <= positions[m])  # rows of its sequence so far
        pos = positions[mine]
        c, s_ = cos[pos], sin[pos]
        for h in range(n_heads):
            kv = h // (n_heads // n_kv)
            k = k_all[mine, kv]
            k = np.concatenate([k[:, : head_dim // 2] * c - k[:, head_dim // 2 :] * s_,
                                k[:, head_dim // 2 :] * c + k[:, : head_dim // 2] * s_], axis=1)  # fmt: skip
            v = qkv[mine, (n_heads + n_kv + kv) * head_dim : (n_heads + n_kv + kv + 1) * head_dim]
            scores = _bf16(k) @ _bf16(q[m, h] / np.sqrt(head_dim))
            p = np.exp(scores - scores.max())
            want[i, h] = _bf16(p) @ _bf16(v) / p.sum()
    np.testing.assert_allclose(together, want.reshape(len(rows), -1), rtol=1e-4, atol=1e-4)


def test_bf16_on_a_cpu_without_amx(tiny_target, monkeypatch):
    """Without AMX tiles (or Linux's permission) bfloat16 takes AVX-512 BF16's dot products; with
    neither, dtype auto picks float32 and an explicit bfloat16 is refused with a message naming
    the setting, not a SIGILL at the first instruction the CPU lacks."""
    monkeypatch.setattr(CpuBf16Ops, "unsupported", staticmethod(lambda: "no AMX bf16 tiles"))
    if kernels.AVX512_BF16:
        assert resolve_dtype("auto", "cpu") == "bfloat16"
        assert type(Llama(tiny_target, dtype="auto").ops) is CpuAvx512Bf16Ops
    monkeypatch.setattr(CpuAvx512Bf16Ops, "unsupported", staticmethod(lambda: "no AVX-512 BF16"))
    assert resolve_dtype("auto", "cpu") == "float32"
    assert type(Llama(tiny_target, dtype="auto").ops) is CpuOps
    reason = "dtype bfloat16 on this CPU: no AMX bf16 tiles, no AVX-512 BF16; use dtype float32"
    with pytest.raises(RuntimeError, match=reason):
        Llama(tiny_target, dtype="bfloat16")


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("bf16_ops", BF16_OPS_PARAMS)
def test_bf16_forward_is_close_to_float32(tiny_target, tmp_path, padded, bf16_ops):
    """The bf16 ops round weights and projection inputs to bf16 (8 bits of mantissa) and keep the
    rest in float32: the logits stay within bf16's error of the float32 forward's, and a row's
    are the same bits in a prefill, a verification or a step. padded: widths that fill no tile
    (hidden 40, MLP 72), whose padding amx.decoder_layers must leave out of the residual stream."""
    model_dir = tiny_target
    if padded:
        model_dir = write_tiny_llama(tmp_path / "padded", hidden_size=40, intermediate_size=72,
                                     num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    bf16 = Llama(model_dir, ops=bf16_ops())
    a, b = _prompt_logits(bf16), _prompt_logits(Llama(model_dir, ops=TorchOps()))
    assert not torch.equal(a, b)  # it did compute in bf16
    assert (a - b).abs().max() < 0.03 * b.abs().max()
    tokens, cache, slot = (
        torch.tensor([3, 14, 15, 92, 65, 35, 89, 79]),
        bf16.new_cache(1, 32),
        torch.zeros(8, dtype=torch.int64),
    )
    bf16.forward(cache, tokens[:5], torch.arange(5), slot[:5], torch.tensor([4]))
    assert torch.equal(bf16.forward(cache, tokens[5:], torch.arange(5, 8), slot[5:], torch.arange(3)), a[5:])
    assert torch.equal(bf16.forward(cache, tokens[7:], torch.arange(7, 8), slot[7:], torch.arange(1)), a[7:])


@pytest.mark.parametrize("ops", [CpuOps, TorchOps, *BF16_OPS_PARAMS])
def test_a_copied_prefix_serves_as_the_prefill_it_came_from(tiny_target, ops):
    """KVCache.copy_prefix in every layout: a sequence that starts from a prefix copied from
    another slot gets the logits of one that prefilled it itself."""
    model = Llama(tiny_target, ops=ops())
    tokens = torch.randint(0, 96, (45,), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(3, 64)

    def prefill(slot: int, start: int, rows: torch.Tensor) -> torch.Tensor:
        n = len(rows)
        positions = torch.arange(start, start + n)
        return model.forward(cache, rows, positions, torch.full((n,), slot), torch.arange(n))

    prefill(0, 0, torch.cat([tokens[:37], torch.tensor([5, 5, 5])]))  # another prompt after the prefix
    cache.copy_prefix(0, 1, 37)
    copied = prefill(1, 37, tokens[37:])
    own = prefill(2, 0, tokens)[37:]
    if ops is TorchOps:  # torch's products may round differently with the row count
        torch.testing.assert_close(copied, own, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(copied, own)
