"""CpuBf16Ops's products on AMX tiles, with per-row invariant arithmetic: every projection
(matmul) and attention's two (queries by keys, probabilities by values) over a bfloat16 KV cache,
and the decoder layers that call them, all in one compiled call (decoder_layers).

Why: with oneDNN's bf16 products and kernels.attention's float32 ones, a verification's rows
cost well over a step's, attention's float32 products run at the cores' FMA peak, and a step's
attention waits on reading the float32 cache. Here every product is an AMX TDPBF16PS tile
product, bf16 terms summed in float32, and the cache is half the size (benchmarks/engine_ab.py
measures forwards and, with --attention, attention alone).

A tile is 16 rows of 64 bytes: 16 x 32 bf16 or 16 x 16 float32. TDPBF16PS adds to each row of
its float32 tile the products of that row of A with B, B holding pairs of bf16 along its rows
(the "VNNI" layout). So the cache is kept in the layouts B needs: kernels.py's bf16 cache
(bf16_cache_shapes), keys in blocks of 16 positions (a tile's rows), values in rows of pairs of
positions.
Each row of a tile product is computed alone by the hardware, in the same order of terms, so a
row's result depends only on its own inputs, as in kernels.py: the positions past a row's own
have probability 0, and add nothing. The softmax between the two products is kernels.py's, in
float32; the probabilities go to the second product rounded to bf16 (as in flash attention), and
its sums are divided by the float32 sum of the unrounded ones.

AMX needs Linux's permission per process (arch_prctl), and each thread loads the tile shapes
(TILE_CONFIG; matmul's as high as its rows, MATMUL_CONFIGS) before its first tile instruction.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
from llvmlite import ir
from llvmlite.binding import get_host_cpu_features
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from specdec.engine.kernels import (
    CACHE_LINE,
    FASTMATH,
    KEY_BLOCK,
    PARALLEL_ROWS,
    VALUE_BLOCK,
    bf16,
    bf16_rope_store,
    bf16_softmax_numerators,
    rmsnorm,
    row_bf16,
    row_blocks,
    row_max,
    swiglu,
)

ROWS = 16  # rows of a tile
PAIR = 32  # bf16 in a tile's row
KEY_AHEAD = 4  # blocks of keys attention asks for ahead of the one it loads
PV_TILES = 4  # tiles 4..7 hold up to 4 x 16 columns of the output while positions stream past

_I8 = ir.IntType(8)
_PTR = _I8.as_pointer()
_I64 = ir.IntType(64)


def tile_config(rows: int = ROWS, row_tiles: tuple[int, ...] = ()) -> np.ndarray:
    """ldtilecfg's 64 bytes: palette 1, tiles 0..7 of 64 bytes a row, 16 rows, but the tiles in
    `row_tiles` `rows` rows."""
    cfg = np.zeros(64, dtype=np.uint8)
    cfg[0] = 1
    for tile in range(8):
        cfg[16 + 2 * tile] = 64  # bytes per row (a little-endian u16)
        cfg[48 + tile] = rows if tile in row_tiles else ROWS
    return cfg


TILE_CONFIG = tile_config()
# matmul's tiles for a product of M < 16 rows: its accumulators (0-3) and rows (4, 5) M rows high,
# its weights' tiles (6, 7) whole. The hardware computes each row of a tile product alone, so a
# row's result is the same bits whatever the tile's height, and a product of fewer rows, its row
# loads and its stores take less time (benchmarks/engine_ab.py measures the forwards).
MATMUL_CONFIGS = np.stack([tile_config(max(rows, 1), (0, 1, 2, 3, 4, 5)) for rows in range(ROWS + 1)])


def _request_tiles() -> str | None:
    """Ask Linux for AMX tile state for this process (all its threads); why not, or None."""
    features = get_host_cpu_features()
    if not (features.get("amx-bf16") and features.get("amx-tile")):
        return "no AMX bf16 tiles"
    arch_prctl, req_xcomp_perm, xtiledata = 158, 0x1023, 18  # x86-64 Linux
    if ctypes.CDLL(None, use_errno=True).syscall(arch_prctl, req_xcomp_perm, xtiledata) != 0:
        return f"Linux refused AMX tiles to this process (errno {ctypes.get_errno()})"
    return None


_UNAVAILABLE = _request_tiles()  # at import: a tile instruction without the permission is SIGILL


def unavailable() -> str | None:
    """Why AMX bf16 tiles cannot be used in this process, or None."""
    return _UNAVAILABLE


def _call(builder, name: str, arg_types: list, args: list) -> None:
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), arg_types), name)
    builder.call(fn, args)


@intrinsic
def _load_config(typingctx, cfg):
    """ldtilecfg: this thread's tiles take the shapes in cfg (a uint8 array of 64)."""

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        _call(builder, "llvm.x86.ldtilecfg", [_PTR], [builder.bitcast(data, _PTR)])
        return context.get_dummy_value()

    return types.void(cfg), codegen


