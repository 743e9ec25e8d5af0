"""The CPU kernels: right answers, and a row's result independent of the rest of the batch.

Bitwise row invariance is what makes speculation exact on CPU: a token verified inside a k-row
forward must get the same logits as the same token decoded alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.engine import kernels
from specdec.engine.model import Llama
from specdec.engine.ops import CpuOps, TorchOps


@pytest.fixture(scope="module")
def data():
    g = np.random.default_rng(0)
    return {
        "x": g.standard_normal((80, 96), dtype=np.float32),
        "w": g.standard_normal((200, 96), dtype=np.float32),
    }


def _rows_alone(fn, x: np.ndarray) -> np.ndarray:
    return np.concatenate([fn(x[i : i + 1]) for i in range(len(x))])


# The kernel CpuOps selects on this CPU (the four-row one where its rows agree with the one-row
# loop, see kernels.rows_agree), and the one-row fallback.
SELECTED = CpuOps()._matmul


def _product(kernel, x: np.ndarray, w: np.ndarray, spans: int, out: np.ndarray, accumulate: bool) -> np.ndarray:
    kernel(kernels.in_spans(x, spans), kernels.in_spans(w, spans), out, accumulate)
    return out


@pytest.mark.parametrize("spans", [1, 3])
@pytest.mark.parametrize("kernel", [SELECTED, kernels.matmul_rowwise], ids=["selected", "rowwise"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 17, 80])
def test_linear_rows_are_bitwise_independent_of_the_batch(data, rows, kernel, spans):
    def linear(x):
        return _product(kernel, x, data["w"], spans, np.empty((len(x), len(data["w"])), np.float32), False)

    x = data["x"][:rows]
    together = linear(x)
    assert np.array_equal(together, _rows_alone(linear, x))
    np.testing.assert_allclose(together, x @ data["w"].T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spans", [1, 3])
def test_accumulate_adds_the_product(data, spans):
    x, w = data["x"][:6], data["w"]
    res = _product(SELECTED, x, w, spans, np.ones((6, len(w)), np.float32), True)
    np.testing.assert_allclose(res, 1 + x @ w.T, rtol=1e-4, atol=1e-4)


def test_spans_cut_long_dot_products_evenly():
    assert [kernels.span_count(k) for k in (96, 576, 768, 1536, 2048, 8192, 769)] == [1, 1, 1, 2, 4, 16, 1]
    a = np.arange(24, dtype=np.float32).reshape(2, 12)
    assert np.shares_memory(kernels.in_spans(a, 1), a)  # one span: a view, no copy
    assert np.array_equal(kernels.in_spans(a, 3)[1], a[:, 4:8])


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


def test_forward_rows_match_one_token_decoding_bit_for_bit(tiny_target):
    """Prefill + a k-row verification in one call, mixed with another sequence, gives the same
    logits as decoding each token alone: the property greedy exactness stands on."""
    model = Llama(tiny_target)
    tokens = torch.tensor([5, 17, 3, 88, 41, 9, 60, 2, 33, 71], dtype=torch.int64)
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
    rows = torch.cat([tokens[:6], other, tokens[6:]])
    positions = torch.cat([torch.arange(6), torch.arange(4), torch.arange(6, n)])
    slots = torch.tensor([1] * 6 + [2] * 4 + [1] * (n - 6))
    want = torch.tensor([*range(6), *range(10, 10 + n - 6)])
    together = model.forward(batched, rows, positions, slots, want)
    assert torch.equal(together, one_by_one)


def test_cpu_kernels_agree_with_the_torch_implementation(tiny_target):
    """Two independent implementations of the same forward (numba on CPU, torch for CUDA)."""
    cpu = Llama(tiny_target)
    ref = Llama(tiny_target, ops=TorchOps())
    assert isinstance(cpu.ops, CpuOps)
    tokens = torch.tensor([3, 14, 15, 92, 65, 35, 89, 79], dtype=torch.int64)
    args = (tokens, torch.arange(8), torch.zeros(8, dtype=torch.int64), torch.arange(8))
    a = cpu.forward(cpu.new_cache(1, 32), *args)
    b = ref.forward(ref.new_cache(1, 32), *args)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
