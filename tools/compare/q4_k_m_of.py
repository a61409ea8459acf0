"""A Q4_K_M (or, with --mix, a Q5_K_M, Q3_K_M, Q2_K or IQ4_XS) file of a model, written as llama.cpp's
quantizer lays one out, for benchmarks.

llama.cpp's Q4_K_M asks Q4_K for most matrices and Q6_K for the output (or the tied token
embedding) and for the attn_v and ffn_down of the layers `use_more_bits` picks (the first and last
eighth, and every third between). K-quants need rows of whole 256-value super-blocks; where a
tensor's rows are not (SmolLM2-135M: 576 wide), llama.cpp falls back to Q5_0 for Q4_K and Q8_0
for Q6_K. So the Q4_K_M file of SmolLM2-135M is Q5_0 for q, k, o, gate, up and most v; Q8_0 for
the embedding and a third of v; Q4_K and Q6_K for ffn_down (1,536 wide). This writes that mix
from any GGUF of the model (every tensor dequantized to float32 and quantized again: from the
default Q4_1 file the values are twice rounded, which leaves the speed and the file's layout as a
downloaded Q4_K_M's, not its accuracy). Q5_0 and Q8_0 use the gguf package's quantizers, Q4_K and
Q6_K the simple ones of tests/oracle/kquants.py (min/max scales, not llama.cpp's search).

Q5_K_M asks Q5_K where Q4_K_M asks Q4_K (the same Q6_K tensors); where rows are not whole
super-blocks llama.cpp falls back to Q5_1 for Q5_K. So the Q5_K_M file of SmolLM2-135M is Q5_1 for
q, k, o, gate, up and most v, Q8_0 for the embedding and a third of v, Q5_K and Q6_K for ffn_down.
Q5_1 uses the gguf package's quantizer, Q5_K kquants.py's.

Q3_K_M asks Q3_K, but Q5_K for the first two attn_v and the first sixteenth of ffn_down, Q4_K for
the other attn_v, ffn_down and every attn_output; Q2_K asks Q2_K, but Q3_K for attn_v (Q4_K where
4 or more query heads share a kv head), ffn_down and attn_output (llama.cpp's llama_tensor_get_type).
Q2_K and Q3_K fall back to IQ4_NL. So the Q3_K_M file of SmolLM2-135M is IQ4_NL for q, k, gate and
up, Q5_1 / Q5_0 for v, Q5_0 for attn_output, Q5_K / Q4_K for ffn_down; its Q2_K file is IQ4_NL
but for Q3_K ffn_down (and the Q8_0 embedding in both). IQ4_NL, Q2_K and Q3_K use kquants.py's
quantizers (a Q2_K tensor appears only where rows are whole super-blocks, in models whose width is a multiple of 256).

IQ4_XS asks IQ4_XS, but Q5_K for the ffn_down of the first eighth of the layers (llama.cpp does so
without an importance matrix; none is used here) and for attn_v where 4 or more query heads share a
kv head; it falls back to IQ4_NL. So the IQ4_XS file of SmolLM2-135M is IQ4_NL for every 576-wide
matrix, IQ4_XS for ffn_down but the first three layers' Q5_K, and the Q8_0 embedding. IQ4_XS uses
kquants.py's quantizer.

Tooling only (docs/benchmarks.md, "A Q4_K_M file", "A Q5_K_M file"):
build/venv/bin/python tools/compare/q4_k_m_of.py [--mix Q5_K_M|Q3_K_M|Q2_K|IQ4_XS] IN.gguf OUT.gguf
"""
from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "oracle"))
import gguf  # noqa: E402
import kquants  # noqa: E402

QK_K = 256
FALLBACK = {"Q2_K": "IQ4_NL", "Q3_K": "IQ4_NL", "IQ4_XS": "IQ4_NL", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def asked_type(name: str, n_layers: int, tied: bool, mix: str, n_gqa: int) -> str:
    base = MIXES[mix][0]
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return "Q6_K"
    parts = name.split(".")
    if len(parts) != 4 or parts[0] != "blk":
        return base
    layer, kind = int(parts[1]), parts[2]
    if mix == "IQ4_XS":
        if kind == "attn_v" and n_gqa >= 4 or kind == "ffn_down" and layer < n_layers // 8:
            return "Q5_K"
        return base
    if mix in ("Q4_K_M", "Q5_K_M"):
        return "Q6_K" if kind in ("attn_v", "ffn_down") and use_more_bits(layer, n_layers) else base
    if mix == "Q3_K_M":
        if kind == "attn_v":
            return "Q5_K" if layer < 2 else "Q4_K"
        if kind == "ffn_down":
            return "Q5_K" if layer < n_layers // 16 else "Q4_K"
        return "Q4_K" if kind == "attn_output" else base
    if kind == "attn_v":  # Q2_K
        return "Q4_K" if n_gqa >= 4 else "Q3_K"
    return "Q3_K" if kind in ("ffn_down", "attn_output") else base


MIXES = {"Q4_K_M": ("Q4_K", gguf.LlamaFileType.MOSTLY_Q4_K_M), "Q5_K_M": ("Q5_K", gguf.LlamaFileType.MOSTLY_Q5_K_M),
         "Q3_K_M": ("Q3_K", gguf.LlamaFileType.MOSTLY_Q3_K_M), "Q2_K": ("Q2_K", gguf.LlamaFileType.MOSTLY_Q2_K),
         "IQ4_XS": ("IQ4_XS", gguf.LlamaFileType.MOSTLY_IQ4_XS)}


def main(argv: list[str]) -> int:
    mix = "Q4_K_M"
    if len(argv) == 5 and argv[1] == "--mix" and argv[2] in MIXES:
        mix, argv = argv[2], argv[:1] + argv[3:]
    if len(argv) != 3:
        print("usage: q4_k_m_of.py [--mix Q4_K_M|Q5_K_M|Q3_K_M|Q2_K|IQ4_XS] IN.gguf OUT.gguf", file=sys.stderr)
        return 2
    file_type = MIXES[mix][1]
    src, dst = pathlib.Path(argv[1]), pathlib.Path(argv[2])
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    n_layers = int(r.fields[f"{arch}.block_count"].contents())
    heads, kv_heads = (int(r.fields[f"{arch}.attention.{k}"].contents()) for k in ("head_count", "head_count_kv"))
    names = {t.name for t in r.tensors}
    tied = "output.weight" not in names
    w = gguf.GGUFWriter(dst, arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == "general.file_type":
            w.add_file_type(file_type)
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    counts: dict[str, int] = {}
    for t in r.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))  # [rows, cols]
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if values.ndim == 1:  # norms stay float32
            w.add_tensor(t.name, values)
            counts["F32"] = counts.get("F32", 0) + 1
            continue
        want = asked_type(t.name, n_layers, tied, mix, heads // kv_heads)
        kind = want if shape[1] % QK_K == 0 else FALLBACK[want]
        try:
            data, qtype = kquants.encode(values, kind)
        except ValueError as e:  # a type no quantizer here writes
            print(f"q4_k_m_of.py: {t.name}: {e}", file=sys.stderr)
            return 1
        w.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=qtype)
        counts[kind] = counts.get(kind, 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{dst}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
