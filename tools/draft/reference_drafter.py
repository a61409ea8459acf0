"""A plain NumPy drafter that reads the exported GGUF exactly as the C++ runtime must: llama.cpp
layout (adjacent-pair RoPE on the permuted q/k rows), one entry at a time into its own KV cache,
with rollback. Tests check it against head.multi_step_forward at every depth; it is also the
executable statement of the run-time protocol (docs/draft.md, "At run time").
"""
from __future__ import annotations

import math

import numpy as np


class ReferenceDrafter:
    def __init__(self, path, embed: np.ndarray):
        """embed: the target's token_embd as float32 [target vocab, hidden]."""
        import gguf
        r = gguf.GGUFReader(str(path))
        meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
        arch = meta["general.architecture"]
        if arch != "specula-eagle":
            raise ValueError(f"{path}: general.architecture is {arch!r}, expected 'specula-eagle'")
        self.meta = meta
        self.hidden = int(meta[f"{arch}.embedding_length"])
        self.heads = int(meta[f"{arch}.attention.head_count"])
        self.kv_heads = int(meta[f"{arch}.attention.head_count_kv"])
        self.head_dim = int(meta[f"{arch}.rope.dimension_count"])
        self.theta = float(meta[f"{arch}.rope.freq_base"])
        self.eps = float(meta[f"{arch}.attention.layer_norm_rms_epsilon"])
        self.layers = int(meta.get(f"{arch}.block_count", 1))
        self.w = {}
        self.token_map = np.asarray(meta["draft.token_map"], dtype=np.int32)
        for t in r.tensors:
            a = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float64)
            self.w[t.name] = a.reshape([int(d) for d in reversed(t.shape.tolist())])
        self.embed = np.asarray(embed, dtype=np.float64)
        self.truncate(0)

    def truncate(self, n: int) -> None:
        """Keeps the first n cache entries (rollback); k and v hold [layer][entry, kv head, d]."""
        if n == 0:
            self.k = [np.zeros((0, self.kv_heads, self.head_dim)) for _ in range(self.layers)]
            self.v = [np.zeros((0, self.kv_heads, self.head_dim)) for _ in range(self.layers)]
            self.pos = np.zeros(0, dtype=np.int64)
        else:
            self.k, self.v, self.pos = [k[:n] for k in self.k], [v[:n] for v in self.v], self.pos[:n]

    def _norm(self, x, w):
        return x / np.sqrt(np.mean(x * x) + self.eps) * w

    def _rope(self, x, pos):
        """x [heads, d], adjacent pairs (2i, 2i+1) rotated by pos * theta^(-2i/d)."""
        inv = self.theta ** (-np.arange(0, self.head_dim, 2) / self.head_dim)
        c, s = np.cos(pos * inv), np.sin(pos * inv)
        a, b = x[:, 0::2], x[:, 1::2]
        out = np.empty_like(x)
        out[:, 0::2], out[:, 1::2] = a * c - b * s, b * c + a * s
        return out

    def step(self, feature: np.ndarray, token: int, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """Appends one entry: feature (the target's features at pos - 1, fused by fuse.weight when
        the head has it, or the draft's own g, H wide) and the token at pos. Returns (logits over
        the reduced vocabulary [N], g [H])."""
        w = self.w
        feature = np.asarray(feature, np.float64)
        if "fuse.weight" in w and feature.shape[0] != self.hidden:
            feature = w["fuse.weight"] @ feature
        x = w["fc.weight"] @ np.concatenate([np.asarray(feature, np.float64), self.embed[token]])
        self.pos = np.append(self.pos, pos)
        for layer in range(self.layers):
            x = self._block(x, layer, pos)
        return w["output.weight"] @ self._norm(x, w["output_norm.weight"]), x

    def _block(self, x: np.ndarray, layer: int, pos: int) -> np.ndarray:
        """Decoder layer `layer` on one entry: appends its key and value, returns its output."""
        w, blk = self.w, f"blk.{layer}."
        h = self._norm(x, w[blk + "attn_norm.weight"])
        q = self._rope((w[blk + "attn_q.weight"] @ h).reshape(self.heads, self.head_dim), pos)
        k = self._rope((w[blk + "attn_k.weight"] @ h).reshape(self.kv_heads, self.head_dim), pos)
        v = (w[blk + "attn_v.weight"] @ h).reshape(self.kv_heads, self.head_dim)
        self.k[layer] = np.concatenate([self.k[layer], k[None]])
        self.v[layer] = np.concatenate([self.v[layer], v[None]])
        group = self.heads // self.kv_heads
        out = np.empty((self.heads, self.head_dim))
        for hd in range(self.heads):
            kv = hd // group
            sc = self.k[layer][:, kv] @ q[hd] / math.sqrt(self.head_dim)
            p = np.exp(sc - sc.max())
            out[hd] = (p / p.sum()) @ self.v[layer][:, kv]
        x = x + w[blk + "attn_output.weight"] @ out.reshape(-1)
        h = self._norm(x, w[blk + "ffn_norm.weight"])
        gate, up = w[blk + "ffn_gate.weight"] @ h, w[blk + "ffn_up.weight"] @ h
        return x + w[blk + "ffn_down.weight"] @ (gate / (1 + np.exp(-gate)) * up)