@intrinsic
def _release(typingctx):
    def codegen(context, builder, sig, args):
        _call(builder, "llvm.x86.tilerelease", [], [])
        return context.get_dummy_value()

    return types.void(), codegen


def _literals(*tiles) -> bool:
    return all(isinstance(t, types.IntegerLiteral) for t in tiles)


def _imm(tile) -> ir.Constant:
    return ir.Constant(_I8, tile.literal_value)


@intrinsic(prefer_literal=True)
def _zero(typingctx, tile):
    """tilezero tile (a constant)."""
    if not _literals(tile):
        return None

    def codegen(context, builder, sig, args):
        _call(builder, "llvm.x86.tilezero", [_I8], [_imm(tile)])
        return context.get_dummy_value()

    return types.void(tile), codegen


def _memory(name: str):
    """An intrinsic (tile, array, offset, stride): `name` (tileloadd64 or tilestored64) between
    tile (a constant) and 16 rows of memory from array.flat[offset] on, stride bytes apart."""

    @intrinsic(prefer_literal=True)
    def move(typingctx, tile, arr, offset, stride):
        if not _literals(tile):
            return None

        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[1])(context, builder, args[1]).data
            offset_v, stride_v = (v if v.type == _I64 else builder.sext(v, _I64) for v in args[2:])
            address = builder.bitcast(builder.gep(data, [offset_v]), _PTR)
            _call(builder, name, [_I8, _PTR, _I64], [_imm(tile), address, stride_v])
            return context.get_dummy_value()

        return types.void(tile, arr, offset, stride), codegen

    return move


