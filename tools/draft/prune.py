"""Cuts a trained head's reduced vocabulary to its N most frequent tokens, without retraining.

draft.token_map lists the head's tokens by training-text frequency, most frequent first
(vocab.reduced_vocab), and output.weight has one row per entry. Keeping the first N entries and
rows gives the same network over a smaller vocabulary: the kept rows are copied byte for byte (no
requantization), so over its N tokens the pruned head's logits are the full head's, and every
other token has q = 0, which exact rejection sampling already handles. What changes is the draft's
cost (the output matrix is about half of the head's bytes at N = 8,192) and which tokens it can
propose (docs/draft.md, "Choosing N").

    python -m draft.prune --draft HEAD.gguf --vocab 4096 --out PRUNED.gguf
"""
from __future__ import annotations

import hashlib
import pathlib
import sys

import numpy as np

ARCH = "specula-eagle"
TOKEN_MAP = "draft.token_map"
OUTPUT = "output.weight"


def prune(src, dst, n: int) -> dict:
    """Writes the head at `src` with its first n vocabulary entries to `dst`; returns a summary."""
    import gguf
    r = gguf.GGUFReader(str(src))
    if r.fields["general.architecture"].contents() != ARCH:
        raise ValueError(f"{src}: not a draft head (general.architecture is not {ARCH!r})")
    token_map = np.asarray(r.fields[TOKEN_MAP].contents(), dtype=np.int32)
    if not 1 <= n <= len(token_map):
        raise ValueError(f"--vocab must be between 1 and the head's {len(token_map)} tokens, got {n}")
    source_sha = hashlib.sha256(pathlib.Path(src).read_bytes()).hexdigest()
    dst = pathlib.Path(dst)
    if dst.exists() and dst.resolve() == pathlib.Path(src).resolve():
        raise ValueError(f"{dst}: the output must be another file than the head it cuts (the head is read while writing)")
    dst.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(dst), ARCH)  # writes general.architecture itself
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = f.contents()
        if key == TOKEN_MAP:
            value = [int(t) for t in token_map[:n]]
        elif key == f"{ARCH}.vocab_size":
            value = n
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, vtype, sub_type=sub)
    w.add_key_value("draft.pruned_from", f"{pathlib.Path(src).name} sha256 {source_sha}, first {n} of "
                    f"{len(token_map)} tokens", gguf.GGUFValueType.STRING)
    for t in r.tensors:
        data = np.asarray(t.data)
        shape = [int(d) for d in reversed(t.shape.tolist())]  # rows first, as numpy holds them
        if t.name == OUTPUT:
            if shape[0] != len(token_map):
                raise ValueError(f"{src}: {OUTPUT} has {shape[0]} rows for {len(token_map)} tokens")
            data, shape[0] = data[:n], n
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(t.name, np.ascontiguousarray(data.reshape(shape)))
        else:
            w.add_tensor(t.name, np.ascontiguousarray(data), raw_dtype=t.tensor_type)  # rows x bytes
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"out": str(dst), "vocab": n, "of": len(token_map), "bytes": dst.stat().st_size, "source_sha256": source_sha}


def main(argv=None) -> int:
    import argparse
    import json
    p = argparse.ArgumentParser(description="cut a draft head's vocabulary to its N most frequent tokens")
    p.add_argument("--draft", required=True, help="the head's GGUF")
    p.add_argument("--vocab", type=int, required=True, help="tokens to keep (the most frequent first)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        print(json.dumps(prune(args.draft, args.out, args.vocab)))
    except (ValueError, OSError, KeyError) as e:
        print(f"draft.prune: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
