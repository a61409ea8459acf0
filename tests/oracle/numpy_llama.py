"""An independent NumPy reference of the Llama forward pass (tests only; never used by the runtime).

Written from the Llama / transformers definitions, sharing no code with Specula's C++:
RMSNorm, RoPE (Hugging Face half-split pairs (i, i+d/2) by default, or adjacent pairs for
permuted GGUF weights), llama3 rope scaling, grouped-query attention with a causal mask over a
KV cache, SwiGLU MLP, tied or untied output head. Weights use HF names and [out, in] layout.
Compute dtype is float64 (tiny models: a near-exact reference) or float32 (the 135M model: speed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    # (factor, low_freq_factor, high_freq_factor, original_max_position) or None
    llama3_scaling: tuple | None = None
    tied: bool = False

    @staticmethod
    def from_hf(cfg: dict) -> "LlamaConfig":
        """From a Hugging Face config.json dict."""
        scaling = None
        rs = cfg.get("rope_scaling")
        if rs and rs.get("rope_type", rs.get("type")) == "llama3":
            scaling = (float(rs["factor"]), float(rs.get("low_freq_factor", 1.0)),
                       float(rs.get("high_freq_factor", 4.0)), int(rs.get("original_max_position_embeddings", 8192)))
        heads = cfg["num_attention_heads"]
        return LlamaConfig(
            vocab=cfg["vocab_size"], hidden=cfg["hidden_size"], intermediate=cfg["intermediate_size"],
            layers=cfg["num_hidden_layers"], heads=heads, kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads, rope_theta=float(cfg.get("rope_theta", 10000.0)),
            rms_eps=float(cfg.get("rms_norm_eps", 1e-5)), llama3_scaling=scaling,
            tied=bool(cfg.get("tie_word_embeddings", False)))

    def inv_freq(self) -> np.ndarray:
        """[head_dim/2] float64. llama3: with wavelength w = 2*pi/inv, w < original/high keeps inv,
        w > original/low gives inv/factor, in between s = (original/w - low)/(high - low) and
        inv' = (1-s)*inv/factor + s*inv."""
        inv = self.rope_theta ** (-np.arange(0, self.head_dim, 2, dtype=np.float64) / self.head_dim)
        if self.llama3_scaling is None:
            return inv
        factor, low, high, original = self.llama3_scaling
        wavelen = 2 * math.pi / inv
        s = (original / wavelen - low) / (high - low)
        smoothed = (1 - s) * inv / factor + s * inv
        return np.where(wavelen < original / high, inv, np.where(wavelen > original / low, inv / factor, smoothed))


