"""The operations the Llama forward needs, for three backends.

CpuOps: numba kernels with per-row invariant arithmetic (kernels.py); float32 only.
CpuBf16Ops: CpuOps's kernels, but each projection's product in bfloat16 on oneDNN (AMX).
TorchOps: plain torch, for CUDA (and as an independent implementation the tests compare with).
decoder_layers() runs every decoder layer over the rows in place: TorchOps's is the layer
written out, CpuOps's the same steps compiled into one call (kernels.decoder_layers). Both write
new keys/values into the cache before attention reads it, so rows of the same sequence in one
call attend to each other causally. linear() takes its weight in the layout weight() made of the
(N, K) matrix (or a stack of them): the CPU kernel's tiles, the matrix itself for torch; the key
cache is laid out as key_layout() says (values are (slots, kv_heads, max_len, head_dim)).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

from specdec.engine import kernels

if TYPE_CHECKING:
    from specdec.engine.model import KVCache, Layers, LlamaConfig


class PackedWeight(NamedTuple):
    tiles: torch.Tensor  # (..., ceil(N / TILE), K, TILE), kernels.pack_weight of each (N, K) matrix
    rows: int  # N

    @property
    def nbytes(self) -> int:  # as torch.Tensor.nbytes
        return self.tiles.nbytes


class Bf16Stack(NamedTuple):
    matrices: list[torch.Tensor]  # CpuBf16Ops.weight of each (N, K) matrix of a stack

    def __getitem__(self, i: int) -> torch.Tensor:  # type: ignore[override]
        return self.matrices[i]

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.matrices)


Weight = torch.Tensor | PackedWeight | Bf16Stack  # what ops.weight() makes of an (N, K) matrix or a stack


class CpuOps:
    @staticmethod
    def key_layout(slots: int, kv_heads: int, max_len: int, head_dim: int) -> tuple[int, ...]:
        """Keys in tiles of kernels.TILE positions, each tile position-minor: the layout in which
        kernels.attention reads a tile of keys as the weight of a product."""
        if head_dim % kernels.LANES:
            raise ValueError(f"head_dim: the CPU engine needs a multiple of {kernels.LANES}, got {head_dim}")
        return slots, kv_heads, -(-max_len // kernels.TILE), head_dim, kernels.TILE

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
        """(..., N, K) -> the tiles linear() takes (kernels.pack_weight of each matrix)."""
        matrices = w.reshape(-1, *w.shape[-2:]).numpy()
        tiles = np.stack([kernels.pack_weight(m) for m in matrices])
        return PackedWeight(torch.from_numpy(tiles.reshape(*w.shape[:-2], *tiles.shape[1:])), w.shape[-2])

    def linear(self, x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
        out = torch.empty(x.shape[0], w.rows, dtype=x.dtype)
        kernels.matmul(x.numpy(), w.tiles.numpy(), out.numpy(), False)
        return out

    def decoder_layers(self, x: torch.Tensor, layers: Layers, cache: KVCache, positions: torch.Tensor,
                       slots: torch.Tensor, cfg: LlamaConfig) -> None:  # fmt: skip
        """TorchOps.decoder_layers in one compiled call: from Python, each of a forward's ~270
        kernel calls cost more than the small ones compute (3.6 of a 22 ms step)."""
        kernels.decoder_layers(
            x.numpy(), positions.numpy(), slots.numpy(), cfg.rms_norm_eps, cfg.num_attention_heads,
            layers.attn_norm.numpy(), layers.wqkv.tiles.numpy(), layers.wqkv.rows, layers.wo.tiles.numpy(),
            layers.mlp_norm.numpy(), layers.w_gate_up.tiles.numpy(), layers.w_gate_up.rows,
            layers.w_down.tiles.numpy(), cache.k.numpy(), cache.v.numpy(), cache.cos.numpy(), cache.sin.numpy(),
        )  # fmt: skip


class TorchOps:
    @staticmethod
    def key_layout(slots: int, kv_heads: int, max_len: int, head_dim: int) -> tuple[int, ...]:
        return slots, kv_heads, max_len, head_dim

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


class CpuBf16Ops(TorchOps):
    """CPU, with every projection's product in bfloat16: weights rounded to bf16 and packed for
    oneDNN's kernel (AMX tiles on CPUs that have them), inputs rounded to bf16, sums in float32.
    The products then cost about the same for 1 to 16 rows, where CpuOps's FMA kernels pay for
    each row: on a Sapphire Rapids Xeon a forward of 9 rows took 1.14x one row's time (float32:
    1.30x), a 250-token prefill 0.4x float32's. Everything else (norms, rotary, attention, SiLU,
    the residual stream and the cache) is CpuOps's float32 kernels, through TorchOps's layer.

    Row invariance, which exactness stands on, is oneDNN's behaviour here, not a guarantee: with
    weights packed for one row, its AMX kernel gave every row the same bits for every number of
    rows M from 1 to 320, and at 512, 1024 and 2048, on 1 and 2 threads, where K <= MAX_K; but
    at K = 1536 (the down projection) it sums in another order for some M from 130 up. So a
    product over more than MAX_K terms takes at most MAX_ROWS rows a call, and when a model
    loads assert_row_invariant checks each decoder weight shape at every M up to MAX_ROWS and at
    CHECKED_ROWS beyond, and the lm_head at LM_HEAD_ROWS (0.4 s; all counts would take 3.2).
    """

    MAX_K = 1024
    MAX_ROWS = 128
    CHECKED_ROWS = (160, 256, 512, 1024)
    LM_HEAD_ROWS = (*range(2, 18), 24, 32, 64, 128, 160, 256)  # its rows: one per draft token + 1

    key_layout = staticmethod(CpuOps.key_layout)

    @staticmethod
    @functools.cache
    def unsupported() -> str | None:
        """Why this CPU cannot run bf16 products exactly, or None. torch's oneDNN bf16 product
        needs AVX-512 (elsewhere it raises at the first product), and without AMX its rows depend
        on their batch (this Xeon with ONEDNN_MAX_CPU_ISA=AVX512_CORE: from 19 rows at K = 576;
        AVX512_CORE_BF16: from 5 rows at K = 1536), which a probe of SmolLM2's weight shapes at
        up to MAX_ROWS rows finds (0.2 s, once a process). A model's weights are checked again
        when it loads."""
        ops, g = CpuBf16Ops(), torch.Generator().manual_seed(0)
        try:
            for n, k in ((960, 576), (3072, 576), (576, 1536)):  # q/k/v, gate/up, down
                ops.assert_row_invariant(ops.weight(torch.randn(n, k, generator=g)), tuple(range(2, ops.MAX_ROWS + 1)))
        except RuntimeError as err:
            reason = str(err).splitlines()[0]
            return reason if reason.startswith("dtype") else f"dtype bfloat16 on this CPU: no oneDNN product ({reason})"
        return None

    def weight(self, w: torch.Tensor) -> torch.Tensor | Bf16Stack:
        if w.dim() == 3:
            return Bf16Stack([self.weight(m) for m in w])
        return torch.ops.mkldnn._reorder_linear_weight(w.to(torch.bfloat16), 1)

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x16 = x.to(torch.bfloat16)
        if len(x) <= self.MAX_ROWS or w.shape[1] <= self.MAX_K:
            return torch.ops.mkldnn._linear_pointwise(x16, w, None, "none", [], "").float()
        return torch.cat([self.linear(rows, w) for rows in x16.split(self.MAX_ROWS)])

    def assert_row_invariant(self, w: torch.Tensor, counts: tuple[int, ...] | None = None) -> None:
        """Raise unless a product with the packed weight w gives every row the bits of the same
        row computed alone, for each number of rows in `counts` (default: every one up to
        MAX_ROWS, and CHECKED_ROWS where K <= MAX_K)."""
        if counts is None:
            counts = (*range(2, self.MAX_ROWS + 1), *(self.CHECKED_ROWS if w.shape[1] <= self.MAX_K else ()))
        x = torch.randn(max(counts), w.shape[1], generator=torch.Generator().manual_seed(0))
        alone = torch.cat([self.linear(row, w) for row in x.split(1)])
        for m in counts:
            if not torch.equal(self.linear(x[:m], w), alone[:m]):
                raise RuntimeError(
                    f"dtype bfloat16 on this CPU: oneDNN computes a row of a ({w.shape[0]} x {w.shape[1]}) product "
                    f"differently when {m} rows share it, so speculation would not be exact; use dtype float32"
                )

    def embedding_table(self, embed: torch.Tensor, tied_lm_head: Weight | None) -> torch.Tensor:
        return embed.to(torch.bfloat16)  # oneDNN's packed layout has no rows to look up

    def embedding(self, table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return table[tokens].float()

    rmsnorm = CpuOps.rmsnorm

    def rope_store(self, qkv, cos, sin, positions, slots, n_heads, n_kv, head_dim, k_cache, v_cache):
        q = torch.empty(qkv.shape[0], n_heads, head_dim)
        kernels.rope_store(qkv.numpy(), cos.numpy(), sin.numpy(), positions.numpy(), slots.numpy(), n_heads, n_kv,
                           q.numpy(), k_cache.numpy(), v_cache.numpy())  # fmt: skip
        return q

    def attention(self, q, k_cache, v_cache, slots, positions) -> torch.Tensor:
        out = torch.empty(q.shape[0], q.shape[1] * q.shape[2])
        kernels.attention(q.numpy(), k_cache.numpy(), v_cache.numpy(), slots.numpy(), positions.numpy(), out.numpy())
        return out

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        out = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2)
        kernels.swiglu(gate_up.numpy(), out.numpy())
        return out
