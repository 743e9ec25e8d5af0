"""CPU kernels for the Llama forward, compiled by numba, with per-row invariant arithmetic.

Why not torch/MKL here: (1) a GEMM library picks a different kernel for each number of rows M
(GEMV for M=1, blocked GEMM above), so row i of a k-row verification forward differs in the last
bits from the same row computed alone, and a near-tie can flip a greedy argmax; (2) for the
skinny shapes of decoding (M = 1..40 rows against a 576-wide weight) MKL streams the weights at a
fraction of the memory bandwidth. Every kernel below computes each output element with the same
instruction sequence whatever M is and whichever other rows share the call, so a row's result
depends only on its own inputs; tests/test_kernels.py checks that bit for bit.

The only floating-point freedom we give LLVM is reassociation + contraction inside one dot
product or one row reduction ({"reassoc", "contract"}): it vectorises the reduction in a fixed
order decided at compile time, never by the data or the batch.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

_FAST = {"reassoc", "contract"}
_TILE = 32  # output features whose weights a thread keeps in L2 across blocks of rows
# A dot product longer than this is cut into spans: four rows of x (4 x 3 KB) and a weight row
# then fit in L1 together (in a 5-row forward the down projection, K = 1536, took 1.6x the time
# per weight of the other projections).
_SPAN = 768
_EXP2 = (2.0 ** np.arange(-126, 128)).astype(np.float32)  # 2^n for the n that _exp meets


@njit(fastmath=_FAST, inline="always")
def _exp(x):  # pragma: no cover - compiled
    """exp(x) in float32 within 3e-7 relative, in instructions LLVM can vectorize (np.exp is a
    libm call per element, the softmax's and SiLU's main cost): 2^n * e^r with n = round(x /
    ln 2), |r| <= ln 2 / 2, e^r by its Taylor series to r^6. x is held to [-87, 88], where the
    result stays a normal float."""
    x = min(max(x, np.float32(-87.0)), np.float32(88.0))
    n = np.floor(x * np.float32(1.4426950408889634) + np.float32(0.5))
    r = x - n * np.float32(0.693145751953125) - n * np.float32(1.428606765330187e-06)  # ln 2, split
    p = np.float32(1.0 / 720.0)
    p = p * r + np.float32(1.0 / 120.0)
    p = p * r + np.float32(1.0 / 24.0)
    p = p * r + np.float32(1.0 / 6.0)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    return p * _EXP2[min(max(np.int32(n) + 126, 0), 253)]  # the bound also keeps a NaN in the table


@njit(fastmath=_FAST, inline="always")
def _dot4(x, w, out, m, n, accumulate):  # pragma: no cover - compiled
    """out[m:m+4, n] (+)= x[m:m+4, :] . w[n, :]: one load of w[n, k] feeds four accumulators."""
    a0 = np.float32(0.0)
    a1 = np.float32(0.0)
    a2 = np.float32(0.0)
    a3 = np.float32(0.0)
    for k in range(x.shape[1]):
        wk = w[n, k]
        a0 += x[m, k] * wk
        a1 += x[m + 1, k] * wk
        a2 += x[m + 2, k] * wk
        a3 += x[m + 3, k] * wk
    if accumulate:
        out[m, n] += a0
        out[m + 1, n] += a1
        out[m + 2, n] += a2
        out[m + 3, n] += a3
    else:
        out[m, n] = a0
        out[m + 1, n] = a1
        out[m + 2, n] = a2
        out[m + 3, n] = a3


@njit(fastmath=_FAST, inline="always")
def _dot1(x, w, out, m, n, accumulate):  # pragma: no cover - compiled
    """out[m, n] (+)= x[m, :] . w[n, :]"""
    acc = np.float32(0.0)
    for k in range(x.shape[1]):
        acc += x[m, k] * w[n, k]
    if accumulate:
        out[m, n] += acc
    else:
        out[m, n] = acc


@njit(parallel=True, fastmath=_FAST, cache=True)
def matmul(x, w, out, accumulate):  # pragma: no cover - compiled
    """out[m, n] (+)= sum over spans s of x[s, m, :] . w[s, n, :], span by span, float32.
    x: (S, M, KS), w: (S, N, KS), out: (M, N); the spans split K (see in_spans).

    Parallel over tiles of _TILE output features: each thread streams its tiles of w from memory
    once. Rows go four at a time (_dot4), the last M % 4 one at a time (_dot1), right after the
    last block of four so that w[n] is still in L1. All blocks but the last sweep the tile while
    it sits in L2, keeping their four rows of x in L1. _dot4 and _dot1 accumulate a row exactly
    as each other: LLVM vectorizes each accumulator the same way (checked at start-up by
    rows_agree(), and by the tests).
    """
    spans, m_rows, _ = x.shape
    n_out = w.shape[1]
    m_fours = m_rows - m_rows % 4
    last = max(m_fours - 4, 0)
    for t in prange((n_out + _TILE - 1) // _TILE):
        n_first = t * _TILE
        n_end = min(n_out, n_first + _TILE)
        for s in range(spans):
            xs = x[s]
            ws = w[s]
            add = accumulate or s > 0
            for m in range(0, last, 4):
                for n in range(n_first, n_end):
                    _dot4(xs, ws, out, m, n, add)
            for n in range(n_first, n_end):
                if m_fours > 0:
                    _dot4(xs, ws, out, last, n, add)
                for m in range(m_fours, m_rows):
                    _dot1(xs, ws, out, m, n, add)


@njit(parallel=True, fastmath=_FAST, cache=True)
def matmul_rowwise(x, w, out, accumulate):  # pragma: no cover - compiled
    """matmul one row at a time: the fallback where rows_agree() finds _dot4 vectorized
    differently from _dot1 on this CPU."""
    for n in prange(w.shape[1]):
        for s in range(x.shape[0]):
            for m in range(x.shape[1]):
                _dot1(x[s], w[s], out, m, n, accumulate or s > 0)


def span_count(k_dim: int) -> int:
    """Into how many equal spans of at most _SPAN a dot product of length k_dim is cut: the
    fewest that divide it, if there are no more than twice the minimum; else 1 (not cut)."""
    fewest = -(-k_dim // _SPAN)
    return next((n for n in range(fewest, 2 * fewest + 1) if k_dim % n == 0), 1)


def in_spans(a: np.ndarray, count: int) -> np.ndarray:
    """(R, K) -> (count, R, K / count), contiguous: the layout matmul takes. One span is a view."""
    if count == 1:
        return a[None]
    rows, k_dim = a.shape
    return np.ascontiguousarray(a.reshape(rows, count, k_dim // count).transpose(1, 0, 2))


def rows_agree() -> bool:
    """Does matmul give each row the same bits whether it runs in a group of four or alone?"""
    g = np.random.default_rng(0)
    x = in_spans(g.standard_normal((11, 100), dtype=np.float32), 2)  # two blocks of four and three alone
    w = in_spans(g.standard_normal((80, 100), dtype=np.float32), 2)  # a partial tile
    together = np.empty((11, 80), np.float32)
    matmul(x, w, together, False)
    for i in range(11):
        alone = np.empty((1, 80), np.float32)
        matmul(np.ascontiguousarray(x[:, i : i + 1]), w, alone, False)
        if not np.array_equal(alone[0], together[i]):
            return False
    return True


@njit(parallel=True, fastmath=_FAST, cache=True)
def rmsnorm(x, weight, eps, out):  # pragma: no cover - compiled
    """out = x / sqrt(mean(x^2) + eps) * weight, row by row.  x, out: (M, D)."""
    m_rows, dim = x.shape
    for m in prange(m_rows):
        ss = np.float32(0.0)
        for d in range(dim):
            ss += x[m, d] * x[m, d]
        scale = np.float32(1.0) / np.sqrt(ss / np.float32(dim) + np.float32(eps))
        for d in range(dim):
            out[m, d] = x[m, d] * scale * weight[d]


@njit(parallel=True, fastmath=_FAST, cache=True)
def rope_store(qkv, cos, sin, positions, slots, n_heads, n_kv_heads, q_out, k_cache, v_cache):  # pragma: no cover
    """Rotate q and k (half-split rotary, as Hugging Face Llama) and write k, v into the cache.

    qkv: (M, (H + 2G) * Dh) fused projection output; cos/sin: (T, Dh/2);
    positions, slots: (M,); q_out: (M, H, Dh); k_cache/v_cache: (S, G, T, Dh).
    """
    m_rows = qkv.shape[0]
    head_dim = q_out.shape[2]
    half = head_dim // 2
    k_off = n_heads * head_dim
    v_off = k_off + n_kv_heads * head_dim
    for m in prange(m_rows):
        pos = positions[m]
        s = slots[m]
        for h in range(n_heads):
            base = h * head_dim
            for i in range(half):
                a = qkv[m, base + i]
                b = qkv[m, base + half + i]
                q_out[m, h, i] = a * cos[pos, i] - b * sin[pos, i]
                q_out[m, h, half + i] = b * cos[pos, i] + a * sin[pos, i]
        for g in range(n_kv_heads):
            base = k_off + g * head_dim
            for i in range(half):
                a = qkv[m, base + i]
                b = qkv[m, base + half + i]
                k_cache[s, g, pos, i] = a * cos[pos, i] - b * sin[pos, i]
                k_cache[s, g, pos, half + i] = b * cos[pos, i] + a * sin[pos, i]
            vbase = v_off + g * head_dim
            for i in range(head_dim):
                v_cache[s, g, pos, i] = qkv[m, vbase + i]


@njit(parallel=True, fastmath=_FAST, cache=True)
def attention(q, k_cache, v_cache, slots, positions, out):  # pragma: no cover - compiled
    """Causal attention of each row over its own sequence's cache, positions 0..pos inclusive.

    q: (M, H, Dh); caches: (S, G, T, Dh); out: (M, H * Dh). Grouped-query: head h reads kv head
    h // (H / G). Each (row, head) is independent, so any batch gives the same bits per row.
    """
    m_rows, n_heads, head_dim = q.shape
    n_kv = k_cache.shape[1]
    group = n_heads // n_kv
    scale = np.float32(1.0 / math.sqrt(head_dim))
    for mh in prange(m_rows * n_heads):
        m = mh // n_heads
        h = mh % n_heads
        g = h // group
        s = slots[m]
        length = positions[m] + 1
        scores = np.empty(length, dtype=np.float32)
        top = np.float32(-np.inf)
        for t in range(length):
            acc = np.float32(0.0)
            for d in range(head_dim):
                acc += q[m, h, d] * k_cache[s, g, t, d]
            acc *= scale
            scores[t] = acc
            top = max(top, acc)
        denom = np.float32(0.0)
        for t in range(length):
            e = _exp(scores[t] - top)
            scores[t] = e
            denom += e
        inv = np.float32(1.0) / denom
        for t in range(length):
            scores[t] *= inv
        # values four positions a step: the accumulator is read and written once per four
        acc_v = np.zeros(head_dim, dtype=np.float32)
        fours = length - length % 4
        for t in range(0, fours, 4):
            w0, w1, w2, w3 = scores[t], scores[t + 1], scores[t + 2], scores[t + 3]
            for d in range(head_dim):
                acc_v[d] += (w0 * v_cache[s, g, t, d] + w1 * v_cache[s, g, t + 1, d]) + (
                    w2 * v_cache[s, g, t + 2, d] + w3 * v_cache[s, g, t + 3, d]
                )
        for t in range(fours, length):
            for d in range(head_dim):
                acc_v[d] += scores[t] * v_cache[s, g, t, d]
        for d in range(head_dim):
            out[m, h * head_dim + d] = acc_v[d]


@njit(parallel=True, fastmath=_FAST, cache=True)
def swiglu(gate_up, out):  # pragma: no cover - compiled
    """out = silu(gate) * up, with gate_up = [gate | up] along the last axis."""
    m_rows, width = out.shape
    for m in prange(m_rows):
        for i in range(width):
            g = gate_up[m, i]
            out[m, i] = g / (np.float32(1.0) + _exp(-g)) * gate_up[m, width + i]
