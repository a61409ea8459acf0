"""Writes a trained head as one GGUF file (docs/draft.md, "GGUF layout"): llama.cpp tensor names
for the decoder layer (q/k rows permuted to adjacent-pair RoPE, as llama.cpp's converter stores a
llama layer), plus fc.weight, the reduced output.weight, and metadata draft.token_map (int32, reduced id ->
target token id). Matrices Q8_0 (default), Q4_1, Q4_0 or F16, norms F32.

Re-export a trained head at another type (the parameters train.py saved):
    python -m draft.export --target T.gguf --params DIR/params.npz --out D.gguf --type Q4_1
"""
from __future__ import annotations

import pathlib

import numpy as np

from .head import LAYER_PARAMS, HeadConfig, base_name, layer_name

ARCH = "specula-eagle"
MAX_BYTES = 16_000_000  # the 16 MB limit, in decimal megabytes to be safe

_LAYER_TENSORS = {  # a decoder layer's parameter -> its GGUF name after "blk.<layer>."
    "attn_norm": "attn_norm.weight", "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight",
    "wo": "attn_output.weight", "ffn_norm": "ffn_norm.weight", "w_gate": "ffn_gate.weight", "w_up": "ffn_up.weight",
    "w_down": "ffn_down.weight",
}


def tensor_names(layers: int) -> dict:
    """head.py parameter -> GGUF tensor name, for a head of `layers` decoder layers (blk.0 .. blk.layers-1)."""
    out = {"fuse": "fuse.weight", "fc": "fc.weight"}  # fuse only in heads that read feature layers
    for layer in range(layers):
        out.update({layer_name(layer, n): f"blk.{layer}.{_LAYER_TENSORS[n]}" for n in LAYER_PARAMS})
    out.update({"out_norm": "output_norm.weight", "head": "output.weight"})
    return out


# A one-layer head's names, which are also the parameter names --export-types takes (a type given
# for a layer's matrix is every layer's).
_NAMES = tensor_names(1)


# Metadata, not a tensor: an int32 array (the runtime's GGUF reader maps only weight types).
TOKEN_MAP = "draft.token_map"
FEATURE_LAYERS = "draft.feature_layers"  # int32 array: the target's residual layers read beside its final hidden state
TENSOR_TYPES = ("Q8_0", "Q4_1", "Q4_0", "F16")


def parse_types(spec: str) -> dict:
    """'head=Q8_0,fc=Q8_0' -> {"head": "Q8_0", "fc": "Q8_0"} (write()'s tensor_types); '' -> {}."""
    out = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        name, eq, t = item.partition("=")
        if not eq or name not in _NAMES or t not in TENSOR_TYPES:
            raise ValueError(f"{item!r}: write PARAMETER=TYPE, PARAMETER one of {', '.join(_NAMES)}, "
                             f"TYPE one of {', '.join(TENSOR_TYPES)}")
        out[name] = t
    return out


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's permute: within each head, rows (i, i + d/2) become
    adjacent rows (2i, 2i+1)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of permute_qk: adjacent rows (2i, 2i+1) back to (i, i + d/2) within each head."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read(path) -> tuple[HeadConfig, dict, np.ndarray, list[int], dict]:
    """Reads a head file written by `write` back into head.py's config and parameters
    (dequantized to float32, q/k rows in the half-split layout): (config, params, token_map,
    feature_layers, metadata), what `write` takes. train.py --init-from starts from it."""
    import gguf
    r = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    if meta.get("general.architecture") != ARCH:
        raise ValueError(f"{path}: general.architecture is {meta.get('general.architecture')!r}, expected {ARCH!r}")
    layers = int(meta.get(f"{ARCH}.block_count", 1))
    by_name = {gname: pname for pname, gname in tensor_names(layers).items()}
    params = {}
    for t in r.tensors:
        if t.name not in by_name:
            raise ValueError(f"{path}: unexpected tensor {t.name}")
        a = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        params[by_name[t.name]] = a.reshape([int(d) for d in reversed(t.shape.tolist())])
    token_map = np.asarray(meta[TOKEN_MAP], dtype=np.int32)
    feature_layers = [int(x) for x in meta.get(FEATURE_LAYERS, [])]
    cfg = HeadConfig(hidden=int(meta[f"{ARCH}.embedding_length"]), intermediate=int(meta[f"{ARCH}.feed_forward_length"]),
                     heads=int(meta[f"{ARCH}.attention.head_count"]), kv_heads=int(meta[f"{ARCH}.attention.head_count_kv"]),
                     head_dim=int(meta[f"{ARCH}.rope.dimension_count"]), rope_theta=float(meta[f"{ARCH}.rope.freq_base"]),
                     rms_eps=float(meta[f"{ARCH}.attention.layer_norm_rms_epsilon"]), n_vocab=len(token_map),
                     feature_chunks=1 + len(feature_layers), layers=layers)
    for layer in range(layers):
        params[layer_name(layer, "wq")] = unpermute_qk(params[layer_name(layer, "wq")], cfg.heads)
        params[layer_name(layer, "wk")] = unpermute_qk(params[layer_name(layer, "wk")], cfg.kv_heads)
    return cfg, params, token_map, feature_layers, meta