@intrinsic
def _prefetch(typingctx, arr, offset):
    """Ask for the 2 KB from arr.flat[offset] on (32 lines) into L2, ahead of their use."""

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        offset_v = args[1] if args[1].type == _I64 else builder.sext(args[1], _I64)
        start = builder.bitcast(builder.gep(data, [offset_v]), _PTR)
        i32 = ir.IntType(32)
        prefetch = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [_PTR, i32, i32, i32]), "llvm.prefetch.p0"
        )
        for line in range(0, 2048, 64):
            address = builder.gep(start, [ir.Constant(_I64, line)])
            builder.call(prefetch, [address, ir.Constant(i32, 0), ir.Constant(i32, 2), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, offset), codegen


_load = _memory("llvm.x86.tileloadd64")
_store = _memory("llvm.x86.tilestored64")


@intrinsic(prefer_literal=True)
def _dot(typingctx, c, a, b):
    """tdpbf16ps c, a, b: c (float32) += a (bf16) @ b (bf16 pairs), tiles given as constants."""
    if not _literals(c, a, b):
        return None

    def codegen(context, builder, sig, args):
        _call(builder, "llvm.x86.tdpbf16ps", [_I8] * 3, [_imm(c), _imm(a), _imm(b)])
        return context.get_dummy_value()

    return types.void(c, a, b), codegen


@njit(inline="always")
def _zero_from(row, start):  # pragma: no cover - compiled
    """row[start:] = 0, as a loop: numba's slice assignment has a fixed cost even with nothing to assign."""
    for k in range(start, len(row)):
        row[k] = 0


@njit(inline="always")
def _zero_rows_from(arr, start):  # pragma: no cover - compiled
    for r in range(start, arr.shape[0]):
        _zero_from(arr[r], 0)


@njit(inline="always")
def lined(shape, dtype):  # pragma: no cover - compiled
    """np.empty(shape, dtype) from a cache line on (kernels.line_aligned; numba's arrays start on
    32 bytes): a tile's rows are 64 bytes, and one across two lines costs two accesses."""
    size = 1
    for n in shape:
        size *= n
    flat = np.empty(size + CACHE_LINE, dtype=dtype)
    skip = (-flat.ctypes.data % CACHE_LINE) // flat.itemsize
    return flat[skip : skip + size].reshape(shape)


@njit(inline="always")
def _last_values(values, length, value_blocks):  # pragma: no cover - compiled
    """A copy of the last block of a kv head's values (values: (T / 2, Dh, 2) int16), its positions
    from `length` on zeros: they may hold anything (NaN times a probability of 0 is NaN). Copied
    a run of whole rows of pairs at a time: position by position, the copy is a sizeable share of
    a step's attention."""
    last = lined((VALUE_BLOCK // 2, values.shape[1], 2), np.int16)
    flat, row = last.reshape(-1), 2 * values.shape[1]  # a row of pairs: head_dim pairs
    first = (value_blocks - 1) * VALUE_BLOCK // 2  # the block's first row of pairs
    source = values[first : first + VALUE_BLOCK // 2].reshape(-1)
    valid = length - 2 * first  # positions of the block before `length`: 1 .. VALUE_BLOCK
    whole = valid // 2 * row
    for k in range(whole):
        flat[k] = source[k]
    _zero_from(flat, whole)
    if valid % 2:  # the row of pairs across `length`: its first position only
        for k in range(whole, whole + row, 2):
            flat[k] = source[k]
    return last


@njit(parallel=True, fastmath=FASTMATH, cache=True)
def attention(q, keys, values, slots, positions, out):  # pragma: no cover - compiled
    """kernels.attention over this module's bf16 cache (one layer), on AMX tiles.

    q: (M, H, Dh) float32; out: (M, H * Dh) float32. A block of up to 2 * ROWS // group rows of
    one sequence (in a forward of PARALLEL_ROWS rows or more, a prefill's, up to 4 * ROWS //
    group) and the group query heads of a kv head make the rows of the tiles (padded with zeros
    to whole tiles), taken two tiles at a time: each key tile loaded serves both, and with up to
    64 features a query's tiles stay loaded while the keys stream past, so a verification loads
    each key tile half as often as one tile at a time would."""
    n_heads, head_dim = q.shape[1], q.shape[2]
    n_kv, key_width = keys.shape[1], 2 * keys.shape[3]
    group = n_heads // n_kv
    chunks = key_width // PAIR
    held = chunks <= 2  # the queries stay in their tiles while the keys stream past
    scale = np.float32(1.0 / math.sqrt(head_dim))
    # a prefill's blocks are plenty for every thread: fewer, of more queries, each reading the keys
    # before it once for more rows; the outputs are the same bits (benchmarks/engine_ab.py
    # --attention measures both)
    tiles = 4 if len(slots) >= PARALLEL_ROWS else 2
    starts = row_blocks(slots, positions, max(1, tiles * ROWS // group), 1)
    items = (len(starts) - 1) * n_kv
    for i in prange(items):
        item = i // 2 if i % 2 == 0 else items - 1 - i // 2  # as kernels.attention: equal shares
        m0, m1 = starts[item // n_kv], starts[item // n_kv + 1]
        g, s = item % n_kv, slots[m0]
        length = positions[m1 - 1] + 1
        n_q = (m1 - m0) * group
        row_tiles = -(-n_q // ROWS)
        x = lined((row_tiles * ROWS, key_width), np.int16)  # padding zeroed below
        _zero_rows_from(x, n_q)
        for r in range(n_q):
            query = q[m0 + r // group, g * group + r % group]
            for d in range(head_dim):
                x[r, d] = bf16(query[d] * scale)
            _zero_from(x[r], head_dim)
        key_blocks = -(-length // KEY_BLOCK)
        value_blocks = -(-length // VALUE_BLOCK)
        scores = lined((row_tiles * ROWS, key_blocks * KEY_BLOCK), np.float32)
        width = scores.shape[1]
        _load_config(TILE_CONFIG)
        block_keys = ROWS * key_width  # int16 elements of a block of keys (2 KB with 64 features)
        for t in range(min(KEY_AHEAD, key_blocks)):
            _prefetch(keys[s, g], t * block_keys)
        for rt in range(0, row_tiles, 2):  # two tiles of queries at a time: each key tile loaded serves both
            both = rt + 1 < row_tiles
            first, second = rt * ROWS * key_width, (rt + 1) * ROWS * key_width
            if held:  # tiles 1, 3: the first tile's queries; 5, 6: the second's
                _load(1, x, first, 2 * key_width)
                _load(3, x, first + (chunks - 1) * PAIR, 2 * key_width)
                if both:
                    _load(5, x, second, 2 * key_width)
                    _load(6, x, second + (chunks - 1) * PAIR, 2 * key_width)
            for t in range(key_blocks):
                if rt == 0:  # the cache, cold after the layer's products, asked for ahead of its loads:
                    # the keys a few blocks on, the values of these positions
                    if t + KEY_AHEAD < key_blocks:
                        _prefetch(keys[s, g], (t + KEY_AHEAD) * block_keys)
                    _prefetch(values[s, g], t * KEY_BLOCK * head_dim)
                _zero(0)
                if both:
                    _zero(4)
                for c in range(chunks):
                    _load(2, keys[s, g, t], c * ROWS * PAIR, 2 * PAIR)
                    if not held:
                        _load(1, x, first + c * PAIR, 2 * key_width)
                        _dot(0, 1, 2)
                        if both:
                            _load(5, x, second + c * PAIR, 2 * key_width)
                            _dot(4, 5, 2)
                    elif c == 0:
                        _dot(0, 1, 2)
                        if both:
                            _dot(4, 5, 2)
                    else:
                        _dot(0, 3, 2)
                        if both:
                            _dot(4, 6, 2)
                _store(0, scores, rt * ROWS * width + t * KEY_BLOCK, 4 * width)
                if both:
                    _store(4, scores, (rt + 1) * ROWS * width + t * KEY_BLOCK, 4 * width)
        p = lined((row_tiles * ROWS, value_blocks * VALUE_BLOCK), np.int16)  # bf16
        _zero_rows_from(p, n_q)
        inv = np.empty(n_q, dtype=np.float32)  # 1 / each softmax's sum, applied to its output
        for r in range(n_q):
            own = positions[m0 + r // group] + 1
            inv[r] = np.float32(1.0) / bf16_softmax_numerators(scores[r], own, p[r])
            _zero_from(p[r], own)
        last = _last_values(values[s, g], length, value_blocks)
        result = lined((row_tiles * ROWS, head_dim), np.float32)
        row_bytes = 4 * head_dim  # a row of values: head_dim pairs of bf16
        for rt in range(row_tiles):
            for col in range(0, head_dim, 16 * PV_TILES):  # tiles 4..7: 16 columns each
                cols = min(16 * PV_TILES, head_dim - col) // 16
                _zero(4)
                _zero(5)
                _zero(6)
                _zero(7)
                for b in range(value_blocks):
                    _load(1, p, rt * ROWS * p.shape[1] + b * VALUE_BLOCK, 2 * p.shape[1])
                    block = values[s, g] if b < value_blocks - 1 else last
                    at = (b * VALUE_BLOCK * head_dim if b < value_blocks - 1 else 0) + 2 * col
                    _load(2, block, at, row_bytes)
                    _dot(4, 1, 2)
                    if cols > 1:
                        _load(3, block, at + 32, row_bytes)
                        _dot(5, 1, 3)
                    if cols > 2:
                        _load(2, block, at + 64, row_bytes)
                        _dot(6, 1, 2)
                    if cols > 3:
                        _load(3, block, at + 96, row_bytes)
                        _dot(7, 1, 3)
                at = rt * ROWS * head_dim + col
                _store(4, result, at, row_bytes)
                if cols > 1:
                    _store(5, result, at + 16, row_bytes)
                if cols > 2:
                    _store(6, result, at + 32, row_bytes)
                if cols > 3:
                    _store(7, result, at + 48, row_bytes)
        _release()
        for r in range(n_q):
            row, scale_r = out[m0 + r // group, (g * group + r % group) * head_dim :], inv[r]
            for d in range(head_dim):
                row[d] = result[r, d] * scale_r


PREFETCH_AHEAD = 8 * 1024  # elements of w (16 KB) ahead of the tiles in use
GROUP = 2  # tiles of 16 output features a thread computes together


def pack_weight(w) -> np.ndarray:
    """(N, K) bf16 bits (int16) -> (ceil(N / 32), ceil(K / 32), GROUP, 16, 16, 2): for each group
    of 32 output features and each 32 terms, the two B tiles (16 pairs of terms by 16 features),
    in the order matmul streams them; padded with zeros."""
    n_out, k_dim = w.shape
    n_pad, k_pad = -(-n_out // (16 * GROUP)) * 16 * GROUP, -(-k_dim // PAIR) * PAIR
    padded = np.zeros((n_pad, k_pad), dtype=np.int16)
    padded[:n_out, :k_dim] = w
    tiles = padded.reshape(n_pad // (16 * GROUP), GROUP, 16, k_pad // PAIR, PAIR // 2, 2)
    return np.ascontiguousarray(tiles.transpose(0, 3, 1, 4, 2, 5))


@njit(inline="always")
def _to_bf16(row, out):  # pragma: no cover - compiled
    """out = row in bf16, zeros past its end."""
    row_bf16(row, out)
    _zero_from(out, len(row))


@njit(inline="always")
def _bf16_rows(x, chunks):  # pragma: no cover - compiled
    """A product's A: x (M, K) float32 in bf16 (int16 bits), rows padded to whole tiles and K to
    `chunks` of PAIR terms with zeros."""
    m_rows = x.shape[0]
    a = lined((-(-m_rows // ROWS) * ROWS, chunks * PAIR), np.int16)  # only the padding is zeroed, below
    _zero_rows_from(a, m_rows)
    if m_rows < PARALLEL_ROWS:
        for m in range(m_rows):
            _to_bf16(x[m], a[m])
    else:  # a prefill's rows: converted on one thread, they would cost a share of its products' time
        for m in prange(m_rows):
            _to_bf16(x[m], a[m])
    return a


@njit(inline="always")
def _block(a, w, g, pair, both):  # pragma: no cover - compiled
    """Tiles 0 and 1 (2 and 3 where `both`) = row tiles pair (and pair + 1) of a times output
    group g of w, summed over every chunk of terms: a product's 2x2 block, left in the tiles."""
    chunks, a_row = w.shape[1], a.shape[1]
    _zero(0)
    _zero(1)
    _zero(2)
    _zero(3)
    for c in range(chunks):
        tiles = (g * chunks + c) * GROUP * ROWS * PAIR
        _prefetch(w, tiles + PREFETCH_AHEAD)
        _load(4, a, pair * ROWS * a_row + c * PAIR, 2 * a_row)
        _load(6, w, tiles, 2 * PAIR)
        _load(7, w, tiles + ROWS * PAIR, 2 * PAIR)
        _dot(0, 4, 6)
        _dot(1, 4, 7)
        if both:
            _load(5, a, (pair + 1) * ROWS * a_row + c * PAIR, 2 * a_row)
            _dot(2, 5, 6)
            _dot(3, 5, 7)


@njit(inline="always")
def _store_block(out, row, column, both):  # pragma: no cover - compiled
    """_block's tiles into out (float32, rows of a multiple of 16 floats) from out[row, column] on."""
    out_row = out.shape[1]
    at = row * out_row + column
    _store(0, out, at, 4 * out_row)
    _store(1, out, at + 16, 4 * out_row)
    if both:
        _store(2, out, at + ROWS * out_row, 4 * out_row)
        _store(3, out, at + ROWS * out_row + 16, 4 * out_row)


@njit(parallel=True, cache=True)
def matmul(x, w, out):  # pragma: no cover - compiled
    """out[:M, :32 G] = x @ W.T in bf16 products summed in float32: x (M, K) float32, w (G, C, ...)
    pack_weight of W, out (ceil(M / 16) * 16, >= 32 G) float32 (its rows past M: padding)."""
    groups, chunks = w.shape[0], w.shape[1]
    row_tiles = -(-x.shape[0] // ROWS)
    a = _bf16_rows(x, chunks)
    cfg = MATMUL_CONFIGS[min(x.shape[0], ROWS)]
    for g in prange(groups):
        _load_config(cfg)
        for pair in range(0, row_tiles, 2):  # two tiles of rows at a time: each B tile loaded serves both
            both = pair + 1 < row_tiles
            _block(a, w, g, pair, both)
            _store_block(out, pair * ROWS, g * GROUP * 16, both)
        _release()


ARGMAX_SPANS = 32  # matmul_argmax's parallel items: runs of output groups, each with its scratch


@njit(parallel=True, cache=True)
def matmul_argmax(x, w, n_out, best):  # pragma: no cover - compiled
    """best[m] = the column of the first maximum of row m of (x @ W.T)[:, :n_out] (a NaN counting
    as one: np.argmax of matmul()'s output). The products are matmul's; each 2x2 block of tiles is
    scanned from L1 as it is done, and none is written out: logits written out come back from
    memory, the lm_head's weights having streamed through the caches since, and numpy's argmax
    over them would cost a verification more than this scan does."""
    m_rows = x.shape[0]
    groups, chunks = w.shape[0], w.shape[1]
    row_tiles = -(-m_rows // ROWS)
    a = _bf16_rows(x, chunks)
    cfg = MATMUL_CONFIGS[min(m_rows, ROWS)]
    spans = min(ARGMAX_SPANS, groups)
    top = np.zeros((spans, m_rows), dtype=np.float32)  # each span's maximum of each row so far
    at = np.full((spans, m_rows), -1, dtype=np.int64)  # and its column (-1: none yet)
    for s in prange(spans):
        scratch = lined((2 * ROWS, GROUP * 16), np.float32)
        _load_config(cfg)
        for g in range(s * groups // spans, (s + 1) * groups // spans):
            first, width = g * GROUP * 16, min(GROUP * 16, n_out - g * GROUP * 16)
            for pair in range(0, row_tiles, 2):
                both = pair + 1 < row_tiles
                _block(a, w, g, pair, both)
                _store_block(scratch, 0, 0, both)
                for r in range(min(2 * ROWS, m_rows - pair * ROWS)):
                    m = pair * ROWS + r
                    j = _first_max(scratch[r], width)
                    v = scratch[r, j]
                    if at[s, m] < 0 or _beats(v, top[s, m]):
                        top[s, m], at[s, m] = v, first + j
        _release()
    for m in range(m_rows):  # the spans in order (each found a column: it has a group): a tie goes to the first
        b = 0
        for s in range(1, spans):
            if _beats(top[s, m], top[b, m]):
                b = s
        best[m] = at[b, m]


@njit(inline="always")
def _beats(v, top):  # pragma: no cover - compiled
    """Does v, found after top, take the lead (np.argmax's order: a NaN beats all but a NaN)?"""
    return v > top or (v != v and top == top)


@njit(inline="always")
def _first_max(row, n):  # pragma: no cover - compiled
    """np.argmax(row[:n]) for n >= 1: the first NaN if there is one, else where the maximum (over the
    floats' bits as integers: kernels.row_max) first is."""
    nan = False
    for j in range(n):
        nan |= row[j] != row[j]
    if nan:
        for j in range(n):
            if row[j] != row[j]:
                return j
    top = row_max(row, n)
    for j in range(n):
        if row[j] == top:
            return j
    return 0


@njit(parallel=True, cache=True)
def _add_rows(x, padded):  # pragma: no cover - compiled
    """x += padded[:M, :D] for x (M, D): a product's tiles (rows past M, columns past D: padding)
    into the residual stream."""
    for m in prange(x.shape[0]):
        for d in range(x.shape[1]):
            x[m, d] += padded[m, d]


@njit(cache=True)
def decoder_layers(x, positions, slots, eps, n_heads, attn_norm, wqkv, wo, mlp_norm, w_gate_up, gate_up_width,
                   w_down, keys, values, cos, sin):  # pragma: no cover - compiled  # fmt: skip
    """kernels.decoder_layers with this module's products over its bf16 cache: each layer's
    weights the [i] of a stack of pack_weight's tiles, keys and values as bf16_cache_shapes for all
    layers (int16 bits). Called once a forward: from Python the overhead of its ~270 kernel calls
    would be a large share of a step. A product writes whole tiles, so its output has rows up to a
    multiple of 16 and columns up to one of 32 (its first M rows go on: a C-contiguous view, which
    the kernels are compiled for), and those feeding the residual stream are added into x."""
    rows = x.shape[0]
    padded = -(-rows // ROWS) * ROWS
    n_kv, head_dim = values.shape[2], values.shape[4]
    h = np.empty_like(x)
    qkv = lined((padded, wqkv.shape[1] * GROUP * 16), np.float32)
    q = np.empty((rows, n_heads, head_dim), dtype=np.float32)
    attended = np.empty((rows, n_heads * head_dim), dtype=np.float32)
    projected = lined((padded, wo.shape[1] * GROUP * 16), np.float32)  # wo's and w_down's
    gate_up = lined((padded, w_gate_up.shape[1] * GROUP * 16), np.float32)
    mlp = np.empty((rows, gate_up_width // 2), dtype=np.float32)
    for i in range(attn_norm.shape[0]):
        rmsnorm(x, attn_norm[i], eps, h)
        matmul(h, wqkv[i], qkv)
        bf16_rope_store(qkv[:rows], cos, sin, positions, slots, n_heads, n_kv, q, keys[i], values[i])
        attention(q, keys[i], values[i], slots, positions, attended)
        matmul(attended, wo[i], projected)
        _add_rows(x, projected)
        rmsnorm(x, mlp_norm[i], eps, h)
        matmul(h, w_gate_up[i], gate_up)
        swiglu(gate_up[:rows], mlp)  # its columns past 2F: padding
        matmul(mlp, w_down[i], projected)
        _add_rows(x, projected)
