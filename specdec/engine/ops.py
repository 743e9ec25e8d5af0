"""The operations the Llama forward needs, for three backends.

CpuOps: numba kernels with per-row invariant arithmetic (kernels.py); float32 only.
CpuBf16Ops: the projections and attention as bf16 AMX tile products (amx.py) over a bf16 cache,
the rest CpuOps's float32 kernels.
CpuAvx512Bf16Ops: where there is no AMX, the projections and attention as AVX-512 BF16 dot
products over the same bf16 cache, the rest CpuOps's.
TorchOps: plain torch, for CUDA (and as an independent implementation the tests compare with).
decoder_layers() runs every decoder layer over the rows in place: TorchOps's is the layer
written out, the CPU ops' the same steps compiled into one call (kernels.decoder_layers,
amx.decoder_layers). All write new keys/values into the cache before attention reads it, so
rows of the same sequence in one call attend to each other causally. linear() takes its weight
in the layout weight() made of the (N, K) matrix (or a stack of them): the CPU kernel's tiles,
the matrix itself for torch; a layer's keys and values are laid out as cache_layout() says, in
cache_dtype (None: the model's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from specdec.engine import amx, kernels

if TYPE_CHECKING:
    from specdec.engine.model import KVCache, Layers, LlamaConfig


class PackedWeight(NamedTuple):
    tiles: torch.Tensor  # the (N, K) matrix (or each of a stack) packed by the ops' pack_weight
    rows: int  # N

    @property
    def nbytes(self) -> int:  # as torch.Tensor.nbytes
        return self.tiles.nbytes


Weight = torch.Tensor | PackedWeight  # what ops.weight() makes of an (N, K) matrix or a stack


class CpuOps:
    cache_dtype: torch.dtype | None = None
    packed_bf16 = False  # weights packed as bf16 tiles (PackedWeight): GuessHead runs compiled over them
    pack_weight = staticmethod(kernels.pack_weight)  # (N, K) -> the tiles of linear()'s kernel
    layers_kernel = staticmethod(kernels.decoder_layers)

    @staticmethod
    def cache_layout(slots: int, kv_heads: int, max_len: int, head_dim: int) -> tuple[tuple[int, ...], ...]:
        """Keys in tiles of kernels.TILE positions, each tile position-minor: the layout in which
        kernels.attention reads a tile of keys as the weight of a product; values as they come."""
        if head_dim % kernels.LANES:
            raise ValueError(f"head_dim: the CPU engine needs a multiple of {kernels.LANES}, got {head_dim}")
        keys = (slots, kv_heads, -(-max_len // kernels.TILE), head_dim, kernels.TILE)
        return keys, (slots, kv_heads, max_len, head_dim)

    def embedding(self, table: Weight, tokens: torch.Tensor) -> torch.Tensor:
        """Rows of an embedding table, plain or packed by weight() (a tied lm_head)."""
        if isinstance(table, PackedWeight):
            return table.tiles[tokens // kernels.TILE, :, tokens % kernels.TILE].contiguous()
        return table[tokens]

    def embedding_table(self, embed: torch.Tensor, tied_lm_head: Weight | None) -> Weight:
        """What embedding() reads: a tied lm_head's tiles (one copy of the matrix), else embed."""
        return embed if tied_lm_head is None else tied_lm_head

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out = torch.empty_like(x)
        kernels.rmsnorm(x.numpy(), weight.numpy(), eps, out.numpy())
        return out

    def weight(self, w: torch.Tensor) -> PackedWeight:
        """(..., N, K) -> the tiles linear() takes (pack_weight of each matrix)."""
        packed = [self.pack_weight(m) for m in as_numpy(w.reshape(-1, *w.shape[-2:]))]
        tiles = np.stack(packed, out=kernels.line_aligned((len(packed), *packed[0].shape), packed[0].dtype))
        return PackedWeight(torch.from_numpy(tiles.reshape(*w.shape[:-2], *tiles.shape[1:])), w.shape[-2])

    def linear(self, x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
        out = torch.empty(x.shape[0], w.rows, dtype=x.dtype)
        kernels.matmul(x.numpy(), w.tiles.numpy(), out.numpy(), False)
        return out

    def linear_argmax(self, x: torch.Tensor, w: Weight) -> list[int]:
        """Each row's first maximum of linear(x, w) (a NaN counting as one): the greedy tokens."""
        return self.linear(x, w).numpy().argmax(axis=-1).tolist()

    def decoder_layers(self, x: torch.Tensor, layers: Layers, cache: KVCache, positions: torch.Tensor,
                       slots: torch.Tensor, cfg: LlamaConfig) -> None:  # fmt: skip
        """TorchOps.decoder_layers in one compiled call (layers_kernel): from Python, each of a
        forward's ~270 kernel calls costs more in overhead than the small ones compute."""
        self.layers_kernel(
            x.numpy(), positions.numpy(), slots.numpy(), cfg.rms_norm_eps, cfg.num_attention_heads,
            layers.attn_norm.numpy(), layers.wqkv.tiles.numpy(), layers.wo.tiles.numpy(),
            layers.mlp_norm.numpy(), layers.w_gate_up.tiles.numpy(), layers.w_gate_up.rows,
            layers.w_down.tiles.numpy(), as_numpy(cache.k), as_numpy(cache.v), cache.cos.numpy(), cache.sin.numpy(),
        )  # fmt: skip


class TorchOps:
    cache_dtype: torch.dtype | None = None
    packed_bf16 = False

    @staticmethod
    def cache_layout(slots: int, kv_heads: int, max_len: int, head_dim: int) -> tuple[tuple[int, ...], ...]:
        return (slots, kv_heads, max_len, head_dim), (slots, kv_heads, max_len, head_dim)

    def embedding(self, table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return table[tokens]

    def embedding_table(self, embed: torch.Tensor, tied_lm_head: Weight | None) -> torch.Tensor:
        return embed  # weight() keeps a matrix as it is: a tied lm_head is this tensor

    def weight(self, w: torch.Tensor) -> torch.Tensor:
        return w

    def decoder_layers(self, x: torch.Tensor, layers: Layers, cache: KVCache, positions: torch.Tensor,
                       slots: torch.Tensor, cfg: LlamaConfig) -> None:  # fmt: skip
        """x += each layer's attention, then its MLP, in place: the Llama decoder layer."""
        for i in range(cfg.num_hidden_layers):
            h = self.rmsnorm(x, layers.attn_norm[i], cfg.rms_norm_eps)
            qkv = self.linear(h, layers.wqkv[i])
            q = self.rope_store(
                qkv, cache.cos, cache.sin, positions, slots,
                cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cache.k[i], cache.v[i],
            )  # fmt: skip
            x += self.linear(self.attention(q, cache.k[i], cache.v[i], slots, positions), layers.wo[i])
            h = self.rmsnorm(x, layers.mlp_norm[i], cfg.rms_norm_eps)
            x += self.linear(self.swiglu(self.linear(h, layers.w_gate_up[i])), layers.w_down[i])

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.linear(x, w)

    def linear_argmax(self, x: torch.Tensor, w: torch.Tensor) -> list[int]:
        return F.linear(x, w).float().argmax(dim=-1).tolist()

    def rope_store(self, qkv, cos, sin, positions, slots, n_heads, n_kv, head_dim, k_cache, v_cache):
        m = qkv.shape[0]
        q, k, v = qkv.split([n_heads * head_dim, n_kv * head_dim, n_kv * head_dim], dim=-1)
        c, s = cos[positions][:, None, :], sin[positions][:, None, :]

        def rotate(t: torch.Tensor, heads: int) -> torch.Tensor:
            t = t.view(m, heads, head_dim)
            a, b = t[..., : head_dim // 2], t[..., head_dim // 2 :]
            return torch.cat([a * c - b * s, b * c + a * s], dim=-1)

        k_cache[slots, :, positions] = rotate(k, n_kv)
        v_cache[slots, :, positions] = v.reshape(m, n_kv, head_dim)
        return rotate(q, n_heads)

    def attention(self, q, k_cache, v_cache, slots, positions) -> torch.Tensor:
        m, n_heads, head_dim = q.shape
        length = int(positions.max()) + 1
        group = n_heads // k_cache.shape[1]
        keys = k_cache[slots, :, :length].repeat_interleave(group, dim=1)  # (M, H, T, Dh)
        values = v_cache[slots, :, :length].repeat_interleave(group, dim=1)
        visible = torch.arange(length, device=q.device)[None, :] <= positions[:, None]  # (M, T)
        out = F.scaled_dot_product_attention(q[:, :, None, :], keys, values, attn_mask=visible[:, None, None, :])
        return out.reshape(m, n_heads * head_dim)

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class CpuBf16Ops(CpuOps):
    """CPU, on AMX tiles (amx.py): every projection's product and attention's two products in
    bfloat16 terms summed in float32, over a bf16 cache; norms, rotary, softmax, SiLU and the
    residual stream are float32 (kernels.py's), all layers in one compiled call
    (amx.decoder_layers). A tile product computes each row alone in hardware, so a verification's
    rows match a step's bits, and a tile of up to 16 rows reads each weight once for all of them,
    so a verification's rows cost far less than as many steps (benchmarks/targets.py measures the
    ratio)."""

    cache_dtype = torch.bfloat16
    cache_layout = staticmethod(kernels.bf16_cache_shapes)
    packed_bf16 = True
    pack_weight = staticmethod(amx.pack_weight)
    layers_kernel = staticmethod(amx.decoder_layers)

    @staticmethod
    def unsupported() -> str | None:
        """Why this CPU (or OS) cannot run it, or None (amx.py asked when imported)."""
        return amx.unavailable()

    def weight(self, w: torch.Tensor) -> PackedWeight:
        return super().weight(w.to(torch.bfloat16))

    def linear(self, x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
        out = torch.empty(-(-len(x) // amx.ROWS) * amx.ROWS, w.tiles.shape[0] * amx.GROUP * 16)
        amx.matmul(x.numpy(), w.tiles.numpy(), out.numpy())
        return out[: len(x), : w.rows].contiguous()  # a copy only where N is no multiple of 32

    def linear_argmax(self, x: torch.Tensor, w: PackedWeight) -> list[int]:
        """Without the product written out (amx.matmul_argmax)."""
        best = np.empty(len(x), dtype=np.int64)
        amx.matmul_argmax(x.numpy(), w.tiles.numpy(), w.rows, best)
        return best.tolist()

    def embedding_table(self, embed: torch.Tensor, tied_lm_head: Weight | None) -> torch.Tensor:
        return embed.to(torch.bfloat16)  # amx.pack_weight's layout has no rows to look up

    def embedding(self, table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return table.index_select(0, tokens).float()  # index_select: cheaper than advanced indexing


class CpuAvx512Bf16Ops(CpuOps):
    """CPU without AMX but with AVX-512 BF16 (AMD Zen 4, Intel Cooper Lake): CpuOps with every
    projection's product and attention's two in bf16 terms summed in float32 (kernels.matmul
    over pack_bf16_weight's pairs, kernels.attention over the bf16 cache: one vdpbf16ps a pair),
    norms, rotary, softmax, SiLU and the residual stream float32. Half the bytes a step reads,
    twice the products an instruction, so prefills run much faster than on float32's FMAs, with
    the same per-row invariance (benchmarks/engine_ab.py --base HEAD --dtype bfloat16 compares
    the two)."""

    cache_dtype = torch.bfloat16
    cache_layout = staticmethod(kernels.bf16_cache_shapes)
    packed_bf16 = True
    pack_weight = staticmethod(kernels.pack_bf16_weight)

    @staticmethod
    def unsupported() -> str | None:
        return None if kernels.AVX512_BF16 else "no AVX-512 BF16"

    # the table as a bf16 copy, rows looked up as CpuBf16Ops does: gathering them from a tied
    # lm_head's pairs, across its tiles, costs more
    embedding_table = CpuBf16Ops.embedding_table
    embedding = CpuBf16Ops.embedding


BF16_OPS = (CpuBf16Ops, CpuAvx512Bf16Ops)  # the CPU engines with bf16 products, fastest first


def bf16_unsupported() -> str | None:
    """Why this CPU runs none of BF16_OPS, or None."""
    reasons = [ops.unsupported() for ops in BF16_OPS]
    return None if None in reasons else f"dtype bfloat16 on this CPU: {', '.join(reasons)}"


def bf16_ops() -> CpuOps:
    """The first of BF16_OPS this CPU runs."""
    for ops in BF16_OPS:
        if ops.unsupported() is None:
            return ops()
    raise RuntimeError(f"{bf16_unsupported()}; use dtype float32 (or auto)")


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """The tensor's memory as numpy: a bf16 tensor's bits as int16, numpy having no bf16."""
    return t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
