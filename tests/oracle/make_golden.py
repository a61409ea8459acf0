"""Makes the golden logits in tests/fixtures/golden/ with Hugging Face transformers (float32, eager
attention): an implementation independent of both Specula and numpy_llama.py. Run by hand, not
in CI (needs torch):

    /root/.cache/specula/torchvenv/bin/python tests/oracle/make_golden.py [--default-model PATH]

(a) tiny_<variant>.npz for every tiny variant with a Hugging Face directory: full logits
    [n, vocab] for two fixed token sequences, plus the sha256 of the generated weights.
(b) default_model.npz: SmolLM2-135M-Instruct's GGUF loaded by transformers' own GGUF code
    (load_gguf_checkpoint: gguf.quants.dequantize + its reverse_permute of q/k), 5 passages of
    32 tokens; per position the argmax id, the logits at the top-64 ids and at 192 fixed
    pseudo-random ids (full [32, 49152] logits would be 6 MB per prompt).
It also prints how far numpy_llama.py is from transformers on the same inputs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import default_model  # noqa: E402
import numpy_llama  # noqa: E402
import tiny_models  # noqa: E402

GOLDEN_DIR = HERE.parent / "fixtures" / "golden"
N_TOP, N_FIXED, N_TOKENS = 64, 192, 32


def tiny_sequences(spec) -> list[list[int]]:
    """Two fixed inputs: 48 pseudo-random ids over the whole vocabulary (specials included),
    and a ChatML conversation encoded with the tiny tokenizer."""
    from tokenizers import Tokenizer

    import tiny_tokenizer
    u = tiny_models.uniform(0, "golden-token-ids", (48,))
    random_ids = [int(x) for x in np.floor((u + 1) / 2 * spec.vocab)]
    tok = Tokenizer.from_str(json.dumps(tiny_tokenizer.tokenizer_json(spec.vocab)))
    chat = tok.encode("<|im_start|>user\nIs it the best of times?<|im_end|>\n<|im_start|>assistant\nIt was.",
                      add_special_tokens=False).ids
    return [random_ids, chat]


def torch_logits(model, ids) -> np.ndarray:
    import torch
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].to(torch.float64).numpy()


def make_tiny(out_dir: pathlib.Path, meta: dict) -> None:
    import torch
    from transformers import LlamaForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        for name in tiny_models.HF_VARIANTS:
            ck = tiny_models.build(name, pathlib.Path(tmp))
            model = LlamaForCausalLM.from_pretrained(str(ck.hf_dir), dtype=torch.float32,
                                                     attn_implementation="eager").eval()
            seqs = tiny_sequences(ck.spec)
            logits = [torch_logits(model, s) for s in seqs]
            ref = numpy_llama.NumpyLlama(
                numpy_llama.LlamaConfig.from_hf(tiny_models.hf_config(ck.spec)),
                {n: tiny_models.round_to_dtype(w, ck.spec.hf_dtype if w.ndim == 2 else "F32")
                 for n, w in ck.weights.items()})
            diff = max(float(np.abs(ref.logits(s) - l).max()) for s, l in zip(seqs, logits))
            print(f"tiny {name}: max |transformers - numpy_llama(float64)| = {diff:.2e}")
            arrays = {f"tokens_{i}": np.array(s, np.int32) for i, s in enumerate(seqs)}
            arrays.update({f"logits_{i}": l.astype(np.float32) for i, l in enumerate(logits)})
            info = dict(meta, variant=name, weights_sha256=tiny_models.weights_sha256(ck.weights),
                        numpy_max_abs_diff=diff)
            np.savez_compressed(out_dir / f"tiny_{name}.npz", meta=np.array(json.dumps(info)), **arrays)


def transformers_from_gguf(path: pathlib.Path):
    """LlamaForCausalLM with weights from transformers' own GGUF reader (dequantize + un-permute)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    parsed = load_gguf_checkpoint(str(path), return_tensors=False)
    cfg = dict(parsed["config"])
    cfg.pop("model_type", None)
    config = LlamaConfig(**cfg)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    parsed = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)
    missing, unexpected = model.load_state_dict(parsed["tensors"], strict=False)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    assert not missing and not unexpected, (missing, unexpected)
    model.tie_weights()
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight) == config.tie_word_embeddings
    return model


def make_default(path: pathlib.Path, out_dir: pathlib.Path, meta: dict) -> None:
    model = transformers_from_gguf(path)
    ref = default_model.reference(str(path))
    fixed_ids = np.sort(np.random.default_rng(20240601).choice(model.config.vocab_size, N_FIXED, replace=False))
    tokens, argmax, top_ids, top_logits, fixed_logits, margins, diffs = [], [], [], [], [], [], []
    for text in default_model.PASSAGES:
        ids = default_model.encode(path, text)[:N_TOKENS]
        assert len(ids) == N_TOKENS, f"passage too short: {text!r}"
        logits = torch_logits(model, ids)  # [32, vocab] float64 view of float32
        order = np.argsort(-logits, axis=-1, kind="stable")
        tokens.append(ids)
        argmax.append(order[:, 0])
        top_ids.append(order[:, :N_TOP])
        top_logits.append(np.take_along_axis(logits, order[:, :N_TOP], axis=-1))
        fixed_logits.append(logits[:, fixed_ids])
        margins.append(np.take_along_axis(logits, order[:, :1], -1) - np.take_along_axis(logits, order[:, 1:2], -1))
        diffs.append(float(np.abs(ref.logits(ids) - logits).max()))
    info = dict(meta, model=path.name, model_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                numpy_max_abs_diff=max(diffs), min_top2_margin=float(np.min(margins)))
    print(f"default model: max |transformers - numpy_llama(float32)| over all logits = {max(diffs):.2e}; "
          f"smallest top-1/top-2 gap = {np.min(margins):.3f}")
    np.savez_compressed(
        out_dir / "default_model.npz", meta=np.array(json.dumps(info)),
        tokens=np.array(tokens, np.int32), argmax=np.array(argmax, np.int32),
        top_ids=np.array(top_ids, np.int32), top_logits=np.array(top_logits, np.float32),
        fixed_ids=fixed_ids.astype(np.int32), fixed_logits=np.array(fixed_logits, np.float32))


def main() -> int:
    import torch
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--default-model", type=pathlib.Path,
                    default=pathlib.Path.home() / ".cache/specula/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", type=pathlib.Path, default=GOLDEN_DIR)
    ap.add_argument("--only", choices=["tiny", "default"])
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__,
            "made_by": "tests/oracle/make_golden.py"}
    if args.only in (None, "tiny"):
        make_tiny(args.out, meta)
    if args.only in (None, "default"):
        make_default(args.default_model, args.out, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
