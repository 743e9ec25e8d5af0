"""Models made on the spot for tests: tiny random Llamas, a random guess head, and which bf16
engines this CPU runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from specdec.build.random_weights import write_random_llama
from specdec.engine.ops import BF16_OPS, CpuBf16Ops, bf16_unsupported

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 96,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "eos_token_id": 1,
}


def write_tiny_llama(path: Path, seed: int = 0, scale: float = 1.0, **overrides) -> Path:
    """A random-weight Llama of TINY's shape (overrides change it): exactness must hold for any
    weights, so these are honest tests of the loop; scale sharpens or flattens the logits."""
    return write_random_llama(path, {**TINY, **overrides}, seed, scale)


def write_guess_head(path: Path, seed: int = 3, width: int = 32) -> dict[str, torch.Tensor]:
    """A random guess head (specdec/engine/guess.py) for the tiny Llama; its weights."""
    g = torch.Generator().manual_seed(seed)
    size = TINY["hidden_size"]
    weights = {
        "fc1.weight": torch.randn(width, 2 * size, generator=g) / 8,
        "fc1.bias": torch.randn(width, generator=g) / 8,
        "fc2.weight": torch.randn(size, width, generator=g) / 4,
        "fc2.bias": torch.randn(size, generator=g) / 4,
        "candidates": torch.tensor([5, 9, 40, 41, 70]),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(path))
    return weights


# Only CPUs with AMX or AVX-512 BF16 run a bf16 engine (and pick it for dtype auto); on others
# these tests cannot run.
_BF16_UNAVAILABLE = bf16_unsupported()
needs_bf16 = pytest.mark.skipif(_BF16_UNAVAILABLE is not None, reason=f"bf16 engine: {_BF16_UNAVAILABLE}")
needs_amx = pytest.mark.skipif(CpuBf16Ops.unsupported() is not None, reason=f"AMX: {CpuBf16Ops.unsupported()}")
# Each CPU engine with bf16 products, as a test parameter: skipped on a CPU that cannot run it.
BF16_OPS_PARAMS = [
    pytest.param(
        ops, id=ops.__name__, marks=pytest.mark.skipif(ops.unsupported() is not None, reason=str(ops.unsupported()))
    )
    for ops in BF16_OPS
]
