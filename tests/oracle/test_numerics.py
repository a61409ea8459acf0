"""Specula's Llama forward (the `specula` program) against the independent NumPy reference.

Tiny random-weight checkpoints, every variant in every format it is written in: one prefill,
chunked re-feeds after a KV-cache truncation, quantized GGUF types against NumPy on the
gguf package's dequantization of the same bytes, and GGUF against safetensors of the same
weights (which shows the q/k row permutation is handled). Then the real default model:
greedy continuations of five chat prompts must equal NumPy's.
"""
import pathlib
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import default_model as smollm  # noqa: E402  (the name default_model is conftest's fixture)
import gguf_weights  # noqa: E402
import numpy_llama  # noqa: E402
import specula_cli  # noqa: E402
import tiny_models  # noqa: E402

# F32/F16/BF16 tiny models: the reference runs in float64 on exactly the stored values, so the
# only difference is Specula's float32 arithmetic. transformers (float32) sits ~1.4e-5 from the
# reference on these models; 1e-3 leaves room for other summation orders and fast exp/SIMD,
# while real bugs (wrong rope pairs or frequencies, a missing norm weight, an off-by-one
# position, a stale KV entry) move logits of magnitude ~10 by 1e-2 to 1. (Measured when written:
# Specula's host device is <= 1.2e-5 from the reference on every tiny variant and format.)
TOL_FLOAT = 1e-3
# Quantized tiny models: the reference dequantizes the same stored bytes with the gguf package,
# so the weights are bit-identical in both and the float32-arithmetic argument above applies
# unchanged (Specula dequantizes in registers and keeps activations in float32, DESIGN.md §4;
# measured <= 8.1e-6). A device that quantized activations (llama.cpp's q8 dot products) would
# need a looser, separately justified bound.
TOL_QUANT = 1e-3
# GGUF vs safetensors, both through Specula: identical weights and arithmetic except for the
# order of the rope pairs; forgetting the q/k permutation moves logits by > 0.1
# (test_reference_self_checks.py and the negative control below show it), float32 reordering
# by ~5e-6 (measured).
TOL_FORMATS = 1e-4

TOKENS = [int(x) for x in np.floor((tiny_models.uniform(0, "numerics-token-ids", (40,)) + 1) / 2 * 320)]
TRUNCATE_AT = 17

CASES = [(name, fmt) for name, spec in tiny_models.VARIANTS.items()
         for fmt in ("gguf", "safetensors") if fmt == "gguf" or spec.hf_dtype is not None]


def case_id(case):
    return f"{case[0]}-{case[1]}"


@pytest.fixture(scope="module")
def tiny(work_dir):
    return {name: tiny_models.build(name, work_dir / "tiny") for name in tiny_models.VARIANTS}


_REFERENCE_CACHE = {}


def reference_logits(ck, fmt: str) -> np.ndarray:
    """float64 NumPy logits for TOKENS on the weights exactly as the checkpoint stores them."""
    key = (ck.spec.name, fmt)
    if key not in _REFERENCE_CACHE:
        cfg = numpy_llama.LlamaConfig.from_hf(tiny_models.hf_config(ck.spec))
        if fmt == "gguf":
            _, weights, _ = gguf_weights.load(ck.gguf_path)  # dequantized, q/k un-permuted
        else:
            weights = {n: tiny_models.round_to_dtype(w, ck.spec.hf_dtype if w.ndim == 2 else "F32")
                       for n, w in ck.weights.items()}
        _REFERENCE_CACHE[key] = numpy_llama.NumpyLlama(cfg, weights).logits(TOKENS)
    return _REFERENCE_CACHE[key]


def model_path(ck, fmt):
    return ck.gguf_path if fmt == "gguf" else ck.hf_dir


def tolerance(ck):
    return TOL_QUANT if ck.spec.quantized else TOL_FLOAT


def max_err(a, b):
    return float(np.abs(a.astype(np.float64) - b).max())


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_prefill_logits_match_numpy(case, tiny, specula_bin, work_dir):
    ck = tiny[case[0]]
    got = specula_cli.logits(specula_bin, model_path(ck, case[1]), TOKENS, work_dir)
    want = reference_logits(ck, case[1])
    assert got.shape == want.shape
    err = max_err(got, want)
    assert err < tolerance(ck), f"max |specula - numpy| = {err:.3g} (row {np.unravel_index(np.abs(got - want).argmax(), got.shape)[0]})"


