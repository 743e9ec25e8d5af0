"""Random-weight Llama checkpoints in Hugging Face layout: models of any shape made on the spot
(tests, and the GPU check where the real weights cannot travel). Exactness must hold for any
weights, so a random model is an honest test of speculative decoding."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

# SmolLM2-135M-Instruct's shape (the embedded model; see build/gguf_convert.py)
SMOLLM2_SHAPE = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "eos_token_id": 2,
}


def write_random_llama(path: Path, config: dict, seed: int = 0, scale: float = 1.0) -> Path:
    """A Llama of `config` with random weights at path (config.json, model.safetensors). scale
    sharpens (large) or flattens (small) its logits."""
    cfg = {**config, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    g = torch.Generator().manual_seed(seed)
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, h, kv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * (scale / shape[-1] ** 0.5)

    sd = {
        "model.embed_tokens.weight": torch.randn(v, d, generator=g),
        "model.norm.weight": 1 + 0.1 * torch.randn(d, generator=g),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd |= {
            p + "input_layernorm.weight": 1 + 0.1 * torch.randn(d, generator=g),
            p + "post_attention_layernorm.weight": 1 + 0.1 * torch.randn(d, generator=g),
            p + "self_attn.q_proj.weight": w(h * hd, d),
            p + "self_attn.k_proj.weight": w(kv * hd, d),
            p + "self_attn.v_proj.weight": w(kv * hd, d),
            p + "self_attn.o_proj.weight": w(d, h * hd),
            p + "mlp.gate_proj.weight": w(f, d),
            p + "mlp.up_proj.weight": w(f, d),
            p + "mlp.down_proj.weight": w(d, f),
        }
    if not cfg["tie_word_embeddings"]:
        sd["lm_head.weight"] = w(v, d) * 4
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: t.contiguous() for k, t in sd.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    return path
