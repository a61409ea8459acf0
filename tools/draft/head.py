"""The draft head in JAX, and its multi-step training forward ("training-time test").

One draft entry per target position i >= 1 reads concat(f, e(x_i)), where f is the target's final
hidden state h_{i-1} (after the final norm) at depth 1, or the head's own output feature g_{i-1}
of the previous depth at depths 2..K; it predicts x_{i+1}, whose target distribution is p_i:

    x = fc([f, e])                     fc: [H, 2H], columns 0..H-1 read f, H..2H-1 read e
    x = x + Attn(RMSNorm(x))           GQA with the target's head counts, RoPE at position i
    g = x + MLP(RMSNorm(x))            SwiGLU at the target's intermediate width
    (with cfg.layers > 1, each further layer repeats the two lines on g, with its own keys and values)
    logits = RMSNorm(g) @ head^T       head: [N, H], N = reduced vocabulary

Weights here use Hugging Face layout ([out, in]) and half-split RoPE pairs (i, i + d/2);
export.py permutes q/k rows to llama.cpp's adjacent-pair layout. The embedding e is the target's
token_embd, frozen (never a parameter, never exported).

Depth j's query at entry a attends, as drafting at run time does, to depth-1 keys of entries
<= a - j + 1 (the committed context, fed with true hidden states) and to depth-s keys of entry
a - (j - s) for s = 2..j (the draft's own earlier steps of this round): EAGLE-3 / HASS's
"training-time test", computed as one causal block plus j - 1 diagonals instead of a mask.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class HeadConfig:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    n_vocab: int  # reduced vocabulary size N
    feature_chunks: int = 1  # H-wide chunks of the depth-1 feature (1: the final hidden state alone)
    layers: int = 1  # decoder layers; layer l >= 1's parameters are named "l{l}.<name>"


PARAM_SHAPES = {  # name -> shape as a function of the config (HF layout)
    "fc": lambda c: (c.hidden, 2 * c.hidden),
    "attn_norm": lambda c: (c.hidden,),
    "wq": lambda c: (c.heads * c.head_dim, c.hidden),
    "wk": lambda c: (c.kv_heads * c.head_dim, c.hidden),
    "wv": lambda c: (c.kv_heads * c.head_dim, c.hidden),
    "wo": lambda c: (c.hidden, c.heads * c.head_dim),
    "ffn_norm": lambda c: (c.hidden,),
    "w_gate": lambda c: (c.intermediate, c.hidden),
    "w_up": lambda c: (c.intermediate, c.hidden),
    "w_down": lambda c: (c.hidden, c.intermediate),
    "out_norm": lambda c: (c.hidden,),
    "head": lambda c: (c.n_vocab, c.hidden),
}


# The parameters each decoder layer has; layer 0's go by these names, layer l >= 1's by layer_name.
LAYER_PARAMS = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")


def layer_name(layer: int, name: str) -> str:
    return name if layer == 0 else f"l{layer}.{name}"


def base_name(name: str) -> str:
    """"l1.wq" -> "wq"; names of layer 0 and of the other parameters are their own."""
    m = re.fullmatch(r"l[0-9]+\.(.+)", name)
    return m.group(1) if m else name


def init_params(cfg: HeadConfig, key, head_rows: np.ndarray) -> dict:
    params = _init_layer(cfg, key, head_rows)  # layer 0 from `key` itself, as one-layer heads always were
    layer_keys = jax.random.split(jax.random.fold_in(key, 1), cfg.layers - 1) if cfg.layers > 1 else []
    for layer, k in enumerate(layer_keys, start=1):
        # Layers after the first: the same start as the first's (their own draws).
        extra = _init_layer(cfg, k, head_rows)
        params.update({layer_name(layer, n): extra[n] for n in LAYER_PARAMS})
    if cfg.feature_chunks > 1:
        # fuse [H, C H] maps the depth-1 feature chunks to one H-wide feature (EAGLE-3): it starts
        # as the first chunk (the final hidden state, what a one-chunk head reads); the other
        # chunks' columns start at zero and learn from their gradients.
        H = cfg.hidden
        params["fuse"] = jnp.zeros((H, cfg.feature_chunks * H), jnp.float32).at[:, :H].set(jnp.eye(H, dtype=jnp.float32))
    return params


def _init_layer(cfg: HeadConfig, key, head_rows: np.ndarray) -> dict:
    """Matrices N(0, 0.02) (output projections scaled by 1/sqrt(2), as GPT-2 does for residual
    writers), norms 1; the head starts from the target's output rows of the reduced vocabulary
    (head_rows [N, H]) and is trained. (Starting out_norm at the target's final-norm weight instead
    of 1 doubles the initial logit spread on SmolLM2 and the initial loss with it.)"""
    params = {}
    keys = jax.random.split(key, len(PARAM_SHAPES))
    for k, (name, shape_of) in zip(keys, PARAM_SHAPES.items()):
        shape = shape_of(cfg)
        if name.endswith("norm"):
            params[name] = jnp.ones(shape, jnp.float32)
        else:
            std = 0.02 / (np.sqrt(2.0) if name in ("wo", "w_down") else 1.0)
            params[name] = std * jax.random.normal(k, shape, jnp.float32)
    assert head_rows.shape == (cfg.n_vocab, cfg.hidden), head_rows.shape
    params["head"] = jnp.asarray(head_rows, jnp.float32)
    return params


def rms_norm(x, w, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope_half_split(x, pos, theta):
    """x [..., L, heads, d]; pos [L]. Rotates pairs (i, i + d/2) by pos * theta^(-2i/d)."""
    d = x.shape[-1]
    inv = theta ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
    ang = pos.astype(jnp.float32)[:, None] * inv[None, :]  # [L, d/2]
    cos, sin = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
    a, b = x[..., : d // 2], x[..., d // 2:]
    return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def _shift_right(x, n):
    """x [B, L, ...] -> entry a holds x[a - n] (zeros for a < n)."""
    if n == 0:
        return x
    pad = jnp.zeros_like(x[:, :n])
    return jnp.concatenate([pad, x[:, :-n]], axis=1)


def multi_step_forward(cfg: HeadConfig, params: dict, feat, emb, depth: int):
    """feat [B, L, C H]: the target's features at i-1 of entry a (window positions a = 0..L-1),
    fused by params["fuse"] when C > 1; emb [B, L, H]: e(x_i).
    Returns (logits [depth, B, L, N], features g [depth, B, L, H]). Depth j's input feature at
    entry a is depth j-1's g at entry a-1 (zeros at a = 0; those entries carry no loss)."""
    B, L = feat.shape[:2]
    G = cfg.heads // cfg.kv_heads
    pos = jnp.arange(L)
    scale = 1.0 / np.sqrt(cfg.head_dim)
    neg = jnp.float32(-1e30)
    layer_ks = [[] for _ in range(cfg.layers)]  # per layer, per depth: the keys and values of every entry
    layer_vs = [[] for _ in range(cfg.layers)]
    logits_all, g_all = [], []
    f = feat @ params["fuse"].T if cfg.feature_chunks > 1 else feat

    def block(p, x, ks, vs, j):
        """One decoder layer at depth j over its own keys and values (ks, vs: depths 1..j-1 so far)."""
        h = rms_norm(x, p["attn_norm"], cfg.rms_eps)
        q = (h @ p["wq"].T).reshape(B, L, cfg.kv_heads, G, cfg.head_dim)
        k = (h @ p["wk"].T).reshape(B, L, cfg.kv_heads, cfg.head_dim)
        v = (h @ p["wv"].T).reshape(B, L, cfg.kv_heads, cfg.head_dim)
        q = rope_half_split(q.reshape(B, L, cfg.heads, cfg.head_dim), pos, cfg.rope_theta)
        q = q.reshape(B, L, cfg.kv_heads, G, cfg.head_dim)
        k = rope_half_split(k, pos, cfg.rope_theta)
        ks.append(k)
        vs.append(v)
        # Block: depth-1 keys at t <= a - (j - 1).
        s_block = jnp.einsum("bakgd,btkd->bkgat", q, ks[0]) * scale
        allowed = pos[None, :] <= pos[:, None] - (j - 1)
        s_block = jnp.where(allowed, s_block, neg)
        # Diagonals: depth-s key of entry a - (j - s), s = 2..j.
        diag_s, diag_v = [], []
        for s in range(2, j + 1):
            shift = j - s
            kd = _shift_right(ks[s - 1], shift)
            sc = jnp.einsum("bakgd,bakd->bkga", q, kd) * scale
            diag_s.append(jnp.where(pos >= shift, sc, neg))
            diag_v.append(_shift_right(vs[s - 1], shift))
        scores = s_block if not diag_s else jnp.concatenate([s_block, jnp.stack(diag_s, axis=-1)], axis=-1)
        probs = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bkgat,btkd->bakgd", probs[..., :L], vs[0])
        for n, vd in enumerate(diag_v):
            out = out + probs[..., L + n].transpose(0, 3, 1, 2)[..., None] * vd[:, :, :, None, :]
        x = x + out.reshape(B, L, cfg.heads * cfg.head_dim) @ p["wo"].T
        h = rms_norm(x, p["ffn_norm"], cfg.rms_eps)
        return x + (jax.nn.silu(h @ p["w_gate"].T) * (h @ p["w_up"].T)) @ p["w_down"].T

    layer_params = [{n: params[layer_name(l, n)] for n in LAYER_PARAMS} for l in range(cfg.layers)]
    for j in range(1, depth + 1):
        if j > 1:
            f = _shift_right(g_all[-1], 1)
        x = jnp.concatenate([f, emb], axis=-1) @ params["fc"].T
        for l in range(cfg.layers):
            x = block(layer_params[l], x, layer_ks[l], layer_vs[l], j)
        g_all.append(x)
        logits_all.append(rms_norm(x, params["out_norm"], cfg.rms_eps) @ params["head"].T)
    return jnp.stack(logits_all), jnp.stack(g_all)