@pytest.mark.parametrize("chunk", [1, 3, 5])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_chunked_refeed_after_truncate_matches_numpy(case, chunk, tiny, specula_bin, work_dir):
    # Rows < 17 come from the first pass, rows >= 17 from re-feeding after truncating the KV
    # cache to 17: a cache that keeps stale entries or loses positions shifts those rows.
    ck = tiny[case[0]]
    got = specula_cli.logits(specula_bin, model_path(ck, case[1]), TOKENS, work_dir,
                             chunk=chunk, truncate_at=TRUNCATE_AT)
    want = reference_logits(ck, case[1])
    err_first, err_refed = max_err(got[:TRUNCATE_AT], want[:TRUNCATE_AT]), max_err(got[TRUNCATE_AT:], want[TRUNCATE_AT:])
    assert err_first < tolerance(ck), f"first pass: max error {err_first:.3g}"
    assert err_refed < tolerance(ck), f"re-fed rows: max error {err_refed:.3g}"


@pytest.mark.parametrize("chunk", [1, 3, 5])
@pytest.mark.parametrize("name", ["gqa_untied", "llama3_rope", "q4_1_tied"])
def test_chunked_prefill_matches_numpy(name, chunk, tiny, specula_bin, work_dir):
    ck = tiny[name]
    got = specula_cli.logits(specula_bin, ck.gguf_path, TOKENS, work_dir, chunk=chunk)
    err = max_err(got, reference_logits(ck, "gguf"))
    assert err < tolerance(ck), f"chunk {chunk}: max error {err:.3g}"


# The tiny model's rows (64 and 128 wide) are never whole 256-value super-blocks, so every K-quant
# llama.cpp asks falls back: Q4_K to Q5_0, Q5_K to Q5_1, Q2_K, Q3_K and IQ4_XS to IQ4_NL, Q6_K to Q8_0 (the
# tied embedding; attn_v / ffn_down of the layers Q4_K_M and Q5_K_M give more bits: of 2 layers,
# the last). Per mix: the types of q, gate, attn_output, v and ffn_down of layers 0 and 1.
K_QUANT_MIXES = {
    "Q4_K_M": ("Q5_0", "Q5_0", "Q5_0", ("Q5_0", "Q8_0"), ("Q5_0", "Q8_0")),
    "Q5_K_M": ("Q5_1", "Q5_1", "Q5_1", ("Q5_1", "Q8_0"), ("Q5_1", "Q8_0")),
    "Q3_K_M": ("IQ4_NL", "IQ4_NL", "Q5_0", ("Q5_1", "Q5_1"), ("Q5_0", "Q5_0")),
    "Q2_K": ("IQ4_NL", "IQ4_NL", "IQ4_NL", ("IQ4_NL", "IQ4_NL"), ("IQ4_NL", "IQ4_NL")),
    "IQ4_XS": ("IQ4_NL", "IQ4_NL", "IQ4_NL", ("IQ4_NL", "IQ4_NL"), ("IQ4_NL", "IQ4_NL")),
}


