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
import sys

import numpy as np


# The oracle's GGUF reader (numpy and gguf only) gives the config and the dequantized rows.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "oracle"))
import gguf_weights  # noqa: E402


def _reader(path):
    import gguf
    return gguf.GGUFReader(str(path))


def read_config(path):
    """The target's gguf_weights.LlamaConfig (vocab, hidden, heads, head_dim, RoPE theta, eps, ...);
    a target with RoPE scaling is refused (the head has none)."""
    r = _reader(path)
    scaling = r.fields.get("llama.rope.scaling.type")
    if (scaling is not None and scaling.contents() != "none") or any(t.name == "rope_freqs.weight" for t in r.tensors):
        raise ValueError(f"{path}: RoPE scaling is not supported by the draft head yet")
    try:
        return gguf_weights.read_config(r)
    except ValueError as e:
        raise ValueError(f"{path}: the draft trainer needs a llama target ({e})") from None


def name_of(path) -> str:
    """general.name, else the file name."""
    f = _reader(path).fields.get("general.name")
    return str(f.contents()) if f is not None else pathlib.Path(path).name


def read_matrix(path, name: str) -> np.ndarray:
    for t in _reader(path).tensors:
        if t.name == name:
            return gguf_weights.dequantized(t)
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

