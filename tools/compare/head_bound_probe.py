"""Would a 4-bit copy of the output head find the greedy token exactly? (docs/kernels.md, "Not done
yet": "The output head's bytes"). For the target's final hidden states in a draft data file, it
computes the logits from the head's Q8_0 rows and from those rows re-quantized to Q4_0 and Q4_1,
and per token a bound on their difference that needs no second pass over the rows (per 32-value
block: the largest |difference| times the block's L1 norm of the state, or the two L2 norms,
Cauchy-Schwarz). A token can be the Q8_0 argmax only if its 4-bit logit plus its bound reaches
the largest 4-bit logit minus its bound; it prints how many tokens pass that test (the rows an
exact greedy head would then dot again from the Q8_0 copy). f32 states, no activation quantizer:
the int8 path's bound would be looser still.

usage: python head_bound_probe.py MODEL.gguf DATA.spd [--positions N]
(DATA.spd from `specula draft-data`; the sixty-fourth session's run: `specula draft-data --out
probe.spd --samples 24 --seed 777 --response-tokens 160`.)
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "oracle"))
sys.path.insert(0, str(ROOT))
import gguf  # noqa: E402
import gguf_weights  # noqa: E402
from tools.draft import data_format  # noqa: E402

BLOCK = 32


def requantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    """ggml's Q4_0 of each 32-value block (d = the signed largest / -8, fp16), dequantized."""
    at = np.argmax(np.abs(blocks), axis=2)
    largest = np.take_along_axis(blocks, at[..., None], 2)
    d = (largest / -8).astype(np.float16).astype(np.float32)
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    return (np.clip(np.round(blocks * inv + 8), 0, 15) - 8) * d


def requantize_q4_1(blocks: np.ndarray) -> np.ndarray:
    """Q4_1 of each block (scale (max - min) / 15 and min, fp16), dequantized."""
    lo, hi = blocks.min(2, keepdims=True), blocks.max(2, keepdims=True)
    d = ((hi - lo) / 15).astype(np.float16).astype(np.float32)
    m = lo.astype(np.float16).astype(np.float32)
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    return np.clip(np.round((blocks - m) * inv), 0, 15) * d + m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("data")
    ap.add_argument("--positions", type=int, default=1500, help="hidden states drawn at random (seed 0)")
    a = ap.parse_args()
    reader = gguf.GGUFReader(a.model)
    names = {t.name: t for t in reader.tensors}
    head = names.get("output.weight", names["token_embd.weight"])
    w8 = gguf_weights.dequantized(head).astype(np.float32)
    vocab, width = w8.shape
    _, seqs = data_format.read(a.data)
    states = np.concatenate([s.hidden[:, :width] for s in seqs]).astype(np.float32)
    pick = np.random.default_rng(0).choice(len(states), size=min(a.positions, len(states)), replace=False)
    x = states[pick]
    exact = x @ w8.T
    ranked = np.sort(exact, 1)
    gap = ranked[:, -1] - ranked[:, -2]
    print(f"{len(x)} states of {len(states)}; head {head.name} {vocab} x {width}; "
          f"top-1 minus top-2 logit: median {np.median(gap):.3f}, 10th percentile {np.percentile(gap, 10):.3f}")
    blocks = w8.reshape(vocab, width // BLOCK, BLOCK)
    xb = x.reshape(len(x), width // BLOCK, BLOCK)
    for fmt, requantize in (("Q4_0", requantize_q4_0), ("Q4_1", requantize_q4_1)):
        w4 = requantize(blocks)
        diff = blocks - w4
        approx = x @ w4.reshape(vocab, width).T
        bounds = {
            "largest |difference| x L1": np.abs(xb).sum(2) @ np.abs(diff).max(2).T,
            "L2 x L2 (Cauchy-Schwarz)": np.sqrt((xb * xb).sum(2)) @ np.sqrt((diff * diff).sum(2)).T,
        }
        for name, bound in bounds.items():
            if np.any(np.abs(exact - approx) > bound * (1 + 1e-4) + 1e-4):
                print(f"{fmt} {name}: the bound does not hold", file=sys.stderr)
                return 1
            floor = (approx - bound).max(1, keepdims=True)
            passing = ((approx + bound) >= floor).sum(1)
            print(f"{fmt}, {name}: |error| mean {np.abs(exact - approx).mean():.3f}, bound mean {bound.mean():.2f}; "
                  f"tokens left to dot again: mean {passing.mean():.0f}, median {np.median(passing):.0f}, "
                  f"10th percentile {np.percentile(passing, 10):.0f}, fewest {passing.min()} of {vocab}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
