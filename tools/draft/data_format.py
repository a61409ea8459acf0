"""The on-disk format of draft training sequences (docs/draft.md, "Data format"): token ids, the
target's final hidden state (after the final norm) at every position as float16, and optionally
the target's top-k next-token probabilities. One file holds many sequences, appended one record
at a time, so a generator (the C++ engine later) can stream them without knowing the count.

All little-endian, no padding anywhere:
  file header, 32 bytes:
    char[8] magic "SPDRAFT1" | u32 version (1 or 2) | u32 hidden H | u32 topk K (0: no soft labels)
    | u32 target vocab V | version 1: char[8] zero; version 2: u32 C | u32 0
  version 2 only: u32 feature_layers[C]
  then records until the end of the file, each:
    u32 n_tokens T | u32 n_prompt P (the first P tokens are the prompt, P <= T)
    | i32 tokens[T] | f16 hidden[T][H * (1 + C)]
    | if K > 0: i32 topk_ids[T][K] | f16 topk_probs[T][K]
hidden[t] is computed while feeding tokens[t] (so it predicts tokens[t+1]): the final hidden state
after the final norm, then (version 2) the residual stream after each feature layer (0-based
decoder block), RMS-normalised without a weight; topk_*[t] is the target's softmax at
temperature 1 over those logits, largest first.
"""
from __future__ import annotations

import pathlib
import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"SPDRAFT1"
VERSIONS = (1, 2)
_HEADER = struct.Struct("<8sIIII8s")  # 32 bytes
_RECORD = struct.Struct("<II")


@dataclass(frozen=True)
class Header:
    hidden: int
    topk: int
    vocab: int
    feature_layers: tuple = ()  # version 2: the residual layers after the final hidden state

    @property
    def row_width(self) -> int:
        return self.hidden * (1 + len(self.feature_layers))


@dataclass
class Sequence:
    tokens: np.ndarray       # int32 [T]
    hidden: np.ndarray       # float16 [T, H]
    n_prompt: int = 0
    topk_ids: np.ndarray | None = None    # int32 [T, K]
    topk_probs: np.ndarray | None = None  # float16 [T, K]


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 [T, k], probs float16 [T, k]) of softmax(logits) (temperature 1), largest first."""
    logits = np.asarray(logits, dtype=np.float32)
    ids = np.argpartition(-logits, k - 1, axis=-1)[:, :k]
    m = logits.max(axis=-1, keepdims=True)
    z = np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))
    lp = np.take_along_axis(logits, ids, axis=-1) - m - z
    order = np.argsort(-lp, axis=-1, kind="stable")
    ids = np.take_along_axis(ids, order, axis=-1)
    return ids.astype(np.int32), np.exp(np.take_along_axis(lp, order, axis=-1)).astype(np.float16)


class Writer:
    """Appends sequences to a file (created with its header, or appended to if it exists and matches)."""

    def __init__(self, path, header: Header):
        self.path, self.header = pathlib.Path(path), header
        if self.path.exists() and self.path.stat().st_size > 0:
            have = read_header(self.path)
            if have != header:
                raise ValueError(f"{path}: existing header {have} differs from {header}")
            self.f = open(self.path, "ab")
        else:
            self.f = open(self.path, "wb")
            C = len(header.feature_layers)
            self.f.write(_HEADER.pack(MAGIC, 2 if C else 1, header.hidden, header.topk, header.vocab,
                                      struct.pack("<II", C, 0)))
            self.f.write(struct.pack(f"<{C}I", *header.feature_layers))

    def write(self, s: Sequence) -> None:
        h = self.header
        T = len(s.tokens)
        if s.hidden.shape != (T, h.row_width):
            raise ValueError(f"hidden has shape {s.hidden.shape}, expected ({T}, {h.row_width})")
        if not 0 <= s.n_prompt <= T:
            raise ValueError(f"n_prompt {s.n_prompt} outside [0, {T}]")
        self.f.write(_RECORD.pack(T, s.n_prompt))
        self.f.write(np.ascontiguousarray(s.tokens, dtype="<i4").tobytes())
        self.f.write(np.ascontiguousarray(s.hidden, dtype="<f2").tobytes())
        if h.topk:
            if s.topk_ids is None or s.topk_ids.shape != (T, h.topk) or s.topk_probs.shape != (T, h.topk):
                raise ValueError(f"the file carries top-{h.topk} labels; this sequence has none of that shape")
            self.f.write(np.ascontiguousarray(s.topk_ids, dtype="<i4").tobytes())
            self.f.write(np.ascontiguousarray(s.topk_probs, dtype="<f2").tobytes())

    def close(self) -> None:
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _read_header(path) -> tuple[Header, int]:
    """The header and its size in bytes."""
    with open(path, "rb") as f:
        raw = f.read(_HEADER.size)
        if len(raw) < _HEADER.size:
            raise ValueError(f"{path}: {len(raw)} bytes, shorter than the {_HEADER.size}-byte header")
        magic, version, hidden, topk, vocab, rest = _HEADER.unpack(raw)
        if magic != MAGIC or version not in VERSIONS:
            raise ValueError(f"{path}: not a draft data file (magic {magic!r}, version {version}; expected {MAGIC!r}, {VERSIONS})")
        layers = ()
        if version == 2:
            C = struct.unpack("<I", rest[:4])[0]
            more = f.read(4 * C)
            if len(more) != 4 * C:
                raise ValueError(f"{path}: its header is cut short")
            layers = tuple(struct.unpack(f"<{C}I", more))
    return Header(hidden, topk, vocab, layers), _HEADER.size + 4 * len(layers)


def read_header(path) -> Header:
    return _read_header(path)[0]


def read(path) -> tuple[Header, list[Sequence]]:
    """Every sequence of a file (memory-mapped: the arrays are read-only views into the file)."""
    header, off = _read_header(path)
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    H, K, out = header.row_width, header.topk, []
    while off < len(buf):
        if off + _RECORD.size > len(buf):
            raise ValueError(f"{path}: truncated record header at byte {off}")
        T, P = _RECORD.unpack(bytes(buf[off:off + _RECORD.size]))
        off += _RECORD.size
        need = T * 4 + T * H * 2 + (T * K * 6 if K else 0)
        if off + need > len(buf):
            raise ValueError(f"{path}: record of {T} tokens at byte {off - _RECORD.size} runs past the end ({len(buf)} bytes)")

        def take(dtype, shape):
            nonlocal off
            n = int(np.prod(shape)) * np.dtype(dtype).itemsize
            a = np.frombuffer(buf, dtype=dtype, count=int(np.prod(shape)), offset=off).reshape(shape)
            off += n
            return a

        s = Sequence(tokens=take("<i4", (T,)), hidden=take("<f2", (T, H)), n_prompt=P)
        if K:
            s.topk_ids, s.topk_probs = take("<i4", (T, K)), take("<f2", (T, K))
        if (s.tokens < 0).any() or (s.tokens >= header.vocab).any():
            raise ValueError(f"{path}: record {len(out)} has a token outside [0, {header.vocab})")
        out.append(s)
    return header, out


def read_all(paths) -> tuple[Header, list[Sequence]]:
    """Sequences of several files with one header (all files must agree)."""
    header, seqs = None, []
    for p in paths:
        h, s = read(p)
        if header is not None and h != header:
            raise ValueError(f"{p}: header {h} differs from the first file's {header}")
        header = h
        seqs += s
    if header is None:
        raise ValueError("no data files given")
    return header, seqs