def write(path, cfg: HeadConfig, params: dict, token_map: np.ndarray, *, target_hash: str, target_name: str,
          target_vocab: int, tensor_type: str = "Q8_0", extra: dict | None = None, feature_layers=(),
          tensor_types: dict | None = None) -> int:
    """Writes the file and returns its size in bytes; raises if it exceeds MAX_BYTES.
    extra: more metadata, {key: int | float | str | list[float]}. tensor_types: {head.py parameter:
    type} for matrices stored at another type than tensor_type."""
    import gguf
    tensor_types = dict(tensor_types or {})
    for name, t in [("", tensor_type), *tensor_types.items()]:
        if t not in TENSOR_TYPES:
            raise ValueError(f"tensor type {t!r}{' for ' + name if name else ''}: use one of {', '.join(TENSOR_TYPES)}")
        if name and name not in _NAMES:
            raise ValueError(f"tensor type for {name!r}: the head has no such parameter ({', '.join(_NAMES)})")
    token_map = np.asarray(token_map, dtype=np.int32)
    if token_map.shape != (cfg.n_vocab,) or token_map.min() < 0 or token_map.max() >= target_vocab:
        raise ValueError(f"token_map must be {cfg.n_vocab} ids in [0, {target_vocab})")
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), ARCH)
    w.add_name(f"specula-eagle draft for {target_name}")
    w.add_uint32(f"{ARCH}.block_count", cfg.layers)
    w.add_uint32(f"{ARCH}.embedding_length", cfg.hidden)
    w.add_uint32(f"{ARCH}.feed_forward_length", cfg.intermediate)
    w.add_uint32(f"{ARCH}.attention.head_count", cfg.heads)
    w.add_uint32(f"{ARCH}.attention.head_count_kv", cfg.kv_heads)
    w.add_uint32(f"{ARCH}.rope.dimension_count", cfg.head_dim)
    w.add_float32(f"{ARCH}.rope.freq_base", cfg.rope_theta)
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", cfg.rms_eps)
    w.add_uint32(f"{ARCH}.vocab_size", cfg.n_vocab)
    w.add_string("draft.target_hash", target_hash)
    w.add_string("draft.target_name", target_name)
    w.add_uint32("draft.target_vocab_size", target_vocab)
    w.add_array(TOKEN_MAP, [int(t) for t in token_map])
    feature_layers = [int(x) for x in feature_layers]
    if len(feature_layers) + 1 != cfg.feature_chunks or (feature_layers and "fuse" not in params):
        raise ValueError(f"{len(feature_layers)} feature layers for a head of {cfg.feature_chunks} feature chunks")
    if feature_layers:
        w.add_array(FEATURE_LAYERS, feature_layers)
        w.add_string("draft.input", "fc(concat(fuse(concat(target final hidden after norm, RMS-normed residual after each "
                     "draft.feature_layers block)) at depth 1 or the draft's own feature, target token_embd row))")
    else:
        w.add_string("draft.input", "fc(concat(target final hidden after norm, target token_embd row))")
    for key, value in (extra or {}).items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint64(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, [float(v) for v in value])
    names = tensor_names(cfg.layers)
    if unknown := sorted(set(params) - set(names)):
        raise ValueError(f"parameters {unknown} are not part of a {cfg.layers}-layer head")
    for pname, gname in names.items():
        if pname not in params:
            continue
        a = np.asarray(params[pname], dtype=np.float32)
        if base_name(pname) == "wq":
            a = permute_qk(a, cfg.heads)
        elif base_name(pname) == "wk":
            a = permute_qk(a, cfg.kv_heads)
        t = tensor_types.get(base_name(pname), tensor_type)  # a type given for a layer's matrix is every layer's
        if a.ndim == 1:
            w.add_tensor(gname, np.ascontiguousarray(a))
        elif t == "F16":
            w.add_tensor(gname, np.ascontiguousarray(a, dtype=np.float16))
        else:
            q = getattr(gguf.GGMLQuantizationType, t)
            w.add_tensor(gname, gguf.quants.quantize(np.ascontiguousarray(a), q), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise ValueError(f"{path} is {size} bytes, over the {MAX_BYTES}-byte limit: lower --vocab or use Q8_0")
    return size


def main(argv=None) -> int:
    import argparse
    import json

    from . import target
    p = argparse.ArgumentParser(description="re-export a trained head (train.py's params.npz) at another tensor type")
    p.add_argument("--target", required=True, help="the target's GGUF (config, hash and name)")
    p.add_argument("--params", required=True, help="params.npz written by train.py")
    p.add_argument("--out", required=True)
    p.add_argument("--type", choices=TENSOR_TYPES, default="Q8_0")
    p.add_argument("--types", default="", help="matrices at another type than --type, e.g. head=Q8_0,fc=Q8_0")
    p.add_argument("--metrics", help="train.py's metrics.json, to copy the training metadata from")
    args = p.parse_args(argv)
    try:
        types = parse_types(args.types)
    except ValueError as e:
        p.error(f"--types: {e}")
    tcfg = target.read_config(args.target)
    z = np.load(args.params)
    token_map = np.asarray(z["token_map"], np.int32)
    params = {k: z[k] for k in z.files if k not in ("token_map", "feature_layers")}
    feature_layers = [int(x) for x in z["feature_layers"]] if "feature_layers" in z.files else []
    layers = 1 + sum(1 for k in params if k.endswith(".wq"))
    cfg = HeadConfig(hidden=tcfg.hidden, intermediate=tcfg.intermediate, heads=tcfg.heads, kv_heads=tcfg.kv_heads,
                     head_dim=tcfg.head_dim, rope_theta=tcfg.rope_theta, rms_eps=tcfg.rms_eps, n_vocab=len(token_map),
                     feature_chunks=1 + len(feature_layers), layers=layers)
    extra = {}
    if args.metrics:
        m = json.loads(pathlib.Path(args.metrics).read_text())
        extra = {"draft.train.depth": m["depth"], "draft.train.steps": m["steps"], "draft.train.tokens": m["train_tokens"],
                 "draft.train.labels": m["labels"], "draft.val.top1": m["validation"]["top1"]}
    size = write(pathlib.Path(args.out), cfg, params, token_map, target_hash=target.target_hash(args.target),
                 target_name=target.name_of(args.target), target_vocab=tcfg.vocab, tensor_type=args.type, extra=extra,
                 feature_layers=feature_layers, tensor_types=types)
    print(json.dumps({"out": args.out, "type": args.type, "bytes": size}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
