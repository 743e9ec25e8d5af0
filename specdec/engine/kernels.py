"""CPU kernels for the Llama forward, compiled by numba, with per-row invariant arithmetic.

Why not torch/MKL here: (1) a GEMM library picks a different kernel for each number of rows M
(GEMV for M=1, blocked GEMM above), so row i of a k-row verification forward differs in the last
bits from the same row computed alone, and a near-tie can flip a greedy argmax; (2) for the
skinny shapes of decoding (M = 1..40 rows against a 576-wide weight) MKL streams the weights at a
fraction of the memory bandwidth. Every kernel below computes each output element with the same
instruction sequence whatever M is and whichever other rows share the call, so a row's result
depends only on its own inputs; tests/test_kernels.py checks that bit for bit.

The matrix product sums each dot product in order with fused multiply-adds, vectorized across
output features (matmul). The other kernels give LLVM reassociation + contraction inside one row
reduction ({"reassoc", "contract"}): it vectorises the reduction in a fixed order decided at
compile time, never by the data or the batch.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from llvmlite.binding import get_host_cpu_features
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

_FAST = {"reassoc", "contract"}
# The matmul block's shape by register file (the results do not depend on it: every output is
# the same in-order sum): AVX-512 has 32 registers of 16 floats, AVX2 16 of 8.
_AVX512 = bool(get_host_cpu_features().get("avx512f"))
_LANES = 16 if _AVX512 else 8  # float32 lanes of a vector register
TILE = 2 * _LANES  # output features a matmul tile computes together
_BLOCK = 8 if _AVX512 else 4  # rows a block takes at most: 3 x _BLOCK + 2 registers in use
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


def _emit_block(builder, fma, x_data, w_tile, out_data, m0, k_dim, n_out, col, accumulate, rows: int) -> None:
    """LLVM IR for out[m0 : m0 + rows, col : col + TILE] (+)= x[m0 : m0 + rows] @ w_tile."""
    i32, i64 = ir.IntType(32), ir.IntType(64)
    vec = fma.function_type.return_type
    halves = TILE // _LANES

    def const(v):
        return ir.Constant(i64, v)

    x_rows = [builder.gep(x_data, [builder.mul(builder.add(m0, const(r)), k_dim)]) for r in range(rows)]
    zero = ir.Constant(vec, [0.0] * _LANES)
    entry = builder.block
    loop, done = builder.append_basic_block("k_loop"), builder.append_basic_block("k_done")
    builder.cbranch(builder.icmp_signed(">", k_dim, const(0)), loop, done)

    builder.position_at_end(loop)
    k = builder.phi(i64)
    acc = [builder.phi(vec) for _ in range(rows * halves)]
    w_row = builder.gep(w_tile, [builder.mul(k, const(TILE))])
    w_vec = [builder.load(builder.bitcast(builder.gep(w_row, [const(h * _LANES)]), vec.as_pointer()), align=4)
             for h in range(halves)]  # fmt: skip
    summed = []
    for r in range(rows):
        one = builder.insert_element(ir.Constant(vec, ir.Undefined), builder.load(builder.gep(x_rows[r], [k])),
                                     ir.Constant(i32, 0))  # fmt: skip
        x_vec = builder.shuffle_vector(
            one, ir.Constant(vec, ir.Undefined), ir.Constant(ir.VectorType(i32, _LANES), [0] * _LANES)
        )
        summed += [builder.call(fma, [x_vec, w_vec[h], acc[r * halves + h]]) for h in range(halves)]
    k_next = builder.add(k, const(1))
    k.add_incoming(const(0), entry)
    k.add_incoming(k_next, loop)
    for phi, value in zip(acc, summed, strict=True):
        phi.add_incoming(zero, entry)
        phi.add_incoming(value, loop)
    builder.cbranch(builder.icmp_signed("<", k_next, k_dim), loop, done)

    builder.position_at_end(done)
    totals = []
    for value in summed:
        total = builder.phi(vec)
        total.add_incoming(zero, entry)
        total.add_incoming(value, loop)
        totals.append(total)
    for i, total in enumerate(totals):
        r, h = divmod(i, halves)
        row = builder.gep(out_data, [builder.add(builder.mul(builder.add(m0, const(r)), n_out), col)])
        ptr = builder.bitcast(builder.gep(row, [const(h * _LANES)]), vec.as_pointer())
        added = builder.fadd(builder.load(ptr, align=4), total)
        builder.store(builder.select(accumulate, added, total), ptr, align=4)


@intrinsic
def _block(typingctx, x, w, out, m0, rows, t, col, accumulate):
    """out[m0 : m0 + rows, col : col + TILE] (+)= x[m0 : m0 + rows] @ w[t], 1 <= rows <= _BLOCK.

    Written in LLVM IR because numba cannot keep vector accumulators in registers: for each k,
    one TILE-wide row of the packed weight tile is loaded once and, for each of the rows, x[m, k]
    broadcast and fused-multiply-added into that row's accumulators (llvm.fma: one rounding).
    One block of code per row count, chosen by a switch."""
    if any(a.layout != "C" for a in (x, w, out)):
        return None  # the code below steps through rows by their length: C-contiguous only

    def codegen(context, builder, signature, args):
        x_arr, w_arr, out_arr = (
            context.make_array(ty)(context, builder, a) for ty, a in zip(signature.args[:3], args[:3], strict=True)
        )
        i64 = ir.IntType(64)
        m0_v, rows_v, t_v, col_v = (v if v.type == i64 else builder.sext(v, i64) for v in args[3:7])
        vec = ir.VectorType(ir.FloatType(), _LANES)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3), f"llvm.fma.v{_LANES}f32")
        k_dim = builder.extract_value(x_arr.shape, 1)
        n_out = builder.extract_value(out_arr.shape, 1)
        w_tile = builder.gep(w_arr.data, [builder.mul(builder.mul(t_v, k_dim), ir.Constant(i64, TILE))])
        after = builder.append_basic_block("blocks_done")
        switch = builder.switch(rows_v, after)
        for rows in range(1, _BLOCK + 1):
            case = builder.append_basic_block(f"rows_{rows}")
            switch.add_case(ir.Constant(i64, rows), case)
            builder.position_at_end(case)
            _emit_block(builder, fma, x_arr.data, w_tile, out_arr.data, m0_v, k_dim, n_out, col_v, args[7], rows)
            builder.branch(after)
        builder.position_at_end(after)
        return context.get_dummy_value()

    return types.void(x, w, out, m0, rows, t, col, accumulate), codegen


@njit(inline="always")
def _tile(x, w, out, t, col, accumulate):  # pragma: no cover - compiled
    """out[:, col : col + TILE] (+)= x @ (tile t of W).T, _BLOCK rows at a time."""
    for m in range(0, x.shape[0], _BLOCK):
        _block(x, w, out, m, min(_BLOCK, x.shape[0] - m), t, col, accumulate)


@njit(parallel=True, cache=True)
def matmul(x, w, out, accumulate):  # pragma: no cover - compiled
    """out (+)= x @ W.T, float32, W packed by pack_weight: x (M, K), w (ceil(N / TILE), K, TILE),
    out (M, N).

    Every out[m, n] is the sum over k, in order, of x[m, k] * W[n, k], each term fused into the
    running sum (one rounding): the same chain of operations whatever M is and wherever row m
    sits in the batch, so a row's result depends only on its own inputs. Vectorized across the
    TILE output features of a tile (no horizontal sums), up to _BLOCK rows at a time: per k one
    load of the tile's weights feeds two vector FMAs per row (~95% of the cores' FMA peak from
    four rows up on AVX-512), and a forward of up to _BLOCK rows (on AVX-512 eight: a
    verification of seven drafts) reads each tile once. Parallel over tiles: each thread streams
    its tiles from memory once; all blocks of rows sweep a tile while it sits in L2.
    """
    n_out = out.shape[1]
    whole = n_out // TILE
    for t in prange(w.shape[0]):
        if t < whole:
            _tile(x, w, out, t, t * TILE, accumulate)
        else:  # the last tile of an N that is no multiple of TILE, through a buffer
            part = np.empty((x.shape[0], TILE), dtype=np.float32)
            _tile(x, w, part, t, 0, False)
            for m in range(x.shape[0]):
                for j in range(n_out - t * TILE):
                    out[m, t * TILE + j] = out[m, t * TILE + j] + part[m, j] if accumulate else part[m, j]


def pack_weight(w: np.ndarray) -> np.ndarray:
    """(N, K) -> (ceil(N / TILE), K, TILE): each tile's TILE output features side by side for
    every k, contiguous in the order matmul reads them; a last partial tile is padded with zeros."""
    n_out, k_dim = w.shape
    tiles = -(-n_out // TILE)
    padded = np.zeros((tiles * TILE, k_dim), dtype=np.float32)
    padded[:n_out] = w
    return np.ascontiguousarray(padded.reshape(tiles, TILE, k_dim).transpose(0, 2, 1))


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
