"""Checks an exported draft GGUF against the training forward: the file, read as the runtime reads
it (reference_drafter.py: llama.cpp q/k layout, adjacent-pair RoPE, one entry at a time, absolute
positions), must give head.multi_step_forward's logits at every depth, on the first sequence of
a data file. Negative control: depth 2 fed the target's true hidden state instead of the draft's
own feature must NOT match (so the check can tell the multi-step wiring apart).

    python -m draft.check_export --target T.gguf --draft D.gguf --data a.spd [--entries 24] [--depth 3]

Prints JSON {"max_rel_error": [per depth], "control_rel_error": x, "ok": bool}; exit 1 unless ok.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    __package__ = "draft"

from . import data_format, export, target  # noqa: E402
from .head import HeadConfig, multi_step_forward  # noqa: E402
from .reference_drafter import ReferenceDrafter  # noqa: E402

TOLERANCE = 2e-3  # max |diff| / max |logit|: float32 (JAX) against float64 (reference) over the head's layers
POSITION_OFFSET = 100  # the reference uses absolute positions; training windows start at 0


def params_from_file(path) -> tuple[HeadConfig, dict]:
    """The file's weights back in head.py's layout (q/k rows un-permuted), as export.read gives them."""
    cfg, params, _, _, _ = export.read(path)
    return cfg, {k: np.asarray(v, np.float32) for k, v in params.items()}


def reference_logits(d: ReferenceDrafter, feat, tok, a: int, j: int, own_features: bool = True) -> np.ndarray:
    """Depth-j logits at entry a the way drafting computes them: depth-1 entries 0..a-j+1 from the
    target's features, then j-1 steps each fed the previous step's g (or, for the control, the
    target's true feature) and the next token."""
    d.truncate(0)
    first = a - j + 1
    for b in range(first + 1):
        logits, g = d.step(feat[b], int(tok[b]), b + POSITION_OFFSET)
    for b in range(first + 1, a + 1):
        logits, g = d.step(g if own_features else feat[b], int(tok[b]), b + POSITION_OFFSET)
    return logits


def check(target_path, draft_path, data_path, entries: int = 24, depth: int = 3) -> dict:
    import jax.numpy as jnp
    embed = target.token_embedding(target_path)
    d = ReferenceDrafter(draft_path, embed)
    cfg, params = params_from_file(draft_path)
    _, seqs = data_format.read(data_path)
    s = seqs[0]
    L = min(entries, len(s.tokens) - 1)
    feat = np.asarray(s.hidden[:L, :cfg.feature_chunks * cfg.hidden], np.float32)  # entry a: h_{a}, token x_{a+1}
    tok = np.asarray(s.tokens[1:L + 1])
    logits = np.asarray(multi_step_forward(cfg, {k: jnp.asarray(v) for k, v in params.items()},
                                           jnp.asarray(feat[None]), jnp.asarray(embed[tok][None]), depth)[0])
    errors = []
    for j in range(1, depth + 1):
        worst = 0.0
        for a in range(j - 1, L):
            ref = reference_logits(d, feat, tok, a, j)
            worst = max(worst, float(np.abs(ref - logits[j - 1, 0, a]).max() / np.abs(ref).max()))
        errors.append(worst)
    control = 0.0
    if depth >= 2:
        for a in range(1, L):
            ref = reference_logits(d, feat, tok, a, 2, own_features=False)
            control = max(control, float(np.abs(ref - logits[1, 0, a]).max() / np.abs(ref).max()))
    ok = max(errors) < TOLERANCE and (depth < 2 or control > 10 * TOLERANCE)
    return {"max_rel_error": [round(e, 7) for e in errors], "control_rel_error": round(control, 5),
            "tolerance": TOLERANCE, "entries": L, "ok": ok}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="check an exported draft GGUF against the training forward")
    p.add_argument("--target", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--entries", type=int, default=24)
    p.add_argument("--depth", type=int, default=3)
    a = p.parse_args(argv)
    r = check(a.target, a.draft, a.data, a.entries, a.depth)
    print(json.dumps(r))
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
