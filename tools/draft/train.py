"""Trains the draft head on draft data files and exports it (docs/draft.md, "Training").

    python -m draft.train --target T.gguf --data a.spd [b.spd ...] --out DIR [options]

Writes DIR/draft.gguf, DIR/metrics.json and DIR/train.log (progress lines), and prints the
metrics JSON (validation top-1 accuracy per draft depth, ...) on stdout.

Loss at depth j (1..K) over every entry that has a depth-j input (entry a >= j-1 of its window):
soft cross-entropy to the target's top-k p restricted to the reduced vocabulary and renormalised
(when the data carries top-k), else cross-entropy to the next token (hard); with
--overlap-weight W, plus W (1 - overlap at --temperature), the share of a sampled draft that
rejection sampling would turn down there (docs/draft.md, "The eighth fine-tune"); depth j weighs
decay^(j-1). Validation covers the response entries (those predicting a token after the prompt).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    __package__ = "draft"

from . import data_format, export, target, vocab  # noqa: E402
from .head import LAYER_PARAMS, HeadConfig, init_params, layer_name, multi_step_forward  # noqa: E402


# ---------------------------------------------------------------- windows

class WindowFeatures:
    """The `feat` array of windows(), gathered on demand: indexing with window numbers gives the
    float16 [n, window, width] block of those windows (zero padded), read from the sequences'
    memory-mapped features. Materialized, the features of two million entries padded into windows
    are ~12 GB; gathered per batch, training holds only the files' pages the kernel keeps cached."""

    def __init__(self, seqs, src: np.ndarray, window: int, width: int):
        self.seqs, self.src, self.window, self.width = seqs, src, window, width

    def __getitem__(self, idx) -> np.ndarray:
        rows = self.src[np.atleast_1d(np.asarray(idx))]
        out = np.zeros((len(rows), self.window, self.width), np.float16)
        for j, (si, a) in enumerate(rows):
            h = self.seqs[si].hidden
            chunk = h[a:min(a + self.window, len(h) - 1), :self.width]
            out[j, :len(chunk)] = chunk
        return out


