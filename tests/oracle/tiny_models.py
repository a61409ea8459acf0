"""Random-weight tiny Llama checkpoints, written from the same weights as a Hugging Face directory
(config.json, model.safetensors, tokenizer.json) and as a GGUF v3 file (llama.cpp's conventions:
q/k rows permuted for adjacent-pair RoPE, rope_freqs for llama3 scaling, optional quantized types).

Weights come from splitmix64 of (seed, tensor name, element index), not np.random, so they are
bit-identical on every machine and numpy version (golden fixtures carry their sha256).

    python tests/oracle/tiny_models.py OUT_DIR [VARIANT ...]   writes the checkpoints
"""
from __future__ import annotations

import hashlib
import json
import math
import pathlib
import sys
from dataclasses import dataclass, field

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import kquants  # noqa: E402
import tiny_tokenizer  # noqa: E402

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_GAMMA = 0x9E3779B97F4A7C15


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic is exact in numpy uint64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _name_key(seed: int, name: str) -> int:
    h = int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little")
    return h


def uniform(seed: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Deterministic uniform [-1, 1) float64 values for tensor `name`: element i is
    mix64(key(seed, name) + (i+1) * golden_gamma), top 53 bits -> [0, 1)."""
    n = int(np.prod(shape))
    key = np.uint64(_name_key(seed, name))
    idx = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = _mix64(key + idx * np.uint64(_GAMMA))
    u = (z >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
    return (2.0 * u - 1.0).reshape(shape)


@dataclass(frozen=True)
class TinySpec:
    """One tiny checkpoint. gguf_types maps a tensor role to its GGUF type name:
    'matrix' (every projection), 'embed' (token_embd), 'output'; roles absent default to 'matrix'.
    Per-tensor overrides go in gguf_overrides (GGUF name suffix -> type)."""

    name: str
    seed: int
    hidden: int = 64
    intermediate: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    vocab: int = 320
    tied: bool = False
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    max_positions: int = 1024
    # llama3 rope scaling (factor, low_freq_factor, high_freq_factor, original_max_position) or None.
    llama3_scaling: tuple[float, float, float, int] | None = None
    hf_dtype: str | None = "F32"  # safetensors dtype; None: no HF directory for this variant
    gguf_types: dict = field(default_factory=lambda: {"matrix": "F32"})
    gguf_overrides: dict = field(default_factory=dict)

    @property
    def quantized(self) -> bool:
        """True when some GGUF tensor is block-quantized (not F32/F16/BF16)."""
        return any(t not in ("F32", "F16", "BF16") for t in list(self.gguf_types.values()) + list(self.gguf_overrides.values()))


# original_max_position 256 with head_dim 16, theta 1e4: wavelengths 2*pi*1e4^(i/8) are 6.3, 20, 63
# (< 64: unscaled), 199 (between 64 and 256: smoothed), 628 ... 19869 (> 256: divided by factor),
# so all three branches of the llama3 formula are exercised.
LLAMA3_SCALING = (8.0, 1.0, 4.0, 256)

VARIANTS: dict[str, TinySpec] = {s.name: s for s in [
    TinySpec("gqa_untied", seed=1),
    TinySpec("gqa_tied", seed=2, tied=True),
    TinySpec("llama3_rope", seed=3, tied=True, rope_theta=10000.0, llama3_scaling=LLAMA3_SCALING),
    TinySpec("mqa_untied", seed=4, kv_heads=1),
    TinySpec("bf16", seed=5, hf_dtype="BF16", gguf_types={"matrix": "BF16"}),
    TinySpec("f16", seed=6, hf_dtype="F16", gguf_types={"matrix": "F16"}),
    TinySpec("q8_0", seed=7, hf_dtype=None, gguf_types={"matrix": "Q8_0"}),
    TinySpec("q4_0", seed=8, hf_dtype=None, gguf_types={"matrix": "Q4_0"}),
    # Like the default SmolLM2 file: tied, token_embd Q8_0, every other matrix Q4_1.
    TinySpec("q4_1_tied", seed=9, tied=True, hf_dtype=None, gguf_types={"matrix": "Q4_1", "embed": "Q8_0"}),
    # What llama.cpp writes for a Q4_K_M of a model whose rows are not whole 256-value super-blocks
    # (SmolLM2-135M, -360M): Q5_0 where Q4_K was asked, Q8_0 where Q6_K was. Loading converts Q5_0
    # to Q8_0 (model/tensor.h, kernel_view).
    TinySpec("q5_0", seed=11, tied=True, hf_dtype=None, gguf_types={"matrix": "Q5_0", "embed": "Q8_0"},
             gguf_overrides={"attn_v": "Q8_0", "ffn_down": "Q8_0"}),
    # K-quants need rows of 256 values: hidden 256, head_dim 64. Mix as in a Q4_K_M file.
    TinySpec("k_quants", seed=10, hidden=256, intermediate=512, head_dim=64, hf_dtype=None,
             gguf_types={"matrix": "Q4_K", "embed": "Q4_K", "output": "Q6_K"},
             gguf_overrides={"attn_v": "Q6_K", "ffn_down": "Q6_K"}),
    # The five-bit K-quant mix of a Q5_K_M file, with Q5_1 (what llama.cpp writes for Q5_K in rows
    # that are not whole super-blocks) for the embedding, q and up.
    TinySpec("q5_k_m", seed=12, hidden=256, intermediate=512, head_dim=64, hf_dtype=None,
             gguf_types={"matrix": "Q5_K", "embed": "Q5_1", "output": "Q6_K"},
             gguf_overrides={"attn_q": "Q5_1", "ffn_up": "Q5_1", "attn_v": "Q6_K"}),
    # A Q3_K file's types: Q3_K, and IQ4_NL (llama.cpp's fallback for Q2_K and Q3_K in rows that are
    # not whole super-blocks) for the embedding, q and up. Loading converts them exactly to Q6_K and
    # Q8_0 (model/tensor.h, kernel_view).
    TinySpec("q3_k", seed=13, hidden=256, intermediate=512, head_dim=64, hf_dtype=None,
             gguf_types={"matrix": "Q3_K", "embed": "IQ4_NL", "output": "Q6_K"},
             gguf_overrides={"attn_q": "IQ4_NL", "ffn_up": "IQ4_NL"}),
    # A Q2_K file's types: Q2_K, and Q3_K for attn_v, ffn_down and attn_output (llama.cpp's
    # llama_tensor_get_type for its Q2_K mix).
    TinySpec("q2_k", seed=15, hidden=256, intermediate=512, head_dim=64, hf_dtype=None,
             gguf_types={"matrix": "Q2_K", "embed": "Q2_K", "output": "Q6_K"},
             gguf_overrides={"attn_v": "Q3_K", "ffn_down": "Q3_K", "attn_output": "Q3_K"}),
    # An IQ4_XS file's types: IQ4_XS, and IQ4_NL (llama.cpp's fallback for IQ4_XS in rows that are
    # not whole super-blocks) for the embedding, q and up.
    TinySpec("iq4_xs", seed=14, hidden=256, intermediate=512, head_dim=64, hf_dtype=None,
             gguf_types={"matrix": "IQ4_XS", "embed": "IQ4_NL", "output": "Q6_K"},
             gguf_overrides={"attn_q": "IQ4_NL", "ffn_up": "IQ4_NL"}),
    # The IQ1, IQ2 and IQ3 types (random blocks at the weights' scale: kquants.iq_random_blocks),
    # one matrix kind each; no fast kernel reads them, so both paths run them on the f32 kernels.
    TinySpec("iq1_iq3", seed=16, hidden=256, intermediate=512, head_dim=64, hf_dtype=None,
             gguf_types={"matrix": "IQ2_XXS", "embed": "IQ2_XS", "output": "Q6_K"},
             gguf_overrides={"attn_q": "IQ2_S", "attn_k": "IQ3_XXS", "attn_v": "IQ3_S", "ffn_up": "IQ1_S",
                             "ffn_down": "IQ1_M"}),
]}

HF_VARIANTS = [n for n, s in VARIANTS.items() if s.hf_dtype is not None]


# ---------------------------------------------------------------- weights (HF names and layout)

def hf_tensor_shapes(s: TinySpec) -> dict[str, tuple[int, ...]]:
    shapes = {"model.embed_tokens.weight": (s.vocab, s.hidden)}
    for i in range(s.layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (s.hidden,),
            p + "self_attn.q_proj.weight": (s.heads * s.head_dim, s.hidden),
            p + "self_attn.k_proj.weight": (s.kv_heads * s.head_dim, s.hidden),
            p + "self_attn.v_proj.weight": (s.kv_heads * s.head_dim, s.hidden),
            p + "self_attn.o_proj.weight": (s.hidden, s.heads * s.head_dim),
            p + "post_attention_layernorm.weight": (s.hidden,),
            p + "mlp.gate_proj.weight": (s.intermediate, s.hidden),
            p + "mlp.up_proj.weight": (s.intermediate, s.hidden),
            p + "mlp.down_proj.weight": (s.hidden, s.intermediate),
        })
    shapes["model.norm.weight"] = (s.hidden,)
    if not s.tied:
        shapes["lm_head.weight"] = (s.vocab, s.hidden)
    return shapes


def _scale(s: TinySpec, name: str, shape) -> tuple[float, float]:
    """(offset, half-width) of the uniform distribution for a tensor.

    Projections get half-width sqrt(3/fan_in) (unit output variance for unit input); q and k get
    1.5x that so attention scores (std ~2) make the softmax neither uniform nor one-hot. Norm
    weights are 1 +- 0.25 so a missing norm weight shows. The output matrix (embedding when tied)
    gets 2.5*sqrt(3/hidden): logits have std ~2.5, range ~+-10, far from float32 trouble."""
    if name.endswith("layernorm.weight") or name == "model.norm.weight":
        return 1.0, 0.25
    if name == "lm_head.weight" or (name == "model.embed_tokens.weight" and s.tied):
        return 0.0, 2.5 * math.sqrt(3.0 / s.hidden)
    if name == "model.embed_tokens.weight":
        return 0.0, 1.0
    fan_in = shape[1]
    gain = 1.5 if ("q_proj" in name or "k_proj" in name) else 1.0
    return 0.0, gain * math.sqrt(3.0 / fan_in)


def make_weights(s: TinySpec) -> dict[str, np.ndarray]:
    """The model's float32 weights, HF names and layout (q/k rows un-permuted)."""
    out = {}
    for name, shape in hf_tensor_shapes(s).items():
        offset, width = _scale(s, name, shape)
        out[name] = (offset + width * uniform(s.seed, name, shape)).astype(np.float32)
    return out


def weights_sha256(weights: dict[str, np.ndarray]) -> str:
    """sha256 over (name, shape, little-endian float32 bytes) in sorted name order."""
    h = hashlib.sha256()
    for name in sorted(weights):
        w = np.ascontiguousarray(weights[name], dtype="<f4")
        h.update(name.encode() + b"\0" + json.dumps(list(w.shape)).encode() + b"\0")
        h.update(w.tobytes())
    return h.hexdigest()


def round_to_dtype(w: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values exactly as stored in `dtype` (F32, F16, BF16 round to nearest even)."""
    if dtype == "F32":
        return w.astype(np.float32)
    if dtype == "F16":
        return w.astype(np.float16).astype(np.float32)
    if dtype == "BF16":
        return _bf16_bits_to_f32(_f32_to_bf16_bits(w))
    raise ValueError(dtype)


def _f32_to_bf16_bits(w: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(w, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even (no NaNs here)


def _bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------- rope

def llama3_inv_freq(head_dim: int, theta: float, scaling) -> np.ndarray:
    """float64 inverse frequencies with llama3 scaling (MODELS.md / transformers' formula)."""
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if scaling is None:
        return inv
    factor, low, high, original = scaling
    wavelen = 2 * math.pi / inv
    s = (original / wavelen - low) / (high - low)
    smoothed = (1 - s) * inv / factor + s * inv
    return np.where(wavelen < original / high, inv, np.where(wavelen > original / low, inv / factor, smoothed))


def converter_rope_freqs(s: TinySpec) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's convert_hf_to_gguf.py computes it: one divisor per pair
    (1, factor, or 1/((1-smooth)/factor + smooth)), frequencies in float32 as torch does."""
    factor, low, high, original = s.llama3_scaling
    freqs = 1.0 / (np.float32(s.rope_theta) ** (np.arange(0, s.head_dim, 2, dtype=np.float32) / np.float32(s.head_dim)))
    out = []
    for f in freqs.astype(np.float64):
        wavelen = 2 * math.pi / f
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (n_head = kv heads for k):
    within each head, rows (i, i + d/2) become adjacent rows (2i, 2i+1)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of permute_qk (transformers' reverse_permute for GGUF)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ---------------------------------------------------------------- Hugging Face directory

def hf_config(s: TinySpec) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": s.vocab,
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "max_position_embeddings": s.max_positions,
        "rms_norm_eps": s.rms_eps,
        "rope_theta": s.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": s.tied,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": tiny_tokenizer.BOS_ID,
        "eos_token_id": tiny_tokenizer.EOS_ID,
        "torch_dtype": {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[s.hf_dtype or "F32"],
    }
    if s.llama3_scaling is not None:
        factor, low, high, original = s.llama3_scaling
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                               "high_freq_factor": high, "original_max_position_embeddings": original}
    return cfg


def write_safetensors(path: pathlib.Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """Writes {name: (dtype, array)} by hand (F32 / F16 / BF16 bits), so no torch is needed."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        if dtype == "F32":
            raw = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        elif dtype == "F16":
            raw = np.ascontiguousarray(arr, dtype="<f2").tobytes()
        elif dtype == "BF16":
            raw = np.ascontiguousarray(_f32_to_bf16_bits(arr), dtype="<u2").tobytes()
        else:
            raise ValueError(dtype)
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def write_hf_dir(s: TinySpec, weights: dict[str, np.ndarray], directory: pathlib.Path) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf_config(s), indent=1))
    (directory / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": tiny_tokenizer.BOS_ID, "eos_token_id": tiny_tokenizer.EOS_ID}))
    # Norms stay float32 in every dtype, like the GGUF side (tiny norms are not what is tested).
    write_safetensors(directory / "model.safetensors",
                      {n: ("F32" if w.ndim == 1 else s.hf_dtype, w) for n, w in weights.items()})
    tiny_tokenizer.write_hf_tokenizer(directory, s.vocab)
    return directory


# ---------------------------------------------------------------- GGUF

_HF_TO_GGUF = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{_HF_TO_GGUF[rest.removesuffix('.weight')]}.weight"


def gguf_type_of(s: TinySpec, gname: str) -> str:
    if gname.endswith("_norm.weight") or gname == "output_norm.weight":
        return "F32"
    role = "embed" if gname == "token_embd.weight" else "output" if gname == "output.weight" else "matrix"
    short = gname.split(".")[-2]
    return s.gguf_overrides.get(short, s.gguf_types.get(role, s.gguf_types["matrix"]))


def write_gguf(s: TinySpec, weights: dict[str, np.ndarray], path: pathlib.Path, *,
               permute: bool = True, scaling_keys: bool = True) -> pathlib.Path:
    """permute=False writes q/k in HF row order (a broken converter: negative controls);
    scaling_keys=False leaves only rope_freqs.weight, exactly as convert_hf_to_gguf.py does."""
    import gguf
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"specula-tiny-{s.name}")
    w.add_block_count(s.layers)
    w.add_context_length(s.max_positions)
    w.add_embedding_length(s.hidden)
    w.add_feed_forward_length(s.intermediate)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(s.rms_eps)
    w.add_rope_dimension_count(s.head_dim)
    w.add_vocab_size(s.vocab)
    if s.llama3_scaling is not None and scaling_keys:
        factor, low, high, original = s.llama3_scaling
        # llama.cpp itself reads only rope_freqs.weight for llama3; these keys say the same for
        # readers that compute the frequencies (low/high_freq_factor are not standard GGUF keys).
        w.add_string("llama.rope.scaling.type", "llama3")
        w.add_float32("llama.rope.scaling.factor", factor)
        w.add_uint32("llama.rope.scaling.original_context_length", original)
        w.add_float32("llama.rope.scaling.low_freq_factor", low)
        w.add_float32("llama.rope.scaling.high_freq_factor", high)
    tokens, merges = tiny_tokenizer.vocabulary(s.vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(tiny_tokenizer.gguf_token_types(s.vocab))
    w.add_token_merges(merges)
    w.add_bos_token_id(tiny_tokenizer.BOS_ID)
    w.add_eos_token_id(tiny_tokenizer.EOS_ID)
    w.add_add_bos_token(False)
    w.add_chat_template(tiny_tokenizer.CHATML_TEMPLATE)

    for name, arr in weights.items():
        gname = gguf_name(name)
        if "self_attn.q_proj" in name and permute:
            arr = permute_qk(arr, s.heads)
        elif "self_attn.k_proj" in name and permute:
            arr = permute_qk(arr, s.kv_heads)
        data, raw = kquants.encode(arr, gguf_type_of(s, gname))
        w.add_tensor(gname, data, raw_dtype=raw)
    if s.llama3_scaling is not None:
        w.add_tensor("rope_freqs.weight", converter_rope_freqs(s))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---------------------------------------------------------------- entry points

@dataclass(frozen=True)
class TinyCheckpoint:
    spec: TinySpec
    weights: dict  # float32, HF layout, before any rounding to the stored type
    gguf_path: pathlib.Path
    hf_dir: pathlib.Path | None


def build(name: str, out_dir: pathlib.Path) -> TinyCheckpoint:
    """Writes variant `name` under out_dir/name/ ({hf/, model.gguf}) and returns where."""
    s = VARIANTS[name]
    weights = make_weights(s)
    root = pathlib.Path(out_dir) / name
    gguf_path = write_gguf(s, weights, root / "model.gguf")
    hf_dir = write_hf_dir(s, weights, root / "hf") if s.hf_dtype else None
    return TinyCheckpoint(s, weights, gguf_path, hf_dir)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    out = pathlib.Path(argv[0])
    for name in argv[1:] or list(VARIANTS):
        ck = build(name, out)
        print(f"{name}: {ck.gguf_path}" + (f", {ck.hf_dir}" if ck.hf_dir else "")
              + f"  weights sha256 {weights_sha256(ck.weights)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
