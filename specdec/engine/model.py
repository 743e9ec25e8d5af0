"""A Llama decoder over a static, slot-based KV cache, in the spirit of gpt-fast.

One forward takes any set of rows (token, position, slot): prompt prefills, single decode steps
and k-token verifications of different sequences go through together, and each row's result is
the same as if it had been computed alone (on CPU, see kernels.py). Logits are computed only for
the rows the caller asks for, since the lm_head is the largest matrix of a small model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from specdec.engine import kernels
from specdec.engine.ops import CpuOps, TorchOps, Weight, bf16_ops, bf16_unsupported

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: str) -> str:
    """The profile's dtype, with "auto" made concrete: bfloat16 on CUDA and on a CPU with AMX
    bf16 tiles (CpuBf16Ops) or AVX-512 BF16 (CpuAvx512Bf16Ops), whose bf16 products make steps
    and prefills faster than float32's (benchmarks/engine_ab.py --base HEAD --dtype bfloat16
    compares them); float32 on other CPUs (where bf16 products are slow, or their rows depend on
    their batch, or there are none: ops.bf16_unsupported())."""
    if dtype != "auto":
        return dtype
    if torch.device(device).type == "cuda":
        return "bfloat16"
    return "bfloat16" if bf16_unsupported() is None else "float32"


@dataclass(frozen=True)
class LlamaConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_id: int | None
    rope_scaling: dict | None = None

    @classmethod
    def from_dir(cls, model_dir: Path) -> LlamaConfig:
        raw = json.loads((Path(model_dir) / "config.json").read_text())
        heads = raw["num_attention_heads"]
        eos = raw.get("eos_token_id")
        rope_theta = raw.get("rope_theta", (raw.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        return cls(
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads", heads),
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            vocab_size=raw["vocab_size"],
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
            rope_scaling=raw.get("rope_scaling"),
        )


def rope_tables(cfg: LlamaConfig, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: (length, head_dim / 2), computed as Hugging Face does (float32), with Llama 3
    frequency scaling when the checkpoint asks for it."""
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float() / cfg.head_dim))
    scaling = cfg.rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv_freq = torch.where(medium, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)
    freqs = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq.float())
    return freqs.cos().contiguous(), freqs.sin().contiguous()


@dataclass
class Layers:
    """Every decoder layer's weights, stacked along a first axis of num_hidden_layers (L).
    Projection weights are (out, in) matrices in the layout of ops.weight()."""

    attn_norm: torch.Tensor  # (L, D)
    wqkv: Weight  # L x ((H + 2G) * Dh, D)  q, k, v rows fused: one pass over memory
    wo: Weight  # L x (D, H * Dh)
    mlp_norm: torch.Tensor  # (L, D)
    w_gate_up: Weight  # L x (2F, D)  gate and up fused
    w_down: Weight  # L x (D, F)