@pytest.mark.parametrize("mix", list(K_QUANT_MIXES))
def test_a_k_quant_mix_file_in_llama_cpps_fallback_types_loads_and_matches_numpy(mix, tiny, specula_bin, work_dir):
    # tools/compare/q4_k_m_of.py lays a model out as llama.cpp's quantizer would (docs/benchmarks.md,
    # "A Q4_K_M file", "A Q5_K_M file", "Q3_K_M and Q2_K files"). Specula loads Q5_0 and IQ4_NL as Q8_0
    # (exactly) and Q5_1 as it is; the NumPy reference dequantizes the file's own bytes with the
    # gguf package.
    import gguf
    src = tiny["gqa_tied"].gguf_path
    out = pathlib.Path(work_dir) / f"tiny.{mix}.gguf"
    script = pathlib.Path(__file__).resolve().parents[2] / "tools" / "compare" / "q4_k_m_of.py"
    run = subprocess.run([sys.executable, str(script), "--mix", mix, str(src), str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}
    q, gate, attn_output, v, down = K_QUANT_MIXES[mix]
    assert types["token_embd.weight"] == "Q8_0"
    assert (types["blk.0.attn_q.weight"], types["blk.1.ffn_gate.weight"], types["blk.1.attn_output.weight"]) == (q, gate, attn_output)
    assert (types["blk.0.attn_v.weight"], types["blk.1.attn_v.weight"]) == v
    assert (types["blk.0.ffn_down.weight"], types["blk.1.ffn_down.weight"]) == down
    assert types["blk.0.attn_norm.weight"] == "F32"
    cfg = numpy_llama.LlamaConfig.from_hf(tiny_models.hf_config(tiny["gqa_tied"].spec))
    _, weights, _ = gguf_weights.load(out)
    want = numpy_llama.NumpyLlama(cfg, weights).logits(TOKENS)
    err = max_err(specula_cli.logits(specula_bin, out, TOKENS, work_dir), want)
    assert err < TOL_QUANT, f"max |specula - numpy| = {err:.3g}"


@pytest.mark.parametrize("name", tiny_models.HF_VARIANTS)
def test_gguf_and_safetensors_give_the_same_logits(name, tiny, specula_bin, work_dir):
    ck = tiny[name]
    from_gguf = specula_cli.logits(specula_bin, ck.gguf_path, TOKENS, work_dir)
    from_hf = specula_cli.logits(specula_bin, ck.hf_dir, TOKENS, work_dir)
    err = max_err(from_gguf, from_hf)
    assert err < TOL_FORMATS, f"max |gguf - safetensors| = {err:.3g}"


def test_a_gguf_written_without_the_qk_permutation_does_not_match_safetensors(tiny, specula_bin, work_dir):
    # Negative control for the test above: Specula must rope GGUF q/k as adjacent pairs, so a file
    # whose rows were left in HF order (a broken converter) must NOT reproduce the HF logits.
    ck = tiny["gqa_untied"]
    broken = tiny_models.write_gguf(ck.spec, ck.weights, work_dir / "unpermuted.gguf", permute=False)
    diff = max_err(specula_cli.logits(specula_bin, broken, TOKENS, work_dir),
                   specula_cli.logits(specula_bin, ck.hf_dir, TOKENS, work_dir).astype(np.float64))
    assert diff > 100 * TOL_FORMATS, f"unpermuted GGUF is only {diff:.3g} from safetensors"


def test_llama3_gguf_with_only_rope_freqs_matches_numpy(tiny, specula_bin, work_dir):
    # llama.cpp's converter marks llama3 scaling only by the rope_freqs.weight tensor (no
    # llama.rope.scaling.* keys): real Llama 3.x GGUF files look like this.
    ck = tiny["llama3_rope"]
    path = tiny_models.write_gguf(ck.spec, ck.weights, work_dir / "llama3_rope_freqs_only.gguf", scaling_keys=False)
    err = max_err(specula_cli.logits(specula_bin, path, TOKENS, work_dir), reference_logits(ck, "gguf"))
    assert err < TOL_FLOAT, f"max |specula - numpy| = {err:.3g}"


# ---------------------------------------------------------------- the default model

N_COMPARE = 16


@pytest.fixture(scope="module")
def greedy_runs(default_model, specula_bin):
    """[(prompt ids, numpy ids, numpy margins, specula JSON)] for the five chat prompts.
    NumPy: float32 on the GGUF's weights dequantized by the gguf package, q/k un-permuted to HF
    layout, half-split RoPE."""
    ref = smollm.reference(str(default_model))
    stops = smollm.stop_ids(default_model)
    runs = []
    for q in smollm.QUESTIONS:
        prompt = smollm.encode(default_model, smollm.chat_text(q))
        ids, margins = numpy_llama.greedy_generate(ref, prompt, N_COMPARE, stops)
        out = specula_cli.generate_greedy(specula_bin, default_model, prompt, max_tokens=N_COMPARE)
        runs.append((prompt, ids, margins, out))
    return runs


def test_default_model_greedy_continuations_match_numpy(greedy_runs):
    for prompt, ids, margins, out in greedy_runs:
        assert len(ids) == N_COMPARE, "prompts are chosen so NumPy does not stop before 16 tokens"
        assert out["prompt_ids"] == prompt
        got = out["ids"][:N_COMPARE]
        if got != ids:
            first = next((i for i, (a, b) in enumerate(zip(got, ids)) if a != b), min(len(got), len(ids)))
            pytest.fail(f"prompt {prompt[-12:]}: specula {got} != numpy {ids}; first difference at step "
                        f"{first}, where NumPy's top-1/top-2 gap is {margins[first] if first < len(margins) else None}")


def test_default_model_continuations_are_readable_english(greedy_runs, default_model):
    for _, ids, _, out in greedy_runs:
        for text in (out["text"], smollm.decode(default_model, ids)):
            letters = sum(c.isascii() and (c.isalpha() or c == " ") for c in text)
            # Garbage (a broken dequantizer, wrong rope) gives symbols, digits, non-ASCII and
            # repeated fragments; an English continuation is mostly letters and spaces.
            assert len(text) >= 40 and letters / len(text) > 0.8, repr(text)
            words = text.split()
            assert len(set(words)) > len(words) / 2, f"repetitive: {text!r}"


def test_specula_chat_prompts_encode_like_the_reference_tokenizer(default_model, specula_bin):
    # The greedy comparison above feeds ids; this ties them to what a user's --chat prompt becomes
    # (SmolLM2's template with its default system line, tokenized by Specula).
    for q in smollm.QUESTIONS:
        out = specula_cli.generate_greedy(specula_bin, default_model, max_tokens=1, prompt=q, chat=True)
        assert out["prompt_ids"] == smollm.encode(default_model, smollm.chat_text(q)), q


# The int8 path (SPECULA_SIMD unset) against NumPy emulating its roundings: q8_roundtrip on the
# input of every Q4_0/Q4_1/Q8_0 matrix (the last layer's down projection as two int8 rows,
# q8_refined; the output head's logits near each row's largest computed again unrounded,
# top_logits_again), and K/V rounded to float16 in the cache. Rounding is
# discontinuous: where a value lies within float32 noise of a rounding boundary, two computations
# that differ in the last bits (Specula's and NumPy's summation orders) round one step apart, and
# these tiny random models amplify such a flip to 1e-3..0.1 in the logits, for that position and
# often later ones (measured: about one flip per 40-token sequence; the same emulation in float64
# instead of float32 sits 0.11 from itself). So the emulation runs in float32 like Specula, over
# 16 short independent sequences (96 positions): a position without a flip agrees to ~5e-6, and
# at least 75% must agree within TOL_INT8 (measured when written: the K-quant variant, whose five
# matrix types all take int8 activations, 81%; the others 96-100%; the f32 path 0-1%). A kernel or wiring bug breaks
# nearly every position; the control: the f32 reference path (no activation rounding) must agree
# at no more than 10%.
TOL_INT8 = 1e-3
INT8_TYPES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}
INT8_SEQUENCES = [[int(t) for t in np.floor((tiny_models.uniform(0, f"int8-sequence-{i}", (6,)) + 1) / 2 * 320)]
                  for i in range(16)]


