"""Reads a Llama GGUF file with the gguf package into what numpy_llama needs: a config and float32
weights under Hugging Face names and layout. Quantized tensors go through gguf.quants.dequantize
(the gguf package's own implementation, independent of Specula's); q/k rows are un-permuted
back to HF layout so the NumPy reference ropes every model the HF (half-split) way.
"""
from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from numpy_llama import LlamaConfig  # noqa: E402
from tiny_models import unpermute_qk  # noqa: E402

_GGUF_TO_HF = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name: str) -> str | None:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    parts = gguf_name.split(".")
    if parts[0] == "blk" and parts[2] in _GGUF_TO_HF:
        return f"model.layers.{parts[1]}.{_GGUF_TO_HF[parts[2]]}.weight"
    return None  # rope_freqs and anything else are not weights of the HF model


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def read_config(reader) -> LlamaConfig:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"not a llama GGUF: general.architecture = {arch!r}")
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    n_vocab = _field(reader, "llama.vocab_size")
    if n_vocab is None:
        n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    scaling = None
    if _field(reader, "llama.rope.scaling.type") == "llama3":
        scaling = (float(_field(reader, "llama.rope.scaling.factor")),
                   float(_field(reader, "llama.rope.scaling.low_freq_factor", 1.0)),
                   float(_field(reader, "llama.rope.scaling.high_freq_factor", 4.0)),
                   int(_field(reader, "llama.rope.scaling.original_context_length")))
    return LlamaConfig(
        vocab=int(n_vocab),
        hidden=hidden,
        intermediate=int(_field(reader, "llama.feed_forward_length")),
        layers=int(_field(reader, "llama.block_count")),
        heads=heads,
        kv_heads=int(_field(reader, "llama.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, "llama.rope.dimension_count", hidden // heads)),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        llama3_scaling=scaling,
        tied=not any(t.name == "output.weight" for t in reader.tensors),
    )


def dequantized(t) -> np.ndarray:
    """A ReaderTensor as float32 [rows, cols] (HF order: GGUF dims are innermost first)."""
    import gguf
    data = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    return np.ascontiguousarray(data.reshape(shape), dtype=np.float32)


def load(path) -> tuple[LlamaConfig, dict[str, np.ndarray], dict[str, str]]:
    """(config, float32 weights with HF names and layout, {hf name: stored GGUF type name})."""
    import gguf
    reader = gguf.GGUFReader(str(path))
    cfg = read_config(reader)
    weights, types = {}, {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        w = dequantized(t)
        if name.endswith("q_proj.weight"):
            w = unpermute_qk(w, cfg.heads)
        elif name.endswith("k_proj.weight"):
            w = unpermute_qk(w, cfg.kv_heads)
        weights[name] = w
        types[name] = t.tensor_type.name
    return cfg, weights, types


def rope_freqs(path) -> np.ndarray | None:
    """The file's rope_freqs.weight divisors, if it has one."""
    import gguf
    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            return np.asarray(t.data, dtype=np.float32).copy()
    return None