class Llama:
    def __init__(
        self, model_dir: Path, device: str = "cpu", dtype: str = "float32", ops: CpuOps | TorchOps | None = None
    ):
        """ops: the implementation of the forward's operations; default: on CPU the numba
        kernels (dtype bfloat16: with bf16 products, ops.bf16_ops()), on CUDA torch."""
        self.cfg = LlamaConfig.from_dir(model_dir)
        self.device = torch.device(device)
        dtype = resolve_dtype(dtype, device)
        self.dtype = DTYPES[dtype]
        if self.device.type == "cpu":
            if dtype == "float16":
                raise ValueError("dtype: the CPU engine computes in float32 or with bfloat16 products, not float16")
            self.ops = ops or (bf16_ops() if dtype == "bfloat16" else CpuOps())
            self.dtype = torch.float32  # activations, norms and cache; the bf16 ops round their weights themselves
        else:
            self.ops = ops or TorchOps()
        self._load(Path(model_dir))

    def _load(self, model_dir: Path) -> None:
        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no .safetensors weights in {model_dir}")
        sd: dict[str, torch.Tensor] = {}
        for f in files:
            sd.update(load_file(str(f)))

        def take(name: str) -> torch.Tensor:
            loaded = sd.pop(name)
            t = loaded.to(self.device, self.dtype).contiguous()
            # the loaded tensors share the file's one buffer, which any tensor kept as loaded (a
            # norm) would keep whole beside the packed copies: copy what is still in it
            return t.clone() if t.data_ptr() == loaded.data_ptr() else t

        linear = self.ops.weight
        embed = take("model.embed_tokens.weight")

        def stacked(*names: str) -> torch.Tensor:
            """Each layer's named weights (concatenated when several), stacked over the layers."""
            per_layer = range(self.cfg.num_hidden_layers)
            return torch.stack([torch.cat([take(f"model.layers.{i}.{n}") for n in names]) for i in per_layer])

        self.layers = Layers(
            attn_norm=stacked("input_layernorm.weight"),
            wqkv=linear(stacked(*(f"self_attn.{n}_proj.weight" for n in "qkv"))),
            wo=linear(stacked("self_attn.o_proj.weight")),
            mlp_norm=stacked("post_attention_layernorm.weight"),
            w_gate_up=linear(stacked("mlp.gate_proj.weight", "mlp.up_proj.weight")),
            w_down=linear(stacked("mlp.down_proj.weight")),
        )
        self.norm = take("model.norm.weight")
        tied = self.cfg.tie_word_embeddings
        self.lm_head = linear(embed if tied else take("lm_head.weight"))
        self.embed = self.ops.embedding_table(embed, self.lm_head if tied else None)

    def weight_bytes(self) -> int:
        """Bytes of the weights each forward reads: all but the embedding table, of which it
        reads a row per token (in float32 a tied table is the lm_head: counted once)."""
        return sum(t.nbytes for t in (self.lm_head, self.norm, *vars(self.layers).values()))

    def new_cache(self, slots: int, max_len: int) -> KVCache:
        dtype = self.ops.cache_dtype or self.dtype
        return KVCache(self.cfg, slots, max_len, self.device, dtype, self.ops.cache_layout)

    @torch.inference_mode()
    def forward(
        self,
        cache: KVCache,
        tokens: torch.Tensor,  # (M,) int64
        positions: torch.Tensor,  # (M,) int64, position of each token in its sequence
        slots: torch.Tensor,  # (M,) int64, cache slot of each token's sequence
        logit_rows: torch.Tensor,  # (R,) int64, rows whose next-token logits are wanted
    ) -> torch.Tensor:  # (R, V) float32
        return self.logits(self.hidden(cache, tokens, positions, slots, logit_rows))

    @torch.inference_mode()
    def hidden(
        self,
        cache: KVCache,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        logit_rows: torch.Tensor,
    ) -> torch.Tensor:
        """(R, D): forward()'s final hidden states, the lm_head's input."""
        cfg, ops = self.cfg, self.ops
        x = ops.embedding(self.embed, tokens)
        ops.decoder_layers(x, self.layers, cache, positions, slots, cfg)  # the layer: TorchOps.decoder_layers
        return ops.rmsnorm(x[logit_rows].contiguous(), self.norm, cfg.rms_norm_eps)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (R, V) float32
        return self.ops.linear(hidden, self.lm_head).float()

    @torch.inference_mode()
    def greedy_tokens(self, hidden: torch.Tensor) -> list[int]:
        """Each row's argmax of logits(hidden), where the ops need not write the logits out."""
        return self.ops.linear_argmax(hidden, self.lm_head)

    def embedding(self, tokens: torch.Tensor) -> torch.Tensor:  # (N, D) float32: the tokens' rows
        return self.ops.embedding(self.embed, tokens).float()


class KVCache:
    """Preallocated keys/values, (layers, *shape) for the shapes layout(slots, kv_heads, max_len,
    head_dim) gives: the ops' layout. Zeros: positions never written hold no NaN for a product
    to multiply by a probability of 0 (kernels.attention); on CPU allocated by numpy, whose
    calloc leaves the pages unbacked until a sequence writes them (torch.zeros writes them all:
    the whole cache resident from the start)."""

    def __init__(
        self, cfg: LlamaConfig, slots: int, max_len: int, device: torch.device, dtype: torch.dtype,
        layout: Callable[[int, int, int, int], tuple[tuple[int, ...], ...]],
    ):  # fmt: skip
        keys, values = layout(slots, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = _zeros((cfg.num_hidden_layers, *keys), device, dtype)
        self.v = _zeros((cfg.num_hidden_layers, *values), device, dtype)
        self.max_len = max_len
        cos, sin = rope_tables(cfg, max_len)
        self.cos, self.sin = cos.to(device), sin.to(device)

    def copy_prefix(self, source: int, slot: int, length: int) -> None:
        """Slot `slot`'s keys/values of positions 0..length-1 become slot `source`'s. In every
        layout a slot's positions ascend along its third axis, in blocks of equal size: the
        blocks that hold those positions are copied whole, and the positions after them that a
        block also holds are written by the sequence before it reads them (and until then are
        finite, as attention needs: see above)."""
        for t in (self.k, self.v):
            blocks = t.shape[3]
            count = min(blocks, length * blocks // self.max_len + 1)
            t[:, slot, :, :count] = t[:, source, :, :count]


def _zeros(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    if device.type != "cpu":
        return torch.zeros(shape, device=device, dtype=dtype)
    bits = torch.int16 if dtype == torch.bfloat16 else dtype  # numpy has no bfloat16
    numpy_dtype = torch.empty(0, dtype=bits).numpy().dtype
    return torch.from_numpy(kernels.line_aligned(shape, numpy_dtype, zeros=True)).view(dtype)
