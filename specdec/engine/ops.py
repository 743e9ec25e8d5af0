"""The operations the Llama forward needs, for two backends.

CpuOps: numba kernels with per-row invariant arithmetic (kernels.py); float32 only.
TorchOps: plain torch, for CUDA (and as an independent implementation the tests compare with).
Both write new keys/values into the cache before attention reads it, so rows of the same
sequence in one call attend to each other causally. linear() takes its weight in the layout
weight() made of the (N, K) matrix: the CPU kernel's tiles, the matrix itself for torch; the
key cache is laid out as key_layout() says (values are (slots, kv_heads, max_len, head_dim)).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from specdec.engine import kernels


class PackedWeight(NamedTuple):
    tiles: torch.Tensor  # (ceil(N / TILE), K, TILE), kernels.pack_weight
    rows: int  # N

    @property
    def nbytes(self) -> int:  # as torch.Tensor.nbytes
        return self.tiles.nbytes


Weight = torch.Tensor | PackedWeight  # what ops.weight() makes of an (N, K) matrix


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

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out = torch.empty_like(x)
        kernels.rmsnorm(x.numpy(), weight.numpy(), eps, out.numpy())
        return out

    def weight(self, w: torch.Tensor) -> PackedWeight:
        """(N, K) -> the tiles linear() takes (kernels.pack_weight)."""
        return PackedWeight(torch.from_numpy(kernels.pack_weight(w.numpy())), w.shape[0])

    def linear(self, x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
        out = torch.empty(x.shape[0], w.rows, dtype=x.dtype)
        kernels.matmul(x.numpy(), w.tiles.numpy(), out.numpy(), False)
        return out

    def linear_residual(self, x: torch.Tensor, w: PackedWeight, residual: torch.Tensor) -> None:
        kernels.matmul(x.numpy(), w.tiles.numpy(), residual.numpy(), True)

    def rope_store(self, qkv, cos, sin, positions, slots, n_heads, n_kv, head_dim, k_cache, v_cache):
        q = torch.empty(qkv.shape[0], n_heads, head_dim, dtype=qkv.dtype)
        kernels.rope_store(
            qkv.numpy(), cos.numpy(), sin.numpy(), positions.numpy(), slots.numpy(),
            n_heads, n_kv, q.numpy(), k_cache.numpy(), v_cache.numpy(),
        )  # fmt: skip
        return q

    def attention(self, q, k_cache, v_cache, slots, positions) -> torch.Tensor:
        out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype)
        kernels.attention(q.numpy(), k_cache.numpy(), v_cache.numpy(), slots.numpy(), positions.numpy(), out.numpy())
        return out

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        out = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2, dtype=gate_up.dtype)
        kernels.swiglu(gate_up.numpy(), out.numpy())
        return out


class TorchOps:
    @staticmethod
    def key_layout(slots: int, kv_heads: int, max_len: int, head_dim: int) -> tuple[int, ...]:
        return slots, kv_heads, max_len, head_dim

    def embedding(self, table: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return table[tokens]

    def weight(self, w: torch.Tensor) -> torch.Tensor:
        return w

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.linear(x, w)

    def linear_residual(self, x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor) -> None:
        residual += F.linear(x, w)

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
