"""CPU kernels for the Llama forward, compiled by numba, with per-row invariant arithmetic.

Why not torch/MKL here: (1) a GEMM library picks a different kernel for each number of rows M
(GEMV for M=1, blocked GEMM above), so row i of a k-row verification forward differs in the last
bits from the same row computed alone, and a near-tie can flip a greedy argmax; (2) for the
skinny shapes of decoding (M = 1..40 rows against a 576-wide weight) MKL streams the weights at a
fraction of the memory bandwidth. Every kernel below computes each output element with the same
instruction sequence whatever M is and whichever other rows share the call, so a row's result
depends only on its own inputs; tests/test_kernels.py checks that bit for bit.

The matrix product sums each dot product in order with fused multiply-adds, vectorized across
output features (matmul); attention's two products (queries by keys, probabilities by values)
are the same code. The other kernels give LLVM reassociation + contraction inside one row
reduction ({"reassoc", "contract"}): it vectorises the reduction in a fixed order decided at
compile time, never by the data or the batch.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from llvmlite.binding import get_host_cpu_features, initialize_native_asmparser
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

FASTMATH = {"reassoc", "contract"}
# The matmul block's shape by register file (the results do not depend on it: every output is
# the same in-order sum): AVX-512 has 32 registers of 16 floats, AVX2 16 of 8.
_AVX512 = bool(get_host_cpu_features().get("avx512f"))
AVX512_BF16 = _AVX512 and bool(get_host_cpu_features().get("avx512bf16"))  # vdpbf16ps: pack_bf16_weight
LANES = 16 if _AVX512 else 8  # float32 lanes of a vector register
TILE = 2 * LANES  # output features a matmul tile computes together
# Rows a block takes at most: 2 x _BLOCK accumulators, the 2 weight registers and the broadcasts
# of x, each live for its row's two products. On AVX-512 14 (28 + 2 of 32 registers): each weight
# streamed from memory feeds up to 14 rows at once, where with blocks of 8 a verification's second
# block computes its products after the first has streamed the weights. Forwards of 9-14 rows
# gain by it, other row counts and prefills stay as they were (benchmarks/engine_ab.py measures it).
_BLOCK = 14 if _AVX512 else 4
# A block asks for the weights it will read this many steps of k ahead (8 KB for a matmul tile),
# into L2. Without it the loads of a block of several rows come too slowly for the memory's
# latency, and a forward of a few rows costs well over one row's, where with the tile in cache it
# costs about what one row does (benchmarks/engine_ab.py measures forwards by row count).
PREFETCH_STEPS = 64
_LINE_FLOATS = 16  # floats in a 64-byte cache line


@intrinsic
def _pow2(typingctx, n):
    """2.0 ** n in float32 for an int32 n in [-126, 127]: its exponent field, set directly (a
    table of the powers costs a gather per vector, which would be the softmax's main cost)."""
    if n != types.int32:
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        return builder.bitcast(builder.shl(builder.add(args[0], ir.Constant(i32, 127)), ir.Constant(i32, 23)),
                               ir.FloatType())  # fmt: skip

    return types.float32(types.int32), codegen


@intrinsic
def _bits(typingctx, x):
    """A float32's bits as an int32, and back."""
    if x == types.float32:
        return types.int32(types.float32), lambda context, builder, sig, args: builder.bitcast(args[0], ir.IntType(32))
    if x == types.int32:
        return types.float32(types.int32), lambda context, builder, sig, args: builder.bitcast(args[0], ir.FloatType())
    return None


@njit(inline="always")
def _ordered(bits):  # pragma: no cover - compiled
    """A float32's bits (int32) -> an int32 in the order of the floats, and back: a negative
    float's magnitude bits flipped."""
    return np.int32(bits ^ ((bits >> 31) & np.int32(0x7FFFFFFF)))


@njit(inline="always")
def row_max(row, n):  # pragma: no cover - compiled
    """max(row[:n]) for n >= 1 and no NaN, as integers: a float maximum waits for the previous
    one at each step of the loop (its NaN handling), where the integer one vectorizes."""
    top = np.int32(-2147483648)
    for t in range(n):
        top = max(top, _ordered(_bits(row[t])))
    return _bits(_ordered(top))


# 1.5 * 2^23: a float of magnitude < 2^22 added to it is rounded to an integer in the sum's low bits
_ROUNDING = np.float32(12582912.0)
_ROUNDING_BITS = np.int32(0x4B400000)  # its bits
# exp(r) for |r| <= ln 2 / 2 by a polynomial of degree 5 (fitted for relative error with exp(0) = 1,
# within 1.8e-7 evaluated in float32; the Taylor series needs degree 6 for it); n is rounded by
# _ROUNDING's sum (_exp_parts), cheaper than a floor and a conversion
_EXP_POLY = tuple(np.float32(c) for c in (
    0.008290314115583897, 0.04189793020486832, 0.1666763573884964, 0.4999915063381195, 0.9999997019767761, 1.0,
))  # fmt: skip


@njit(fastmath=FASTMATH, inline="always")
def _exp_parts(x):  # pragma: no cover - compiled
    """exp(x) = p * 2^n for x in [-87, 88]: n = round(x / ln 2) (an int32, taken from the bits of
    the sum with _ROUNDING: reassociation could drop the sum and its difference), p = e^r for
    r = x - n ln 2, |r| <= ln 2 / 2."""
    n = np.int32(_bits(x * np.float32(1.4426950408889634) + _ROUNDING) - _ROUNDING_BITS)
    k = np.float32(n)
    r = x - k * np.float32(0.693145751953125) - k * np.float32(1.428606765330187e-06)  # ln 2, split
    p = _EXP_POLY[0]
    p = p * r + _EXP_POLY[1]
    p = p * r + _EXP_POLY[2]
    p = p * r + _EXP_POLY[3]
    p = p * r + _EXP_POLY[4]
    p = p * r + _EXP_POLY[5]
    return p, n


@njit(fastmath=FASTMATH, inline="always")
def _exp(x):  # pragma: no cover - compiled
    """exp(x) in float32 within 3e-7 relative, in instructions LLVM can vectorize (np.exp is a
    libm call per element, the softmax's and SiLU's main cost). x is held to [-87, 88], where the
    result stays a normal float."""
    p, n = _exp_parts(min(max(x, np.float32(-87.0)), np.float32(88.0)))
    # a NaN x makes n any integer: the bound keeps 2^n a number, and the NaN shows through p
    return p * _pow2(min(max(n, np.int32(-126)), np.int32(127)))


@njit(fastmath=FASTMATH, inline="always")
def exp_nonpositive(x):  # pragma: no cover - compiled
    """_exp(x) for x <= 0 and not NaN (a score less its row's maximum), in fewer instructions:
    the bounds _exp takes beyond x >= -87 hold already, so the result is _exp's bit for bit."""
    p, n = _exp_parts(max(x, np.float32(-87.0)))
    return p * _pow2(n)


def _emit_block(builder, madd, element, x_rows, k_dim, w_data, w_stride, out_rows, accumulate, halves: int) -> None:
    """LLVM IR for out_rows[r][: halves * LANES] (+)= sum over k < k_dim of x_rows[r][k] * w[k]
    for each row r, with w[k] the halves vectors of `element` (float32, or int32: pairs of bf16)
    at w_data + k * w_stride, each term added by madd(builder, x[k] broadcast, w[k], sums); each
    step of k also prefetches w[k + PREFETCH_STEPS] (read, keep in L2, data)."""
    i32, i64 = ir.IntType(32), ir.IntType(64)
    vec = ir.VectorType(ir.FloatType(), LANES)
    w_type = ir.VectorType(element, LANES)
    byte_ptr = ir.IntType(8).as_pointer()
    prefetch = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]), "llvm.prefetch.p0"
    )

    def const(v):
        return ir.Constant(i64, v)

    zero = ir.Constant(vec, [0.0] * LANES)
    entry = builder.block
    loop, done = builder.append_basic_block("k_loop"), builder.append_basic_block("k_done")
    builder.cbranch(builder.icmp_signed(">", k_dim, const(0)), loop, done)

    builder.position_at_end(loop)
    k = builder.phi(i64)
    acc = [builder.phi(vec) for _ in range(len(x_rows) * halves)]
    w_row = builder.gep(w_data, [builder.mul(k, w_stride)])
    ahead = builder.gep(w_row, [builder.mul(const(PREFETCH_STEPS), w_stride)])
    for line in range(0, halves * LANES, _LINE_FLOATS):  # a prefetch never faults, even past the end
        address = builder.bitcast(builder.gep(ahead, [const(line)]), prefetch.args[0].type)
        builder.call(prefetch, [address, ir.Constant(i32, 0), ir.Constant(i32, 2), ir.Constant(i32, 1)])
    w_vec = [builder.load(builder.bitcast(builder.gep(w_row, [const(h * LANES)]), w_type.as_pointer()), align=4)
             for h in range(halves)]  # fmt: skip
    summed = []
    for r, x_row in enumerate(x_rows):
        one = builder.insert_element(ir.Constant(w_type, ir.Undefined), builder.load(builder.gep(x_row, [k])),
                                     ir.Constant(i32, 0))  # fmt: skip
        x_vec = builder.shuffle_vector(
            one, ir.Constant(w_type, ir.Undefined), ir.Constant(ir.VectorType(i32, LANES), [0] * LANES)
        )
        summed += [madd(builder, x_vec, w_vec[h], acc[r * halves + h]) for h in range(halves)]
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
        ptr = builder.bitcast(builder.gep(out_rows[r], [const(h * LANES)]), vec.as_pointer())
        added = builder.fadd(builder.load(ptr, align=4), total)
        builder.store(builder.select(accumulate, added, total), ptr, align=4)