def windows(seqs, window: int, inverse: np.ndarray, topk: int, width: int) -> dict:
    """Cuts every sequence's entries i = 1..T-1 into windows of `window` entries (zero padded).
    Per entry: feat = the first `width` values of the target's features at i-1, tok = x_i,
    next = x_{i+1} (-1 past the end), labels of p_i. The small arrays are allocated once at their
    final size and filled in place; `feat` is a WindowFeatures, gathered from the sequences when
    a batch is taken (batch_at)."""
    count = sum((len(s.tokens) - 1 + window - 1) // window for s in seqs if len(s.tokens) >= 2)
    k_soft = topk if topk else 1
    out = {
        "tok": np.zeros((count, window), np.int32),
        "mask": np.zeros((count, window), np.float32),
        "vmask": np.zeros((count, window), np.float32),
        "next": np.full((count, window), -1, np.int64),
        "hard": np.full((count, window), -1, np.int32),
        "top1": np.full((count, window), -1, np.int32 if topk else np.int64),
        "soft_r": np.zeros((count, window, k_soft), inverse.dtype if topk else np.int32),
        "soft_p": np.zeros((count, window, k_soft), np.float32),
    }
    src = np.zeros((count, 2), np.int64)  # per window: its sequence and first entry
    w = 0
    for si, s in enumerate(seqs):
        T = len(s.tokens)
        if T < 2:
            continue
        n = T - 1
        ent = {
            "tok": np.asarray(s.tokens[1:], dtype=np.int32),
            "mask": np.ones(n, np.float32),
            # Entry i predicts x_{i+1}: a response token when i + 1 >= n_prompt.
            "vmask": (np.arange(1, T) + 1 >= s.n_prompt).astype(np.float32),
            "next": np.append(np.asarray(s.tokens[2:], np.int32), -1),
        }
        ent["hard"] = np.where(ent["next"] >= 0, inverse[np.maximum(ent["next"], 0)], -1).astype(np.int32)
        if topk:
            ids = np.asarray(s.topk_ids[1:], dtype=np.int32)
            r = inverse[ids]
            ent["top1"] = ids[:, 0]
            ent["soft_r"] = np.maximum(r, 0)
            ent["soft_p"] = np.where(r >= 0, np.asarray(s.topk_probs[1:], np.float32), 0.0)
        else:
            ent["top1"] = ent["next"]
        for a in range(0, n, window):
            for k, v in ent.items():
                chunk = v[a:a + window]
                out[k][w, :len(chunk)] = chunk
            src[w] = (si, a)
            w += 1
    assert w == count
    out["feat"] = WindowFeatures(seqs, src, window, width)
    return out


def _sha256(path) -> str:
    import hashlib
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def batch_at(w: dict, idx: np.ndarray) -> dict:
    return {k: v[idx] for k, v in w.items()}


# ---------------------------------------------------------------- loss and metrics

def make_fns(cfg: HeadConfig, depth: int, soft: bool, decay: float, feature_weight: float = 0.0,
             overlap_weight: float = 0.0, temperature: float = 0.8, argmax_weight: float = 0.0):
    import jax
    import jax.numpy as jnp

    def forward_both(params, embed, b):
        emb = embed[b["tok"]]
        return multi_step_forward(cfg, params, b["feat"].astype(jnp.float32), emb, depth)

    def forward(params, embed, b):
        return forward_both(params, embed, b)[0]

    def feature_loss(params, g, b, weights):
        """EAGLE's feature regression: depth j's output feature g at entry a is pulled (smooth L1,
        mean over the width) to entry a + 1's depth-1 input feature (the target's own h_i, or fuse
        of its fused features); so the features fed to depths 2..K live where depth 1's inputs do.
        The window's last entry has no next one and carries no feature loss."""
        nxt = b["feat"][:, 1:].astype(jnp.float32)
        # With fused features the next entry's depth-1 input is fuse(features): pull g there
        # (the target held fixed, so the loss cannot shrink fuse); otherwise it is h itself.
        want = jax.lax.stop_gradient(nxt @ params["fuse"].T) if cfg.feature_chunks > 1 else nxt
        d = jnp.abs(g[:, :, :-1] - want[None])
        per = jnp.where(d < 1.0, 0.5 * d * d, d - 0.5).mean(-1)  # [K, B, L-1]
        m = depth_masks(b, "mask")[:, :, :-1] * b["mask"][None, :, 1:]
        per_depth = (per * m).sum((1, 2)) / jnp.maximum(m.sum((1, 2)), 1.0)
        return (weights * per_depth).sum() / weights.sum()

    def depth_masks(b, key):
        L = b["tok"].shape[1]
        pos = jnp.arange(L)
        return jnp.stack([b[key] * (pos >= j)[None, :] for j in range(depth)])  # [K, B, L]

    def at_topk(x, b):
        """x[..., N] (logits or probabilities over the reduced vocabulary) at the entry's top-k tokens."""
        return jnp.take_along_axis(x, jnp.broadcast_to(b["soft_r"], x.shape[:3] + b["soft_r"].shape[-1:]), axis=-1)

    def per_entry_loss(logits, b, argmax_weight=0.0):
        logp = jax.nn.log_softmax(logits, axis=-1)  # [K, B, L, N]
        if soft:
            p = b["soft_p"]
            z = p.sum(-1, keepdims=True)
            p = jnp.where(z > 0, p / jnp.maximum(z, 1e-30), 0.0)
            at = at_topk(logp, b)
            loss = -(at * p[None]).sum(-1)
            if argmax_weight > 0:
                # Cross-entropy to the target's argmax (the top-k's first token, where the reduced
                # vocabulary holds it) beside the soft labels: greedy acceptance's own objective, at a
                # weight that leaves the soft q its overlap with p for sampled drafts.
                loss = loss - argmax_weight * jnp.where(b["soft_p"][None, ..., 0] > 0, at[..., 0], 0.0)
            return loss, (z[..., 0] > 0)
        hard = b["hard"]
        picked = jnp.take_along_axis(logp, jnp.broadcast_to(jnp.maximum(hard, 0)[None, ..., None], logp.shape[:3] + (1,)), axis=-1)[..., 0]
        return -picked, hard >= 0

    def overlap_at_t(logits, b):
        """sum over the entry's top-k tokens of min(p_T, q_T) at the sampling temperature T: an
        estimate of the probability that a token drawn from q_T is accepted against p_T (exact
        rejection sampling). The data holds p at T = 1 on the top-k tokens in the reduced
        vocabulary only, so p_T is those p raised to 1 / T and renormalised over them: the rest's
        share is left out, which raises p_T there (at T = 1 this is >= alpha_lower_bound). q_T
        is the head's softmax of logits / T over its reduced vocabulary."""
        q_at = at_topk(jax.nn.softmax(logits / temperature, axis=-1), b)
        p = b["soft_p"]
        pt = jnp.where(p > 0, jnp.power(jnp.maximum(p, 1e-30), 1.0 / temperature), 0.0)
        zt = pt.sum(-1, keepdims=True)
        pt = jnp.where(zt > 0, pt / jnp.maximum(zt, 1e-30), 0.0)
        return jnp.minimum(q_at, pt[None]).sum(-1)  # [K, B, L]

    def loss_fn(params, embed, b):
        logits, g = forward_both(params, embed, b)
        loss, ok = per_entry_loss(logits, b, argmax_weight)
        if overlap_weight > 0 and soft:
            # Total variation at T beside the cross-entropy: 1 - overlap is what a sampled draft
            # loses to rejection; the cross-entropy alone spends the head's capacity on the tail too.
            loss = loss + overlap_weight * (1.0 - overlap_at_t(logits, b))
        m = depth_masks(b, "mask") * ok[None]
        per_depth = (loss * m).sum((1, 2)) / jnp.maximum(m.sum((1, 2)), 1.0)
        weights = jnp.asarray([decay ** j for j in range(depth)], jnp.float32)
        total = (weights * per_depth).sum() / weights.sum()
        if feature_weight > 0:
            total = total + feature_weight * feature_loss(params, g, b, weights)
        return total, per_depth

    def eval_fn(params, embed, token_map, b):
        logits = forward(params, embed, b)
        loss, ok = per_entry_loss(logits, b)
        m = depth_masks(b, "vmask") * (b["top1"] >= 0)[None]
        pred = token_map[jnp.argmax(logits, axis=-1)]  # [K, B, L] target ids
        correct = ((pred == b["top1"][None]) * m).sum((1, 2))
        alpha = (jnp.minimum(at_topk(jax.nn.softmax(logits, axis=-1), b), b["soft_p"][None]).sum(-1) * m).sum((1, 2))
        alpha_t = (overlap_at_t(logits, b) * m).sum((1, 2))
        lm = m * ok[None]
        # The greedy chain (what `bench spec` measures greedy, and `specula draft-eval --depth`):
        # at entry a, depth j + 1 is accepted when depths 1..j + 1 at entries a..a + j all equal
        # the target's argmax; counted where the data's next tokens are that argmax chain, so that
        # the depth-j inputs (true tokens) are the drafts an accepted chain feeds.
        hit = pred == b["top1"][None]  # [K, B, L]

        def ahead(x, j):  # x[..., a + j] at a, False past the window
            return jnp.pad(x[..., j:], [(0, 0)] * (x.ndim - 1) + [(0, j)]) if j else x

        greedy = b["tok"][:, 1:] == b["top1"][:, :-1]  # entry a + 1's token is entry a's argmax
        greedy = jnp.pad(greedy, [(0, 0), (0, 1)])
        valid = (b["vmask"] > 0) & (b["top1"] >= 0)
        for j in range(1, depth):
            valid = valid & ahead(greedy, j - 1) & ahead(b["top1"] >= 0, j)
        acc, run = [], valid
        for j in range(depth):
            run = run & ahead(hit[j], j)
            acc.append(run.sum())
        return {"correct": correct, "n": m.sum((1, 2)), "alpha": alpha, "alpha_t": alpha_t, "loss": (loss * lm).sum((1, 2)), "n_loss": lm.sum((1, 2)),
                "chain": jnp.stack(acc), "chain_n": valid.sum()}

    return jax.jit(loss_fn), jax.jit(eval_fn)


def evaluate(eval_fn, params, embed, token_map, w: dict, batch: int, topk: int, temperature: float) -> dict:
    tot = None
    for a in range(0, len(w["tok"]), batch):
        r = eval_fn(params, embed, token_map, batch_at(w, np.arange(a, min(a + batch, len(w["tok"])))))
        r = {k: np.asarray(v, np.float64) for k, v in r.items()}
        tot = r if tot is None else {k: tot[k] + r[k] for k in tot}
    n = np.maximum(tot["n"], 1)
    out = {"top1": (tot["correct"] / n).round(4).tolist(),
           "loss": (tot["loss"] / np.maximum(tot["n_loss"], 1)).round(4).tolist(),
           "entries": tot["n"].astype(int).tolist()}
    if topk:
        out["alpha_lower_bound"] = (tot["alpha"] / n).round(4).tolist()
        # The overlap at the sampling temperature (make_fns' overlap_at_t: an estimate, not a bound).
        out["overlap_at_t"] = (tot["alpha_t"] / n).round(4).tolist()
        out["temperature"] = temperature
    # Greedy chain acceptance per depth (the first j drafts all right) and its sum, the mean
    # accepted length of a round drafting `depth` tokens: top1 above is per depth, not chained.
    chain = tot["chain"] / max(tot["chain_n"], 1)
    out["chain_accepted"] = chain.round(4).tolist()
    out["mean_accepted_length"] = round(float(chain.sum()), 4)
    return out


# ---------------------------------------------------------------- main

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--target", required=True, help="the target's GGUF")
    p.add_argument("--data", required=True, nargs="+", help="draft data files (data_format.py)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--vocab", type=int, default=None,
                   help="reduced vocabulary size N (default 8192); with --init-from, a larger N extends the file's "
                        "vocabulary by the training text's next most frequent tokens (their output rows start from "
                        "the target's)")
    p.add_argument("--depth", type=int, default=5, help="draft depths K trained (default 5)")
    p.add_argument("--steps", type=int, default=2000, help="optimizer steps (each --batch windows of --window entries)")
    p.add_argument("--batch", type=int, default=8, help="windows per step")
    p.add_argument("--window", type=int, default=256, help="entries per window")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=float, default=0.05, help="warm-up fraction of the steps")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--decay", type=float, default=0.8, help="loss weight of depth j is decay^(j-1)")
    p.add_argument("--feature-weight", type=float, default=0.0,
                   help="weight of EAGLE's feature regression loss (smooth L1 of the head's output feature to the target's next h)")
    p.add_argument("--feature-chunks", type=int, default=0,
                   help="H-wide feature chunks read at depth 1 (1: the final hidden state alone; default: all the data has)")
    p.add_argument("--overlap-weight", type=float, default=0.0,
                   help="weight of 1 - sum min(p_T, q_T) over the top-k at --temperature, added to the soft cross-entropy "
                        "(what a sampled draft loses to rejection; 0: off)")
    p.add_argument("--argmax-weight", type=float, default=0.0,
                   help="weight of the cross-entropy to the target's argmax (where the reduced vocabulary holds it), "
                        "added to the soft cross-entropy (greedy drafting's objective; 0: off)")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="the sampling temperature of --overlap-weight and of the validation's overlap_at_t")
    p.add_argument("--labels", choices=["auto", "soft", "hard"], default="auto",
                   help="auto: soft when the data carries top-k probabilities")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0, help="the validation split, the start of a new head and (by default) the window order")
    p.add_argument("--shuffle-seed", type=int, default=None,
                   help="the order of the training windows alone, keeping --seed's validation split (another pass over "
                        "the same data with --init-from; default: --seed's stream)")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--export-type", choices=export.TENSOR_TYPES, default="Q8_0")
    p.add_argument("--export-types", default="",
                   help="matrices exported at another type than --export-type, e.g. head=Q8_0,fc=Q8_0,fuse=Q8_0")
    p.add_argument("--layers", type=int, default=None,
                   help="decoder layers (default 1, or the --init-from file's); with --init-from, layers beyond the "
                        "file's are appended after its own, each starting as the identity (its attention and MLP "
                        "output matrices at zero), so training starts from the file's own function")
    p.add_argument("--new-layer-from", choices=["random", "previous"], default="random",
                   help="an appended layer's other matrices and norms: init_params' random start, or a copy of the "
                        "layer before it (its output matrices start at zero either way)")
    p.add_argument("--new-layer-lr-scale", type=float, default=1.0,
                   help="learning-rate factor for the layers --layers appends to an --init-from head")
    p.add_argument("--init-from", default="",
                   help="a head GGUF to start from (fine-tuning): its weights, reduced vocabulary and feature layers "
                        "replace the random start (--vocab may only extend the vocabulary); the data must carry its "
                        "feature layers first, and further layers of the data start at zero weight in fuse")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.temperature > 0:
        raise SystemExit(f"--temperature must be > 0, got {args.temperature}")
    if args.steps < 2:
        raise SystemExit(f"--steps must be at least 2 (a warm-up step and a decay), got {args.steps}")
    if args.vocab is not None and args.vocab < 1:
        raise SystemExit(f"--vocab must be at least 1, got {args.vocab}")
    if args.layers is not None and args.layers < 1:
        raise SystemExit(f"--layers must be at least 1, got {args.layers}")
    if not args.new_layer_lr_scale > 0:
        raise SystemExit(f"--new-layer-lr-scale must be > 0, got {args.new_layer_lr_scale}")
    try:
        export_types = export.parse_types(args.export_types)
    except ValueError as e:
        raise SystemExit(f"--export-types: {e}")
    import jax
    import jax.numpy as jnp
    import optax

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "train.log", "w", buffering=1)

    def say(msg):
        log.write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")

    tcfg = target.read_config(args.target)
    header, seqs = data_format.read_all(args.data)
    if header.hidden != tcfg.hidden or header.vocab != tcfg.vocab:
        raise SystemExit(f"data (hidden {header.hidden}, vocab {header.vocab}) was not made by this target "
                         f"(hidden {tcfg.hidden}, vocab {tcfg.vocab})")
    chunks = args.feature_chunks or 1 + len(header.feature_layers)
    if not 1 <= chunks <= 1 + len(header.feature_layers):
        raise SystemExit(f"--feature-chunks {chunks}: the data has {1 + len(header.feature_layers)}")
    feature_layers = [int(x) for x in header.feature_layers[:chunks - 1]]
    soft = header.topk > 0 if args.labels == "auto" else args.labels == "soft"
    if soft and not header.topk:
        raise SystemExit("--labels soft: the data carries no top-k probabilities")
    if args.overlap_weight < 0 or (args.overlap_weight > 0 and not soft):
        raise SystemExit(f"--overlap-weight {args.overlap_weight}: needs soft labels (top-k p in the data) and a weight >= 0")
    if args.argmax_weight < 0 or (args.argmax_weight > 0 and not soft):
        raise SystemExit(f"--argmax-weight {args.argmax_weight}: needs soft labels (top-k p in the data) and a weight >= 0")

    rng = np.random.default_rng(args.seed)
    order = rng.permutation(len(seqs))
    n_val = max(1, int(round(len(seqs) * args.val_fraction)))
    if len(seqs) < 2:
        raise SystemExit(f"need at least 2 sequences (train and validation), have {len(seqs)}")
    val_seqs, train_seqs = [seqs[i] for i in order[:n_val]], [seqs[i] for i in order[n_val:]]
    layers = args.layers or 1
    new_layer_params = set()  # the parameters of layers appended to an --init-from head
    if args.init_from:
        init_cfg, init, token_map, init_layers, init_meta = export.read(args.init_from)
        layers = args.layers or init_cfg.layers
        if layers < init_cfg.layers:
            raise SystemExit(f"--layers {layers}: {args.init_from} has {init_cfg.layers} layers; a head is not cut "
                             f"to fewer")
        if init_meta.get("draft.target_hash") != target.target_hash(args.target):
            raise SystemExit(f"--init-from {args.init_from} was trained for {init_meta.get('draft.target_name')}, "
                             f"not for {target.name_of(args.target)}")
        # The file's feature layers must lead the ones trained here; layers beyond them are added
        # with zero columns in fuse, so training starts from the file's own function.
        if init_layers != feature_layers[:len(init_layers)]:
            raise SystemExit(f"--init-from {args.init_from} reads feature layers {init_layers}; the data carries "
                             f"{list(header.feature_layers)} (and --feature-chunks {chunks})")
        n_init = len(token_map)
        if args.vocab is not None and args.vocab < n_init:
            raise SystemExit(f"--vocab {args.vocab}: {args.init_from} has {n_init} tokens; a smaller vocabulary is "
                             f"python -m draft.prune's job")
        if args.vocab is not None and args.vocab > n_init:
            token_map = vocab.extend(token_map, [s.tokens for s in train_seqs], args.vocab, tcfg.vocab)
        inverse = vocab.inverse_of(token_map, tcfg.vocab)
    else:
        token_map, inverse = vocab.reduced_vocab([s.tokens for s in train_seqs], args.vocab or 8192, tcfg.vocab)
    cov_val = vocab.coverage([s.tokens[s.n_prompt:] for s in val_seqs], inverse)
    topk = header.topk  # validation compares with the target's argmax whenever the data has it
    tw = windows(train_seqs, args.window, inverse, topk, chunks * tcfg.hidden)
    vw = windows(val_seqs, args.window, inverse, topk, chunks * tcfg.hidden)
    train_tokens = sum(len(s.tokens) for s in train_seqs)
    say(f"target {target.name_of(args.target)}: hidden {tcfg.hidden}, vocab {tcfg.vocab}; data {len(seqs)} sequences, "
        f"{train_tokens} training tokens, {len(tw['tok'])} train / {len(vw['tok'])} validation windows; "
        f"reduced vocab {len(token_map)} covers {cov_val:.4f} of validation response tokens; labels {'soft' if soft else 'hard'}")

    cfg = HeadConfig(hidden=tcfg.hidden, intermediate=tcfg.intermediate, heads=tcfg.heads, kv_heads=tcfg.kv_heads,
                     head_dim=tcfg.head_dim, rope_theta=tcfg.rope_theta, rms_eps=tcfg.rms_eps, n_vocab=len(token_map),
                     feature_chunks=chunks, layers=layers)
    embed_np = target.token_embedding(args.target)
    params = init_params(cfg, jax.random.PRNGKey(args.seed), target.output_rows(args.target)[token_map])
    if args.init_from:
        if chunks > 1 + len(init_layers):
            # fuse as init_params makes it (h passed through, the rest zero) under the file's own
            # columns: the head computes what the file computes until the new columns train.
            widened = np.asarray(params["fuse"], np.float32).copy()
            if "fuse" in init:
                widened[:, :init["fuse"].shape[1]] = init["fuse"]
            init["fuse"] = widened
            say(f"feature layers {feature_layers[len(init_layers):]} added to {args.init_from}'s {init_layers}, "
                f"their fuse columns at zero")
        if len(token_map) > init["head"].shape[0]:
            # The new tokens' output rows start from the target's, scaled by how far training moved
            # the file's rows from theirs (median norm ratio), so their logits start on its scale.
            old, target_rows = init["head"], np.asarray(params["head"], np.float32)
            norms = np.maximum(np.linalg.norm(target_rows[:len(old)], axis=1), 1e-12)
            ratio = float(np.median(np.linalg.norm(old, axis=1) / norms))
            init["head"] = np.concatenate([old, ratio * target_rows[len(old):]]).astype(np.float32)
            say(f"vocabulary extended from {len(old)} to {len(token_map)} tokens; new output rows = target's x {ratio:.3f}")
        for layer in range(init_cfg.layers, layers):
            # An appended layer starts as the identity: its attention and MLP write nothing into the
            # residual until their output matrices train. Its other matrices are init_params' random
            # start or the layer before's, so their gradients are not zero once the output ones move.
            for n in LAYER_PARAMS:
                src = init[layer_name(layer - 1, n)] if args.new_layer_from == "previous" else params[layer_name(layer, n)]
                zero = n in ("wo", "w_down")
                init[layer_name(layer, n)] = np.zeros(np.shape(src), np.float32) if zero else np.array(src, np.float32)
                new_layer_params.add(layer_name(layer, n))
        if layers > init_cfg.layers:
            say(f"layers {list(range(init_cfg.layers, layers))} appended to {args.init_from}'s {init_cfg.layers}, "
                f"each the identity at the start (other matrices: {args.new_layer_from}); learning rate x "
                f"{args.new_layer_lr_scale}")
        missing = sorted(set(params) ^ set(init))
        if missing or any(init[k].shape != tuple(params[k].shape) for k in params):
            raise SystemExit(f"--init-from {args.init_from}: its tensors do not fit this target's head shape ({missing})")
        params = {k: jnp.asarray(init[k]) for k in params}
        say(f"started from {args.init_from} ({len(token_map)} tokens, feature layers {init_layers})")
    embed = jnp.asarray(embed_np)
    token_map_j = jnp.asarray(token_map)

    sched = optax.warmup_cosine_decay_schedule(0.0, args.lr, max(1, int(args.steps * args.warmup)), args.steps, args.lr * 0.05)
    adamw = optax.adamw(sched, weight_decay=args.weight_decay)
    if new_layer_params and args.new_layer_lr_scale != 1.0:
        scaled = optax.adamw(lambda step: sched(step) * args.new_layer_lr_scale, weight_decay=args.weight_decay)
        labels = {k: "new" if k in new_layer_params else "old" for k in params}
        adamw = optax.multi_transform({"old": adamw, "new": scaled}, labels)
    opt = optax.chain(optax.clip_by_global_norm(1.0), adamw)
    opt_state = opt.init(params)
    loss_fn, eval_fn = make_fns(cfg, args.depth, soft, args.decay, args.feature_weight, args.overlap_weight, args.temperature,
                               args.argmax_weight)
    grad_fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))

    @jax.jit
    def update(params, opt_state, grads):
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    # Trivial baseline: always propose the most frequent training token.
    ref = vw["top1"]
    vmask = (vw["vmask"] > 0) & (ref >= 0)
    baseline = float((ref[vmask] == token_map[0]).mean()) if vmask.any() else 0.0
    initial = evaluate(eval_fn, params, embed, token_map_j, vw, args.batch, topk, args.temperature)
    say(f"initial validation: {json.dumps(initial)}; most-frequent-token baseline top-1 {baseline:.4f}")

    n_train = len(tw["tok"])
    if args.shuffle_seed is not None:
        rng = np.random.default_rng([args.seed, args.shuffle_seed])
    perm, cursor, t0, first_loss, last = rng.permutation(n_train), 0, time.time(), None, []
    for step in range(1, args.steps + 1):
        if cursor + args.batch > n_train:
            perm, cursor = rng.permutation(n_train), 0
        idx = perm[cursor:cursor + args.batch] if n_train >= args.batch else rng.integers(0, n_train, args.batch)
        cursor += args.batch
        (loss, per_depth), grads = grad_fn(params, embed, batch_at(tw, idx))
        params, opt_state = update(params, opt_state, grads)
        loss = float(loss)
        if first_loss is None:
            first_loss = loss
        last.append(loss)
        last = last[-args.log_every:]
        if step % args.log_every == 0 or step == args.steps:
            dt = time.time() - t0
            say(f"step {step}/{args.steps} loss {np.mean(last):.4f} depths {' '.join(f'{x:.3f}' for x in np.asarray(per_depth))} "
                f"lr {float(sched(step)):.2e} {step * args.batch * args.window / dt:.0f} entries/s")

    val = evaluate(eval_fn, params, embed, token_map_j, vw, args.batch, topk, args.temperature)
    metrics = {
        "validation": val, "initial_validation": initial, "baseline_top1": round(baseline, 4),
        "first_train_loss": round(first_loss, 4), "final_train_loss": round(float(np.mean(last)), 4),
        "train_tokens": train_tokens, "sequences": len(seqs), "vocab": len(token_map),
        "vocab_coverage": round(cov_val, 4), "depth": args.depth, "steps": args.steps, "labels": "soft" if soft else "hard",
        "feature_weight": args.feature_weight, "feature_layers": feature_layers, "overlap_weight": args.overlap_weight,
        "argmax_weight": args.argmax_weight,
        "layers": layers,
        "seconds": round(time.time() - t0, 1),
    }
    np.savez(out / "params.npz", token_map=token_map, feature_layers=np.asarray(feature_layers, np.int32), **{k: np.asarray(v) for k, v in params.items()})
    size = export.write(out / "draft.gguf", cfg, {k: np.asarray(v) for k, v in params.items()}, token_map,
                        target_hash=target.target_hash(args.target), target_name=target.name_of(args.target), target_vocab=tcfg.vocab,
                        tensor_type=args.export_type, feature_layers=feature_layers, tensor_types=export_types,
                        extra={"draft.train.depth": args.depth, "draft.train.steps": args.steps,
                               "draft.train.tokens": train_tokens, "draft.train.seed": args.seed,
                               **({"draft.train.shuffle_seed": args.shuffle_seed} if args.shuffle_seed is not None else {}),
                               "draft.train.labels": metrics["labels"], "draft.val.top1": val["top1"],
                               **({"draft.train.init_from_sha256": _sha256(args.init_from)} if args.init_from else {})})
    metrics["gguf_bytes"] = size
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    say(f"done: {json.dumps(metrics)}")
    print(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