def bf16_roundtrip(x: np.ndarray) -> np.ndarray:
    """float32 x rounded to bfloat16 (nearest, ties to even) and back, as the BF16 kernel reads it."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


Q8_OUTLIERS = 3  # QuantizedRows::kOutliers


def q8_roundtrip(x: np.ndarray) -> np.ndarray:
    """x as Specula's int8 path sees it (gpu/host/qmatmul.h), in float32 as the kernels compute:
    each row's Q8_OUTLIERS largest |x| (ties to the lower column) are set aside and kept exact;
    the rest, with those as 0, per block of 32 values d = max|x| / 127, q = round-half-even(x *
    (1 / d)) clamped to +-127, and the product uses d * q."""
    x32 = np.asarray(x, dtype=np.float32)
    flat = x32.reshape(-1, x32.shape[-1])
    # A stable sort of -|x| puts ties in column order.
    top = np.argsort(-np.abs(flat), axis=-1, kind="stable")[:, :Q8_OUTLIERS]
    rows = np.arange(flat.shape[0])[:, None]
    aside = flat.copy()
    aside[rows, top] = 0
    b = aside.reshape(*x32.shape[:-1], x32.shape[-1] // 32, 32)
    d = (np.abs(b).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(b * inv), -127, 127).astype(np.float32)
    out = (q.astype(np.float64) * d.astype(np.float64)).reshape(-1, x32.shape[-1])
    out[rows, top] = flat[rows, top]
    return out.reshape(x32.shape)


def q8_refined(x: np.ndarray) -> np.ndarray:
    """x as qmatmul_refined sees it (the last layer's down projection): x's int8 rounding plus
    the int8 rounding of what that left (0 at the set-aside values)."""
    x32 = np.asarray(x, dtype=np.float32)
    first = q8_roundtrip(x32)
    return first + q8_roundtrip((x32 - first.astype(np.float32)).astype(np.float32))


LOGIT_MARGIN, LOGIT_CAP = 4.0, 64  # kLogitMargin, kLogitCap (gpu/host/qmatmul.h)


def top_logits_again(y: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    """In place, as the int8 path's output head (qmatmul_logits): in each row of y the logits within
    LOGIT_MARGIN of its largest (at most LOGIT_CAP: the largest, ties to the lower index) become
    the products of the unrounded activations x."""
    for i in range(y.shape[0]):
        near = np.flatnonzero(y[i] >= y[i].max() - LOGIT_MARGIN)
        if len(near) > LOGIT_CAP:
            near = near[np.lexsort((near, -y[i, near]))][:LOGIT_CAP]
        y[i, near] = w[near] @ x[i]


class KVCache:
    """Per layer: k, v of shape [kv_heads, length, head_dim] (post-RoPE keys)."""

    def __init__(self, cfg: LlamaConfig, dtype):
        empty = np.zeros((cfg.kv_heads, 0, cfg.head_dim), dtype=dtype)
        self.k = [empty] * cfg.layers
        self.v = [empty] * cfg.layers

    @property
    def length(self) -> int:
        return self.k[0].shape[1]

    def truncate(self, n: int) -> None:
        assert 0 <= n <= self.length
        self.k = [k[:, :n] for k in self.k]
        self.v = [v[:, :n] for v in self.v]


class NumpyLlama:
    def __init__(self, cfg: LlamaConfig, weights: dict[str, np.ndarray], dtype=np.float64,
                 rope_pairs: str = "half_split", inv_freq: np.ndarray | None = None,
                 quantized_inputs: set[str] | frozenset[str] = frozenset(), kv_f16: bool = False,
                 bf16_inputs: set[str] | frozenset[str] = frozenset()):
        """rope_pairs: "half_split" (HF layout weights) or "adjacent" (GGUF-permuted q/k weights).
        inv_freq overrides cfg.inv_freq() (e.g. base frequencies divided by GGUF rope_freqs).
        quantized_inputs: weight names whose input activations are rounded as Specula's int8
        path rounds them (q8_roundtrip) before the product: its emulation. kv_f16: keys and
        values are rounded to float16 as they enter the cache (that path's fp16 K/V cache).
        bf16_inputs: weight names whose input activations are rounded to bfloat16 (nearest
        even) first, as the fast path's BF16 kernel rounds them."""
        assert rope_pairs in ("half_split", "adjacent")
        self.cfg, self.dtype, self.rope_pairs = cfg, dtype, rope_pairs
        self.w = {n: np.ascontiguousarray(a, dtype=dtype) for n, a in weights.items()}
        self.out_name = "model.embed_tokens.weight" if cfg.tied else "lm_head.weight"
        self.out_weight = self.w[self.out_name]
        self.quantized_inputs = frozenset(quantized_inputs)
        self.bf16_inputs = frozenset(bf16_inputs)
        self.kv_f16 = kv_f16
        self.inv_freq = cfg.inv_freq() if inv_freq is None else np.asarray(inv_freq, dtype=np.float64)

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg, self.dtype)

    def _mm(self, x: np.ndarray, name: str) -> np.ndarray:
        """x @ W[name]^T, x rounded first where the weight's input is quantized (the last layer's
        down projection as two int8 rows, q8_refined; the output head's logits near each row's
        largest then computed again unrounded, top_logits_again)."""
        exact = x
        if name in self.quantized_inputs:
            refined = name == f"model.layers.{self.cfg.layers - 1}.mlp.down_proj.weight"
            x = (q8_refined(x) if refined else q8_roundtrip(x)).astype(self.dtype)
        if name in self.bf16_inputs:
            x = bf16_roundtrip(x).astype(self.dtype)
        y = x @ self.w[name].T
        if name == self.out_name and name in self.quantized_inputs:
            top_logits_again(y, exact, self.w[name])
        return y

    def _rmsnorm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.cfg.rms_eps) * w

    def _rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """x [n, heads, d]; cos/sin [n, 1, d/2]. Rotates pair (a, b) by the pair's angle."""
        half = x.shape[-1] // 2
        if self.rope_pairs == "half_split":
            a, b = x[..., :half], x[..., half:]
            return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = b * cos + a * sin
        return out

    def forward(self, tokens, cache: KVCache) -> np.ndarray:
        """Feeds tokens at positions cache.length...; returns logits [n, vocab] and grows the cache."""
        c, w = self.cfg, self.w
        tokens = np.asarray(tokens, dtype=np.int64)
        n, start = len(tokens), cache.length
        pos = start + np.arange(n)
        angle = pos[:, None].astype(np.float64) * self.inv_freq[None, :]
        cos = np.cos(angle).astype(self.dtype)[:, None, :]
        sin = np.sin(angle).astype(self.dtype)[:, None, :]
        group = c.heads // c.kv_heads
        scale = 1.0 / math.sqrt(c.head_dim)
        allowed = np.arange(start + n)[None, :] <= pos[:, None]  # [n, T] causal mask

        x = w["model.embed_tokens.weight"][tokens]
        self.layer_out = []  # the residual stream after each block, [n, hidden]
        for i in range(c.layers):
            p = f"model.layers.{i}."
            h = self._rmsnorm(x, w[p + "input_layernorm.weight"])
            q = self._mm(h, p + "self_attn.q_proj.weight").reshape(n, c.heads, c.head_dim)
            k = self._mm(h, p + "self_attn.k_proj.weight").reshape(n, c.kv_heads, c.head_dim)
            v = self._mm(h, p + "self_attn.v_proj.weight").reshape(n, c.kv_heads, c.head_dim)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            if self.kv_f16:
                k = k.astype(np.float32).astype(np.float16).astype(self.dtype)
                v = v.astype(np.float32).astype(np.float16).astype(self.dtype)
            cache.k[i] = np.concatenate([cache.k[i], k.transpose(1, 0, 2)], axis=1)
            cache.v[i] = np.concatenate([cache.v[i], v.transpose(1, 0, 2)], axis=1)
            # Query head j reads kv head j // group (transformers' repeat_kv).
            qg = q.transpose(1, 0, 2).reshape(c.kv_heads, group, n, c.head_dim)
            scores = np.einsum("kgnd,ktd->kgnt", qg, cache.k[i]) * scale
            scores = np.where(allowed, scores, -np.inf)
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs = scores / scores.sum(axis=-1, keepdims=True)
            attn = np.einsum("kgnt,ktd->kgnd", probs, cache.v[i])
            attn = attn.reshape(c.heads, n, c.head_dim).transpose(1, 0, 2).reshape(n, c.heads * c.head_dim)
            x = x + self._mm(attn, p + "self_attn.o_proj.weight")
            h = self._rmsnorm(x, w[p + "post_attention_layernorm.weight"])
            gate = self._mm(h, p + "mlp.gate_proj.weight")
            up = self._mm(h, p + "mlp.up_proj.weight")
            x = x + self._mm(gate / (1.0 + np.exp(-gate)) * up, p + "mlp.down_proj.weight")
            self.layer_out.append(x)
        x = self._rmsnorm(x, w["model.norm.weight"])
        self.last_hidden = x
        return self._mm(x, self.out_name)

    def logits(self, tokens) -> np.ndarray:
        """Logits at every position of one prefill from an empty cache."""
        return self.forward(tokens, self.new_cache())


def greedy_generate(model: NumpyLlama, prompt_ids, max_new: int, stop_ids=()) -> tuple[list[int], list[float]]:
    """Greedy continuation (argmax, lowest id on ties) with the KV cache: (ids, margins), where
    margins[i] is top1 - top2 logit at step i (small margins explain a legitimate divergence)."""
    cache = model.new_cache()
    logits = model.forward(prompt_ids, cache)[-1]
    ids, margins = [], []
    for _ in range(max_new):
        top2 = np.partition(logits, -2)[-2:]
        nxt = int(np.argmax(logits))
        ids.append(nxt)
        margins.append(float(top2[1] - top2[0]))
        if nxt in stop_ids:
            break
        logits = model.forward([nxt], cache)[-1]
    return ids, margins