def _fma(builder, x_vec, w_vec, sums):
    vec = sums.type
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3), f"llvm.fma.v{LANES}f32")
    return builder.call(fma, [x_vec, w_vec, sums])


initialize_native_asmparser()  # numba's JIT assembles _bf16_dot's inline assembly


def _bf16_dot(builder, x_vec, w_vec, sums):
    """sums[i] += x[2i] * w[2i] + x[2i + 1] * w[2i + 1] over bf16 pairs (vdpbf16ps, as inline
    assembly: llvmlite has no bfloat type to declare LLVM's intrinsic with)."""
    signature = ir.FunctionType(sums.type, [sums.type, x_vec.type, w_vec.type])
    return builder.asm(signature, "vdpbf16ps $3, $2, $0", "=v,0,v,v", [sums, x_vec, w_vec], False)


@intrinsic
def _block(typingctx, x, m0, rows, k_dim, w, w_col, out, out_col, accumulate):
    """out[m0 + r, out_col : out_col + n] (+)= sum over k < k_dim of x[m0 + r, k] * w[k, w_col :
    w_col + n] for r < rows <= _BLOCK, n = TILE or (the last columns of a narrow w) LANES.

    Written in LLVM IR because numba cannot keep vector accumulators in registers: for each k,
    the n-wide row of w is loaded once and, for each of the rows, x[m, k] broadcast and
    fused-multiply-added into that row's accumulators (llvm.fma: one rounding), in order of k.
    One block of code per row count and width, chosen by a switch.

    x and w of int32 are pairs of bf16 (bf16_pairs, pack_bf16_weight), k counting pairs: each
    step adds both products of a pair by one AVX-512 BF16 vdpbf16ps."""
    if any(a.layout != "C" or a.ndim != 2 for a in (x, w, out)):
        return None  # the code below steps through rows by their length: 2-D C-contiguous only
    pairs = x.dtype == w.dtype == types.int32
    if not (pairs or x.dtype == w.dtype == types.float32):
        return None

    def codegen(context, builder, signature, args):
        x_arr, w_arr, out_arr = (context.make_array(signature.args[i])(context, builder, args[i]) for i in (0, 4, 6))
        i64 = ir.IntType(64)
        m0_v, rows_v, k_dim_v, w_col_v, out_col_v = (
            args[i] if args[i].type == i64 else builder.sext(args[i], i64) for i in (1, 2, 3, 5, 7)
        )
        element, madd = (ir.IntType(32), _bf16_dot) if pairs else (ir.FloatType(), _fma)

        def row_stride(arr):
            return builder.extract_value(arr.shape, 1)

        w_width = row_stride(w_arr)
        halves_v = builder.select(builder.icmp_signed(">=", builder.sub(w_width, w_col_v), ir.Constant(i64, TILE)),
                                  ir.Constant(i64, TILE // LANES), ir.Constant(i64, 1))  # fmt: skip
        w_data = builder.gep(w_arr.data, [w_col_v])

        def row(arr, col, r):
            index = builder.add(builder.mul(builder.add(m0_v, ir.Constant(i64, r)), row_stride(arr)), col)
            return builder.gep(arr.data, [index])

        after = builder.append_basic_block("blocks_done")
        switch = builder.switch(builder.add(builder.mul(rows_v, ir.Constant(i64, 4)), halves_v), after)
        for rows in range(1, _BLOCK + 1):
            for halves in (1, TILE // LANES):
                case = builder.append_basic_block(f"rows_{rows}_{halves}")
                switch.add_case(ir.Constant(i64, rows * 4 + halves), case)
                builder.position_at_end(case)
                x_rows = [row(x_arr, ir.Constant(i64, 0), r) for r in range(rows)]
                out_rows = [row(out_arr, out_col_v, r) for r in range(rows)]
                _emit_block(builder, madd, element, x_rows, k_dim_v, w_data, w_width, out_rows, args[8], halves)
                builder.branch(after)
        builder.position_at_end(after)
        return context.get_dummy_value()

    return types.void(x, m0, rows, k_dim, w, w_col, out, out_col, accumulate), codegen


@njit(inline="always")
def _product(x, rows, k_dim, w, w_col, out, out_col, accumulate):  # pragma: no cover - compiled
    """out[:rows, out_col : out_col + n] (+)= x[:rows, :k_dim] @ w[:k_dim, w_col : w_col + n], n as
    _block, _BLOCK rows at a time."""
    for m in range(0, rows, _BLOCK):
        _block(x, m, min(_BLOCK, rows - m), k_dim, w, w_col, out, out_col, accumulate)


@intrinsic
def bf16(typingctx, x):
    """float32 -> bf16 bits (int16), rounded to nearest, ties to even (NaNs not kept apart: none
    reach it from a finite model), in instructions LLVM vectorizes."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        bits = builder.bitcast(args[0], i32)
        odd = builder.and_(builder.lshr(bits, ir.Constant(i32, 16)), ir.Constant(i32, 1))
        rounded = builder.add(bits, builder.add(odd, ir.Constant(i32, 0x7FFF)))
        return builder.trunc(builder.lshr(rounded, ir.Constant(i32, 16)), ir.IntType(16))

    return types.int16(types.float32), codegen


PARALLEL_ROWS = 64  # rows from which bf16_pairs converts on all threads (starting them costs more below)


@njit(inline="always")
def row_bf16(row, out):  # pragma: no cover - compiled
    for k in range(len(row)):
        out[k] = bf16(row[k])


@njit(inline="always")
def _pairs(x):  # pragma: no cover - compiled
    """bf16_pairs(x) on this thread alone (inside a parallel loop)."""
    bits = np.empty(x.shape, dtype=np.int16)
    for m in range(x.shape[0]):
        row_bf16(x[m], bits[m])
    return bits.view(np.int32)


@njit(parallel=True, cache=True)
def bf16_pairs(x):  # pragma: no cover - compiled
    """(M, K) float32, K even -> (M, K / 2) int32: each row rounded to bf16 (bf16()), its
    features 2j and 2j + 1 in the low and high half of element j (vdpbf16ps's pairs)."""
    if x.shape[0] < PARALLEL_ROWS:
        return _pairs(x)
    bits = np.empty(x.shape, dtype=np.int16)
    for m in prange(x.shape[0]):
        row_bf16(x[m], bits[m])
    return bits.view(np.int32)


def _terms(x, w):
    """x as its products with w take it: itself (float32 w), or its bf16 pairs: for matmul's
    weights (pack_bf16_weight's int32) bf16_pairs(x), for attention's bf16 cache (int16 bits,
    inside attention's parallel loop) on this thread alone."""


@overload(_terms)
def _terms_typed(x, w):
    if w.dtype == types.int32:
        return lambda x, w: bf16_pairs(x)
    if w.dtype == types.int16:
        return lambda x, w: _pairs(x)
    return lambda x, w: x


@njit(parallel=True, cache=True)
def matmul(x, w, out, accumulate):  # pragma: no cover - compiled
    """out (+)= x @ W.T, float32, W packed by pack_weight: x (M, K), w (ceil(N / TILE), K, TILE),
    out (M, N). With W packed by pack_bf16_weight (int32 pairs of bf16, AVX-512 BF16 CPUs): the
    same with x's and W's terms rounded to bf16, each pair's two products added to the float32
    sum by one vdpbf16ps, half the weight bytes and twice the products per instruction.

    Every out[m, n] is the sum over k, in order, of x[m, k] * W[n, k], each term fused into the
    running sum (one rounding): the same chain of operations whatever M is and wherever row m
    sits in the batch, so a row's result depends only on its own inputs. Vectorized across the
    TILE output features of a tile (no horizontal sums), up to _BLOCK rows at a time: per k one
    load of the tile's weights feeds two vector FMAs per row (~95% of the cores' FMA peak from
    four rows up on AVX-512), and a forward of up to _BLOCK rows (on AVX-512 14: a
    verification of 13 drafts) reads each tile once. Parallel over tiles: each thread streams
    its tiles from memory once; all blocks of rows sweep a tile while it sits in L2.
    """
    terms = _terms(x, w)
    n_out = out.shape[1]
    whole = n_out // TILE
    for t in prange(w.shape[0]):
        if t < whole:
            _product(terms, x.shape[0], terms.shape[1], w[t], 0, out, t * TILE, accumulate)
        else:  # the last tile of an N that is no multiple of TILE, through a buffer
            part = np.empty((x.shape[0], TILE), dtype=np.float32)
            _product(terms, x.shape[0], terms.shape[1], w[t], 0, part, 0, False)
            for m in range(x.shape[0]):
                for j in range(n_out - t * TILE):
                    out[m, t * TILE + j] = out[m, t * TILE + j] + part[m, j] if accumulate else part[m, j]


CACHE_LINE = 64  # bytes


def line_aligned(shape: tuple[int, ...], dtype, zeros: bool = False) -> np.ndarray:
    """A new C-contiguous array that starts on a cache line (numpy aligns to 16 bytes only). An AMX
    tile's row and an AVX-512 vector are 64 bytes: off a line, each load touches two, and tile
    loads from L1 or L2 take far longer. The weights, the KV cache and amx.py's tile buffers are
    aligned: prefills gain by it, steps do not (their weights come from memory at its pace;
    benchmarks/engine_ab.py measures both). zeros: calloc's zeros, whose pages stay unbacked until
    written (as np.zeros)."""
    dtype = np.dtype(dtype)
    size = math.prod(shape) * dtype.itemsize
    buffer = (np.zeros if zeros else np.empty)(size + CACHE_LINE, dtype=np.uint8)
    skip = -buffer.ctypes.data % CACHE_LINE
    return buffer[skip : skip + size].view(dtype).reshape(shape)


def pack_weight(w: np.ndarray) -> np.ndarray:
    """(N, K) -> (ceil(N / TILE), K, TILE): each tile's TILE output features side by side for
    every k, contiguous in the order matmul reads them; a last partial tile is padded with zeros."""
    n_out, k_dim = w.shape
    tiles = -(-n_out // TILE)
    padded = np.zeros((tiles * TILE, k_dim), dtype=w.dtype)
    padded[:n_out] = w
    return np.ascontiguousarray(padded.reshape(tiles, TILE, k_dim).transpose(0, 2, 1))


def pack_bf16_weight(w: np.ndarray) -> np.ndarray:
    """(N, K) float32, K even -> pack_weight of its bf16 pairs: (ceil(N / TILE), K / 2, TILE) int32."""
    if w.shape[1] % 2:
        raise ValueError(f"bf16 products on AVX-512 take pairs of features: a width of {w.shape[1]} is odd")
    return pack_weight(bf16_pairs(np.ascontiguousarray(w, dtype=np.float32)))


@njit(parallel=True, fastmath=FASTMATH, cache=True)
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


@njit(inline="always")
def qkv_offsets(n_heads, n_kv_heads, head_dim):  # pragma: no cover - compiled
    """Half a head, and where the keys and the values start in a row of the fused q/k/v output."""
    k_off = n_heads * head_dim
    return head_dim // 2, k_off, k_off + n_kv_heads * head_dim


@njit(fastmath=FASTMATH, inline="always")
def rotated(a, b, c, s):  # pragma: no cover - compiled
    """A pair (a, b) of features half a head apart, rotated by the angle with cosine c, sine s."""
    return a * c - b * s, b * c + a * s


@njit(fastmath=FASTMATH, inline="always")
def rotate_queries(qkv, m, pos, cos, sin, q_out):  # pragma: no cover - compiled
    """q_out[m] = row m's queries (the first H heads of qkv[m]) rotated for position pos."""
    n_heads, head_dim = q_out.shape[1], q_out.shape[2]
    half = head_dim // 2
    for h in range(n_heads):
        base = h * head_dim
        for i in range(half):
            lo, hi = rotated(qkv[m, base + i], qkv[m, base + half + i], cos[pos, i], sin[pos, i])
            q_out[m, h, i] = lo
            q_out[m, h, half + i] = hi


@njit(parallel=True, fastmath=FASTMATH, cache=True)
def rope_store(qkv, cos, sin, positions, slots, n_heads, n_kv_heads, q_out, k_tiles, v_cache):  # pragma: no cover
    """Rotate q and k (half-split rotary, as Hugging Face Llama) and write k, v into the cache.

    qkv: (M, (H + 2G) * Dh) fused projection output; cos/sin: (T, Dh/2); positions, slots: (M,);
    q_out: (M, H, Dh); k_tiles: (S, G, T / TILE, Dh, TILE) (attention's layout); v_cache:
    (S, G, T, Dh).
    """
    head_dim = q_out.shape[2]
    half, k_off, v_off = qkv_offsets(n_heads, n_kv_heads, head_dim)
    for m in prange(qkv.shape[0]):
        pos = positions[m]
        s = slots[m]
        tile, lane = pos // TILE, pos % TILE
        rotate_queries(qkv, m, pos, cos, sin, q_out)
        for g in range(n_kv_heads):
            base = k_off + g * head_dim
            for i in range(half):
                lo, hi = rotated(qkv[m, base + i], qkv[m, base + half + i], cos[pos, i], sin[pos, i])
                k_tiles[s, g, tile, i, lane] = lo
                k_tiles[s, g, tile, half + i, lane] = hi
            vbase = v_off + g * head_dim
            for i in range(head_dim):
                v_cache[s, g, pos, i] = qkv[m, vbase + i]


# The bf16 KV cache of both bf16 engines (ops.CpuBf16Ops, CpuAvx512Bf16Ops), as int16 bits, in
# the layouts their products take as weights: pairs of bf16 side by side along each product's sum
# (AMX's "VNNI" layout, vdpbf16ps's pairs).
# - keys (S, G, ceil(T / KEY_BLOCK), Dk / 2, KEY_BLOCK, 2), Dk = Dh rounded up to 32 (a tile's
#   row of bf16): per KEY_BLOCK positions, rows of pairs of key features;
# - values (S, G, ceil(T / VALUE_BLOCK) * VALUE_BLOCK / 2, Dh, 2): rows of pairs of positions.
KEY_BLOCK = 16  # positions of a block of keys (an AMX tile's rows)
VALUE_BLOCK = 32  # positions of a block of values: 16 rows of pairs


def bf16_cache_shapes(slots: int, kv_heads: int, max_len: int, head_dim: int) -> tuple[tuple[int, ...], ...]:
    """The shapes of the keys and values of one layer of the bf16 cache."""
    if head_dim % 16:
        raise ValueError(f"head_dim: the bf16 CPU engines need a multiple of 16, got {head_dim}")
    padded = -(-head_dim // 32) * 32
    keys = (slots, kv_heads, -(-max_len // KEY_BLOCK), padded // 2, KEY_BLOCK, 2)
    values = (slots, kv_heads, -(-max_len // VALUE_BLOCK) * VALUE_BLOCK // 2, head_dim, 2)
    return keys, values


@njit(parallel=True, fastmath=FASTMATH, cache=True)
def bf16_rope_store(qkv, cos, sin, positions, slots, n_heads, n_kv_heads, q_out, keys, values):  # pragma: no cover
    """rope_store into the bf16 cache (keys, values: int16 bits, one layer); a key's padding
    features are written as zeros. Below PARALLEL_ROWS rows on this thread alone: split between
    threads, a verification's rows write the same cache lines of a key block (its KEY_BLOCK
    positions share them), which costs more than one thread writing them all, and starting the
    threads costs besides."""
    if qkv.shape[0] < PARALLEL_ROWS:
        for m in range(qkv.shape[0]):
            _bf16_rope_store_row(qkv, cos, sin, positions, slots, m, n_heads, n_kv_heads, q_out, keys, values)
    else:
        for m in prange(qkv.shape[0]):
            _bf16_rope_store_row(qkv, cos, sin, positions, slots, m, n_heads, n_kv_heads, q_out, keys, values)


@njit(fastmath=FASTMATH, inline="always")
def _bf16_rope_store_row(qkv, cos, sin, positions, slots, m, n_heads, n_kv_heads, q_out, keys,
                         values):  # pragma: no cover - compiled  # fmt: skip
    head_dim = q_out.shape[2]
    half, k_off, v_off = qkv_offsets(n_heads, n_kv_heads, head_dim)
    pos, s = positions[m], slots[m]
    rotate_queries(qkv, m, pos, cos, sin, q_out)
    block, lane = pos // KEY_BLOCK, pos % KEY_BLOCK
    for g in range(n_kv_heads):
        key = keys[s, g, block]
        base = k_off + g * head_dim
        for j in range(half // 2):  # features 2j, 2j + 1 and the two half a head on: two pairs
            lo, hi = rotated(qkv[m, base + 2 * j], qkv[m, base + half + 2 * j], cos[pos, 2 * j], sin[pos, 2 * j])
            lo_next, hi_next = rotated(qkv[m, base + 2 * j + 1], qkv[m, base + half + 2 * j + 1],
                                       cos[pos, 2 * j + 1], sin[pos, 2 * j + 1])  # fmt: skip
            key[j, lane, 0], key[j, lane, 1] = bf16(lo), bf16(lo_next)
            key[half // 2 + j, lane, 0], key[half // 2 + j, lane, 1] = bf16(hi), bf16(hi_next)
        for i in range(head_dim, 2 * key.shape[0]):
            key[i // 2, lane, i % 2] = 0
        for i in range(head_dim):
            values[s, g, pos // 2, i, pos % 2] = bf16(qkv[m, v_off + g * head_dim + i])


def _store(qkv, cos, sin, positions, slots, n_heads, n_kv_heads, q_out, keys, values):
    """rope_store into a float32 cache, bf16_rope_store into a bf16 one."""


@overload(_store)
def _store_typed(qkv, cos, sin, positions, slots, n_heads, n_kv_heads, q_out, keys, values):
    store = bf16_rope_store if keys.dtype == types.int16 else rope_store
    return lambda qkv, cos, sin, positions, slots, n_heads, n_kv_heads, q_out, keys, values: store(
        qkv, cos, sin, positions, slots, n_heads, n_kv_heads, q_out, keys, values
    )


@njit(fastmath=FASTMATH, inline="always")
def bf16_softmax_numerators(scores, n, out):  # pragma: no cover - compiled
    """softmax_numerators(scores, n) into out[:n] as bf16 (int16 bits), scores left as they are
    (one pass over them, not two); returns the sum of the numerators before rounding."""
    top = row_max(scores, n)
    denom = np.float32(0.0)
    for t in range(n):
        e = exp_nonpositive(scores[t] - top)
        out[t] = bf16(e)
        denom += e
    return denom


@njit(fastmath=FASTMATH, inline="always")
def softmax_numerators(scores, n):  # pragma: no cover - compiled
    """scores[:n] -> exp(scores[:n] - their maximum), in place; returns their sum (a row's
    softmax is these over it); n >= 1."""
    top = row_max(scores, n)
    denom = np.float32(0.0)
    for t in range(n):
        e = exp_nonpositive(scores[t] - top)
        scores[t] = e
        denom += e
    return denom


ATTENTION_ROWS = 8  # rows of one sequence whose queries share each load of a key or value


@njit(cache=True)
def row_blocks(slots, positions, most, least):  # pragma: no cover - compiled
    """Bounds of blocks of rows: each run of one sequence's consecutive positions split into
    equal blocks of at most `most` rows, and at least `least` blocks where it has the rows (9
    rows: 5 and 4, two equal shares for two threads). Block b is rows starts[b] : starts[b + 1]."""
    starts = np.empty(len(slots) + 1, dtype=np.int64)
    n = 0
    run = 0
    for m in range(len(slots) + 1):
        if m == len(slots) or (m > 0 and (slots[m] != slots[m - 1] or positions[m] != positions[m - 1] + 1)):
            blocks = max((m - run + most - 1) // most, min(m - run, least))
            for b in range(blocks):
                starts[n] = run + (m - run) * b // blocks
                n += 1
            run = m
    starts[n] = len(slots)
    return starts[: n + 1]


def _as_pairs(cache):
    """A block of the cache as its products' weights: a float32 cache as it is, the bf16 cache's
    int16 pairs as int32 (its last axis, the pair, gone)."""


@overload(_as_pairs)
def _as_pairs_typed(cache):
    if cache.dtype == types.int16:

        def pairs(cache):
            joined = cache.view(np.int32)
            return joined.reshape(joined.shape[:-1])

        return pairs
    return lambda cache: cache


@njit(parallel=True, fastmath=FASTMATH, cache=True)
def attention(q, keys, values, slots, positions, out):  # pragma: no cover - compiled
    """Causal attention of each row over its own sequence's cache, positions 0..pos inclusive.

    q: (M, H, Dh); out: (M, H * Dh). The cache (one layer): float32 as cache_layout, keys
    (S, G, T / TILE, Dh, TILE) and values (S, G, T, Dh); or the bf16 cache (int16 bits, as
    bf16_cache_shapes): then the queries and the probabilities are rounded to bf16 and each step
    of a product adds a pair of terms (vdpbf16ps, as matmul with pack_bf16_weight), half the
    steps and half the bytes. Grouped-query: head h reads kv head h // (H / G).

    A run of up to ATTENTION_ROWS rows of one sequence and the H / G query heads of a kv head
    go together, as the rows of two products with _block: scores = queries @ keys block by block
    (each key's Dh terms in order), then out = probabilities @ values (each position in order),
    every key and value loaded once for all of them. A row's probabilities past its own
    position are zeros, which leave its sums as they were (vdpbf16ps flushes denormal sums: none
    is left for a pair of zeros to flush): each row gets the same bits whatever else shares its
    run. (In the bf16 cache the pairs of positions reach one past the run's last
    position when its count is odd: a position never written must hold no NaN there; KVCache's
    are zeros.) A verification alone (one block, G items) splits in two: G items alone share
    unevenly among threads (G = 3 on two threads gives one twice the other's work).
    """
    n_heads, head_dim = q.shape[1], q.shape[2]
    n_kv = keys.shape[1]
    group = n_heads // n_kv
    scale = np.float32(1.0 / math.sqrt(head_dim))
    starts = row_blocks(slots, positions, ATTENTION_ROWS, 1)
    if len(starts) == 2:  # one block: a step or a verification alone
        starts = row_blocks(slots, positions, ATTENTION_ROWS, 2)
    items = (len(starts) - 1) * n_kv
    block = keys.shape[4]  # positions of a block of keys
    for i in prange(items):
        # later runs of a prefill attend further: pair the i-th item from each end so that each
        # thread's equal share of the range is an equal share of the work
        item = i // 2 if i % 2 == 0 else items - 1 - i // 2
        m0, m1 = starts[item // n_kv], starts[item // n_kv + 1]
        g = item % n_kv
        s = slots[m0]
        length = positions[m1 - 1] + 1
        n_q = (m1 - m0) * group
        x = np.empty((n_q, head_dim), dtype=np.float32)
        for r in range(n_q):
            for d in range(head_dim):
                x[r, d] = q[m0 + r // group, g * group + r % group, d] * scale
        terms = _terms(x, keys)
        blocks = (length + block - 1) // block
        p = np.empty((n_q, blocks * block), dtype=np.float32)
        for t in range(blocks):
            _product(terms, n_q, terms.shape[1], _as_pairs(keys[s, g, t]), 0, p, t * block, False)
        inv = np.empty(n_q, dtype=np.float32)  # 1 / each softmax's sum, applied to its output
        for r in range(n_q):
            own = positions[m0 + r // group] + 1
            inv[r] = np.float32(1.0) / softmax_numerators(p[r], own)
            for t in range(own, p.shape[1]):
                p[r, t] = np.float32(0.0)
        weights = _terms(p, keys)
        per_step = p.shape[1] // weights.shape[1]  # positions a step of the second product adds
        values_out = np.empty((n_q, head_dim), dtype=np.float32)
        for col in range(0, head_dim, TILE):
            _product(weights, n_q, (length + per_step - 1) // per_step, _as_pairs(values[s, g]), col, values_out, col,
                     False)  # fmt: skip
        for r in range(n_q):
            h = g * group + r % group
            for d in range(head_dim):
                out[m0 + r // group, h * head_dim + d] = values_out[r, d] * inv[r]


@njit(parallel=True, fastmath=FASTMATH, cache=True)
def swiglu(gate_up, out):  # pragma: no cover - compiled
    """out = silu(gate) * up, with gate_up = [gate | up] along the last axis."""
    m_rows, width = out.shape
    for m in prange(m_rows):
        for i in range(width):
            g = gate_up[m, i]
            out[m, i] = g / (np.float32(1.0) + _exp(-g)) * gate_up[m, width + i]


@njit(cache=True)
def decoder_layers(x, positions, slots, eps, n_heads, attn_norm, wqkv, wo, mlp_norm, w_gate_up, gate_up_width,
                   w_down, k_cache, v_cache, cos, sin):  # pragma: no cover - compiled  # fmt: skip
    """x (M, D) += each layer's attention, then its MLP, in place: ops.TorchOps.decoder_layers
    with the kernels above, each layer's weights the [i] of a stack over the layers (packed as
    pack_weight or pack_bf16_weight; attn_norm, mlp_norm (L, D)), the cache as attention takes it
    for all layers (float32: k_cache (L, S, G, T / TILE, Dh, TILE), v_cache (L, S, G, T, Dh); or
    the bf16 cache)."""
    rows = x.shape[0]
    n_kv, head_dim = v_cache.shape[2], v_cache.shape[4]
    h = np.empty_like(x)
    qkv = np.empty((rows, (n_heads + 2 * n_kv) * head_dim), dtype=np.float32)
    q = np.empty((rows, n_heads, head_dim), dtype=np.float32)
    attended = np.empty((rows, n_heads * head_dim), dtype=np.float32)
    gate_up = np.empty((rows, gate_up_width), dtype=np.float32)
    mlp = np.empty((rows, gate_up_width // 2), dtype=np.float32)
    for i in range(attn_norm.shape[0]):
        rmsnorm(x, attn_norm[i], eps, h)
        matmul(h, wqkv[i], qkv, False)
        _store(qkv, cos, sin, positions, slots, n_heads, n_kv, q, k_cache[i], v_cache[i])
        attention(q, k_cache[i], v_cache[i], slots, positions, attended)
        matmul(attended, wo[i], x, True)
        rmsnorm(x, mlp_norm[i], eps, h)
        matmul(h, w_gate_up[i], gate_up, False)
        swiglu(gate_up, mlp)
        matmul(mlp, w_down[i], x, True)
