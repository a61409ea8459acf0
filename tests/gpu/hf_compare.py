"""Specula on the CUDA device against Hugging Face transformers' LlamaForCausalLM on the same tiny
safetensors checkpoints (tests/oracle/tiny_models.py), and against the committed golden logits
(tests/fixtures/golden). Run by scripts/gpu_check.sh on a GPU machine that has torch and
transformers; not part of CI (needs torch and a GPU).

Per variant and token sequence it prints max |error| and ||error|| / ||ref|| for
  specula --device cuda  vs transformers float32 (live, on this machine)
  specula --device cuda  vs the golden logits (transformers float32, made once, committed)
  specula --device host  vs transformers float32 (the float32 path, for scale)
  transformers bfloat16  vs transformers float32 (what BF16 weights alone cost there)
and fails when the CUDA device's relative error exceeds 1e-2 (the band for BF16 operands) or
exceeds twice transformers' own BF16 error plus 1e-3. Prints one JSON line per comparison.

usage: python3 tests/gpu/hf_compare.py SPECULA_BIN WORK_DIR"""
from __future__ import annotations

import json
import os
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "oracle"))
import specula_cli  # noqa: E402
import tiny_models  # noqa: E402

GOLDEN = ROOT / "tests" / "fixtures" / "golden"
TOL_REL = 1e-2


def rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def specula_logits(bin_path, model, tokens, work, device):
    os.environ["SPECULA_DEVICE"] = device
    try:
        return specula_cli.logits(bin_path, model, tokens, work)
    finally:
        del os.environ["SPECULA_DEVICE"]


def main(argv: list[str]) -> int:
    import torch
    from transformers import LlamaForCausalLM

    bin_path, work = pathlib.Path(argv[0]), pathlib.Path(argv[1])
    work.mkdir(parents=True, exist_ok=True)
    failures = 0
    for name in sorted(tiny_models.HF_VARIANTS):
        ck = tiny_models.build(name, work / "tiny")
        z = np.load(GOLDEN / f"tiny_{name}.npz")
        hf32 = LlamaForCausalLM.from_pretrained(ck.hf_dir, torch_dtype=torch.float32).eval()
        hf16 = LlamaForCausalLM.from_pretrained(ck.hf_dir, torch_dtype=torch.bfloat16).eval()
        i = 0
        while f"tokens_{i}" in z:
            tokens = z[f"tokens_{i}"].tolist()
            with torch.no_grad():
                ids = torch.tensor([tokens])
                ref = hf32(ids).logits[0].float().numpy()
                ref16 = hf16(ids).logits[0].float().numpy()
            cuda = specula_logits(bin_path, ck.hf_dir, tokens, work, "cuda")
            host = specula_logits(bin_path, ck.hf_dir, tokens, work, "host")
            row = {
                "variant": name, "sequence": i, "tokens": len(tokens),
                "cuda_vs_hf32_rel": rel(cuda, ref), "cuda_vs_hf32_max": float(np.abs(cuda - ref).max()),
                "cuda_vs_golden_rel": rel(cuda, z[f"logits_{i}"]),
                "host_vs_hf32_rel": rel(host, ref),
                "hf_bf16_vs_hf32_rel": rel(ref16, ref),
                "cuda_top1_agreement": float((cuda.argmax(-1) == ref.argmax(-1)).mean()),
            }
            ok = row["cuda_vs_hf32_rel"] < TOL_REL and row["cuda_vs_hf32_rel"] < 2 * row["hf_bf16_vs_hf32_rel"] + 1e-3
            row["ok"] = ok
            failures += not ok
            print(json.dumps(row), flush=True)
            i += 1
    print(f"hf_compare: {failures} comparison(s) over tolerance", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
