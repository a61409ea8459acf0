"""What the draft needs from the target's GGUF: its shape (dims, heads, RoPE theta, norm eps), its
token embedding (frozen input of the draft), its output rows (the reduced head's initial value)
and `target_hash`, the sha256 that ties a draft file to the target it was trained for.

The hash (docs/draft.md, "Target hash") covers every tensor in the order of the file's tensor
infos, each as little-endian
    u64 len(name) | name (utf-8) | u32 n_dims | u64 dims[n_dims] (GGUF order, innermost first)
    | u32 ggml type | u64 n_bytes | the tensor's n_bytes data bytes (no alignment padding)
so it ignores metadata (a re-labelled file keeps its hash) and changes with any weight bit.
"""
from __future__ import annotations

import hashlib
import pathlib
import struct
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TargetConfig:
    name: str
    vocab: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    tied: bool


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _reader(path):
    import gguf
    return gguf.GGUFReader(str(path))


def read_config(path) -> TargetConfig:
    r = _reader(path)
    arch = _field(r, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: the draft trainer needs a llama target, general.architecture is {arch!r}")
    if _field(r, "llama.rope.scaling.type") not in (None, "none") or any(t.name == "rope_freqs.weight" for t in r.tensors):
        raise ValueError(f"{path}: RoPE scaling is not supported by the draft head yet")
    hidden = int(_field(r, "llama.embedding_length"))
    heads = int(_field(r, "llama.attention.head_count"))
    vocab = _field(r, "llama.vocab_size")
    if vocab is None:
        vocab = len(r.fields["tokenizer.ggml.tokens"].data)
    return TargetConfig(
        name=str(_field(r, "general.name", pathlib.Path(path).name)),
        vocab=int(vocab), hidden=hidden,
        intermediate=int(_field(r, "llama.feed_forward_length")),
        heads=heads, kv_heads=int(_field(r, "llama.attention.head_count_kv", heads)),
        head_dim=int(_field(r, "llama.rope.dimension_count", hidden // heads)),
        rope_theta=float(_field(r, "llama.rope.freq_base", 10000.0)),
        rms_eps=float(_field(r, "llama.attention.layer_norm_rms_epsilon")),
        tied=not any(t.name == "output.weight" for t in r.tensors))


def _dequantized(t) -> np.ndarray:
    """float32 [rows, cols] (rows = outer GGUF dim)."""
    import gguf
    data = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    return np.ascontiguousarray(data.reshape(int(t.shape[1]), int(t.shape[0])), dtype=np.float32)


def read_matrix(path, name: str) -> np.ndarray:
    for t in _reader(path).tensors:
        if t.name == name:
            return _dequantized(t)
    raise KeyError(f"{path} has no tensor {name}")


def token_embedding(path) -> np.ndarray:
    """float32 [vocab, hidden]: the rows the runtime's embedding lookup returns."""
    return read_matrix(path, "token_embd.weight")


def output_rows(path) -> np.ndarray:
    """float32 [vocab, hidden]: the target's output head (token_embd when tied)."""
    r = _reader(path)
    name = "output.weight" if any(t.name == "output.weight" for t in r.tensors) else "token_embd.weight"
    return read_matrix(path, name)


def target_hash(path) -> str:
    """sha256 hex digest over the tensors as the module docstring defines (about 0.3 s per 100 MB)."""
    r = _reader(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for t in r.tensors:
            name = t.name.encode("utf-8")
            dims = [int(d) for d in t.shape.tolist()]
            h.update(struct.pack("<Q", len(name)) + name)
            h.update(struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims))
            h.update(struct.pack("<IQ", int(t.tensor_type), int(t.n_bytes)))
            f.seek(int(t.data_offset))
            left = int(t.n_bytes)
            while left:
                chunk = f.read(min(left, 1 << 22))
                if not chunk:
                    raise ValueError(f"{path}: tensor {t.name} runs past the end of the file")
                h.update(chunk)
                left -= len(chunk)
    return h.hexdigest()

