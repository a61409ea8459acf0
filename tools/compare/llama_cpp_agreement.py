"""Score llama.cpp's CPU path against Specula's f32 reference on the positions `bench decode` scored.

`specula bench decode --paths fast,reference --agreement-out F.jsonl` writes, per prompt, the
teacher-forced tokens (the prompt in the chat template plus the reference path's greedy
continuation) and, per position, both Specula paths' top-1 and the reference's gap between its
top two logits. This feeds the same tokens to llama.cpp (llama-cpp-python, its own kernels: for a
Q4_1 file it quantizes activations to 8 bits per 32-value block, as Specula's fast path does) and
prints JSON: llama.cpp's top-1 agreement with the reference, where the reference's top two are at
least 0.1 apart, and its disagreements by the reference's gap; beside it the same for Specula's
fast path, from the file. Tooling only (scripts/compare_llama_cpp.sh makes the venv).
"""
import argparse
import json
import sys

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the GGUF file bench decode ran")
    ap.add_argument("--agreement", required=True, help="bench decode's --agreement-out file")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    from llama_cpp import Llama  # imported here so that --help works without the wheel

    rows = [json.loads(line) for line in open(a.agreement)]
    longest = max(len(r["tokens"]) for r in rows)
    llm = Llama(model_path=a.model, n_ctx=max(512, longest + 8), n_batch=max(512, longest + 8), logits_all=True,
                n_threads=a.threads, verbose=False)
    gaps_edges = [0.01, 0.03, 0.1, 0.3]
    stats = {name: {"positions": 0, "same": 0, "clear_positions": 0, "clear_same": 0, "within": [0] * 4}
             for name in ("llama_cpp", "specula_fast")}
    for r in rows:
        tokens = r["tokens"]
        llm.reset()
        llm.eval(tokens)
        scores = np.asarray(llm.scores[: len(tokens)], dtype=np.float32)
        ref = np.asarray(r["reference_top1"])
        gap = np.asarray(r["reference_top2_gap"])
        n = len(ref)
        for name, top in (("llama_cpp", scores[:n].argmax(axis=1)), ("specula_fast", np.asarray(r["fast_top1"]))):
            s = stats[name]
            same = top == ref
            s["positions"] += n
            s["same"] += int(same.sum())
            clear = gap >= 0.1
            s["clear_positions"] += int(clear.sum())
            s["clear_same"] += int((same & clear).sum())
            # The reference's logit gap between its choice and the other's is at least its top-2 gap;
            # the file holds the top-2 gap, so a miss is counted where that gap is below each edge.
            for k, edge in enumerate(gaps_edges):
                s["within"][k] += int(((~same) & (gap < edge)).sum())
    out = {"model": a.model, "prompts": len(rows)}
    for name, s in stats.items():
        out[name] = {
            "positions": s["positions"],
            "top1_agreement_with_reference": s["same"] / s["positions"],
            "top1_disagreements": s["positions"] - s["same"],
            "disagreements_where_reference_top2_gap_below": dict(zip(map(str, gaps_edges), s["within"])),
            "top1_agreement_where_reference_top2_gap_at_least_0.1": s["clear_same"] / max(1, s["clear_positions"]),
        }
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