@pytest.mark.parametrize("name", [n for n, s in tiny_models.VARIANTS.items()
                                  if set(s.gguf_types.values()) & INT8_TYPES])
def test_int8_path_matches_numpy_emulating_its_roundings(name, tiny, specula_bin, work_dir):
    ck = tiny[name]
    cfg = numpy_llama.LlamaConfig.from_hf(tiny_models.hf_config(ck.spec))
    _, weights, types = gguf_weights.load(ck.gguf_path)
    quantized = {n for n, t in types.items() if t in INT8_TYPES and weights[n].ndim == 2}
    emulation = numpy_llama.NumpyLlama(cfg, weights, dtype=np.float32, quantized_inputs=quantized, kv_f16=True)
    _assert_fast_path_agrees(emulation, ck, specula_bin, work_dir, "int8 path")


def _fast_path_stderr(specula_bin, ck, work_dir) -> str:
    """stderr of a short `specula logits` run as _assert_fast_path_agrees runs the fast path
    (SPECULA_SIMD as the environment has it): one line for each weight type that runs on the f32
    kernels there instead ("no fast kernel for ...")."""
    probe = subprocess.run([str(specula_bin), "logits", "--model", str(ck.gguf_path), "--tokens", "1,2",
                            "--out", str(pathlib.Path(work_dir) / "probe.npy")], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    return probe.stderr


def _assert_fast_path_agrees(emulation, ck, specula_bin, work_dir, what):
    """At least 75% of the 16 sequences' positions on the fast path within TOL_INT8 of
    `emulation`, and at most 10% on the f32 reference path (the control). A rounding flip moves
    the position it happens at (and, through the K/V, often the ones after it); a kernel or
    wiring bug moves nearly all of them."""
    errors, controls = [], []
    for tokens in INT8_SEQUENCES:
        want = emulation.logits(tokens)
        errors += np.abs(specula_cli.logits(specula_bin, ck.gguf_path, tokens, work_dir, simd=None) - want).max(axis=1).tolist()
        controls += np.abs(specula_cli.logits(specula_bin, ck.gguf_path, tokens, work_dir) - want).max(axis=1).tolist()
    agree = sum(e < TOL_INT8 for e in errors) / len(errors)
    control = sum(e < TOL_INT8 for e in controls) / len(controls)
    assert agree >= 0.75, f"{what}: {agree:.0%} of positions within {TOL_INT8} of the emulation: {[f'{e:.1g}' for e in errors]}"
    assert control <= 0.1, f"the f32 path agrees with the emulation at {control:.0%} of positions: the test cannot tell them apart"


# The 16-bit path (gpu/host/hmatmul.h; AVX-512 here, else the f32 kernels): F16 matrices keep f32
# activations (only the summation order and the fp16 K/V differ from the reference), BF16
# matrices read activations rounded to bfloat16. Same 16-sequence measure as above; the control is
# the f32 reference path again.
@pytest.mark.parametrize("name", ["f16", "bf16"])
def test_16bit_path_matches_numpy_emulating_its_roundings(name, tiny, specula_bin, work_dir):
    ck = tiny[name]
    cfg = numpy_llama.LlamaConfig.from_hf(tiny_models.hf_config(ck.spec))
    _, weights, types = gguf_weights.load(ck.gguf_path)
    # Where the fast path has no kernel for the type, its matrices run on the f32 kernels.
    fast = f"no fast kernel for {name.upper()} weights" not in _fast_path_stderr(specula_bin, ck, work_dir)
    rounded = {n for n, t in types.items() if t == "BF16" and weights[n].ndim == 2} if fast else set()
    emulation = numpy_llama.NumpyLlama(cfg, weights, dtype=np.float32, bf16_inputs=rounded, kv_f16=True)
    _assert_fast_path_agrees(emulation, ck, specula_bin, work_dir, "16-bit path")


@pytest.mark.parametrize("name", ["gqa_untied", "q4_1_tied"])
def test_final_hidden_states_match_numpy_and_give_the_logits(name, tiny, specula_bin, work_dir):
    """`specula logits --hidden-out`: the output head's input (after the final norm), the features an
    EAGLE-style draft reads. They match the reference's at every position, chunked and re-fed
    after a truncation too, and the head applied to them gives the logits Specula wrote."""
    ck = tiny[name]
    cfg = numpy_llama.LlamaConfig.from_hf(tiny_models.hf_config(ck.spec))
    _, weights, _ = gguf_weights.load(ck.gguf_path)
    ref = numpy_llama.NumpyLlama(cfg, weights)
    ref.logits(TOKENS)
    want = ref.last_hidden
    for kwargs in ({}, {"chunk": 3, "truncate_at": TRUNCATE_AT}):
        got_logits, got = specula_cli.logits(specula_bin, ck.gguf_path, TOKENS, work_dir, with_hidden=True, **kwargs)
        assert got.shape == (len(TOKENS), cfg.hidden)
        err = float(np.abs(got - want).max())
        assert err < TOL_FLOAT, f"{kwargs}: max |hidden - numpy| = {err:.3g}"
        head = weights["model.embed_tokens.weight" if cfg.tied else "lm_head.weight"]
        assert float(np.abs(got.astype(np.float64) @ head.T - got_logits).max()) < TOL_FLOAT


@pytest.mark.parametrize("name", ["gqa_untied", "q4_1_tied"])
def test_feature_layers_are_the_normed_residuals_of_those_blocks(name, tiny, specula_bin, work_dir):
    """`specula logits --hidden-out --feature-layers 1,0`: each row is the final hidden state, then
    the residual after block 1 and after block 0, each divided by its RMS (the rows a fused-feature
    draft head reads). Checked against the reference's residuals at every position, chunked and
    re-fed after a truncation too; the logits do not change. Control: the chunks in the other
    order do not match."""
    ck = tiny[name]
    cfg = numpy_llama.LlamaConfig.from_hf(tiny_models.hf_config(ck.spec))
    _, weights, _ = gguf_weights.load(ck.gguf_path)
    ref = numpy_llama.NumpyLlama(cfg, weights)
    want_logits = ref.logits(TOKENS)

    def normed(x):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.rms_eps)

    want = np.concatenate([ref.last_hidden, normed(ref.layer_out[1]), normed(ref.layer_out[0])], axis=1)
    for kwargs in ({}, {"chunk": 3, "truncate_at": TRUNCATE_AT}):
        got_logits, got = specula_cli.logits(specula_bin, ck.gguf_path, TOKENS, work_dir, with_hidden=True,
                                             feature_layers=[1, 0], **kwargs)
        assert got.shape == (len(TOKENS), 3 * cfg.hidden)
        err = float(np.abs(got - want).max())
        assert err < TOL_FLOAT, f"{kwargs}: max |features - numpy| = {err:.3g}"
        assert float(np.abs(got_logits - want_logits).max()) < TOL_FLOAT
        H = cfg.hidden
        swapped = np.concatenate([got[:, :H], got[:, 2 * H:], got[:, H:2 * H]], axis=1)
        assert float(np.abs(swapped - want).max()) > 10 * TOL_FLOAT
