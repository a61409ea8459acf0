"""Checks of the oracles themselves (no C++ needed): the tiny checkpoints hold what they claim,
the NumPy reference is self-consistent, and each property the C++ tests rely on has the power
to catch the bug it is meant to catch."""
import json
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gguf_weights  # noqa: E402
import kquants  # noqa: E402
import numpy_llama  # noqa: E402
import tiny_models  # noqa: E402
import tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tiny(work_dir):
    return {name: tiny_models.build(name, work_dir / "tiny-self") for name in tiny_models.VARIANTS}


def reference(ck, weights=None, **kw):
    cfg = numpy_llama.LlamaConfig.from_hf(tiny_models.hf_config(ck.spec))
    return numpy_llama.NumpyLlama(cfg, ck.weights if weights is None else weights, **kw)


TOKENS = [1, 5, 77, 300, 2, 0, 150, 151, 152, 12, 319, 44, 8, 260, 261, 3, 99, 100, 101, 200]


def test_the_weight_generator_reproduces_pinned_values():
    # The numpy uint64 splitmix64 must equal plain Python integer arithmetic, and the generated
    # weights must keep the sha256 the golden fixtures were made with, on any numpy version.
    mask = (1 << 64) - 1

    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    key = tiny_models._name_key(7, "pinned")
    want = [2 * ((mix((key + (i + 1) * 0x9E3779B97F4A7C15) & mask) >> 11) / 2**53) - 1 for i in range(1000)]
    assert tiny_models.uniform(7, "pinned", (1000,)).tolist() == want
    assert want[:2] == [-0.07770203788738606, -0.8882577849837732]
    sha = tiny_models.weights_sha256(tiny_models.make_weights(tiny_models.VARIANTS["gqa_untied"]))
    assert sha == "b603b9b0a3482f3f2760736a7e47dff3a8d63e4a25d88d96fb68b534673bb8d3"


@pytest.mark.parametrize("kind", ["IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_kquant_blocks_round_trip_through_gguf_dequantize(kind):
    import gguf
    x = tiny_models.uniform(11, "kquant-roundtrip", (6, 512)).astype(np.float32) * 3.0
    x[0] += 1.5  # a row with a non-zero mean exercises Q4_K's min offsets
    q = {"IQ4_NL": kquants.quantize_iq4_nl, "IQ4_XS": kquants.quantize_iq4_xs, "Q2_K": kquants.quantize_q2_k, "Q3_K": kquants.quantize_q3_k, "Q4_K": kquants.quantize_q4_k, "Q5_K": kquants.quantize_q5_k,
         "Q6_K": kquants.quantize_q6_k}[kind](x)
    y = gguf.quants.dequantize(q, gguf.GGMLQuantizationType[kind])
    err = np.abs(y - x).max() / np.abs(x).max()
    # IQ4_NL: 16 levels 10-24 apart out of 127 (half a gap up to ~10%), IQ4_XS the same (its largest
    # sub-block's scale is exact, the others' rounded in proportion to their smaller values); Q2_K: 4
    # levels per 16 values (half a step up to 1/6 of a sub-block's range, 1/3 of max |x|; 0.22
    # measured), and 4-bit scales and mins; Q3_K: 8 levels per 16 values (half a step up to 1/6 of a sub-block's largest |x|); Q4_K: 16
    # levels per sub-block (half a step ~3% of the range) plus 6-bit scale rounding; Q5_K: 32 levels
    # (~1.6%); Q6_K: 64 levels (~1%). A mis-packed nibble, bit or scale gives errors ~50-100% of the
    # range (a lost fifth bit: half of it; a lost third bit of Q3_K: 4 steps).
    assert err < {"IQ4_NL": 0.1, "IQ4_XS": 0.1, "Q2_K": 0.34, "Q3_K": 0.2, "Q4_K": 0.08, "Q5_K": 0.04, "Q6_K": 0.03}[kind], f"{kind} round-trip error {err:.3f} of max |x|"


def test_gguf_stores_q_and_k_rows_permuted_like_llama_cpp(tiny):
    import gguf
    ck = tiny["gqa_untied"]
    s = ck.spec
    stored = {t.name: np.asarray(t.data).reshape(tuple(reversed(t.shape.tolist())))
              for t in gguf.GGUFReader(str(ck.gguf_path)).tensors}
    for layer in range(s.layers):
        for proj, n_head in (("q", s.heads), ("k", s.kv_heads)):
            hf = ck.weights[f"model.layers.{layer}.self_attn.{proj}_proj.weight"]
            g = stored[f"blk.{layer}.attn_{proj}.weight"]
            half = s.head_dim // 2
            for h in range(n_head):
                base = h * s.head_dim
                for i in range(half):
                    # HF rotates rows (i, i + d/2) together; llama.cpp's rows (2i, 2i+1).
                    assert np.array_equal(g[base + 2 * i], hf[base + i])
                    assert np.array_equal(g[base + 2 * i + 1], hf[base + half + i])
            assert np.array_equal(tiny_models.unpermute_qk(g, n_head), hf)


def test_adjacent_pair_rope_on_gguf_layout_equals_half_split_rope_on_hf_layout(tiny):
    ck = tiny["gqa_untied"]
    s = ck.spec
    permuted = dict(ck.weights)
    for name in ck.weights:
        if "q_proj" in name:
            permuted[name] = tiny_models.permute_qk(ck.weights[name], s.heads)
        elif "k_proj" in name:
            permuted[name] = tiny_models.permute_qk(ck.weights[name], s.kv_heads)
    hf = reference(ck).logits(TOKENS)
    adjacent = reference(ck, permuted, rope_pairs="adjacent").logits(TOKENS)
    wrong = reference(ck, permuted).logits(TOKENS)  # permuted weights roped the HF way
    assert np.abs(hf - adjacent).max() < 1e-10  # same math in float64, only reordered
    # Negative control for test_gguf_and_safetensors_give_the_same_logits: forgetting the
    # permutation moves the logits by far more than that test's tolerance.
    assert np.abs(hf - wrong).max() > 0.1


def test_incremental_decode_with_kv_cache_matches_one_prefill(tiny):
    model = reference(tiny["gqa_untied"])
    full = model.logits(TOKENS)
    cache = model.new_cache()
    rows = [model.forward(TOKENS[i:i + 3], cache) for i in range(0, len(TOKENS), 3)]
    assert np.abs(np.concatenate(rows) - full).max() < 1e-10
    cache.truncate(7)
    refed = np.concatenate([model.forward([t], cache) for t in TOKENS[7:]])
    assert np.abs(refed - full[7:]).max() < 1e-10
    # ... and a position is not ignored: the same token at another position has other logits.
    assert np.abs(model.logits(TOKENS[7:]) - full[7:]).max() > 1e-2


def test_rope_freqs_tensor_matches_the_llama3_formula(tiny):
    ck = tiny["llama3_rope"]
    s = ck.spec
    divisors = gguf_weights.rope_freqs(ck.gguf_path)
    base = s.rope_theta ** (-np.arange(0, s.head_dim, 2) / s.head_dim)
    scaled = numpy_llama.LlamaConfig.from_hf(tiny_models.hf_config(s)).inv_freq()
    # float32 divisors (as the converter stores them) agree with the float64 formula to f32 precision.
    np.testing.assert_allclose(base / divisors, scaled, rtol=1e-6)
    factor = s.llama3_scaling[0]
    assert (divisors == 1).any() and (divisors == factor).any() and ((divisors > 1) & (divisors < factor)).any(), \
        f"all three llama3 regimes should occur at these dims: {divisors}"


def test_llama3_scaling_changes_the_logits(tiny):
    # Power of the llama3 variant's C++ comparison: dropping the scaling is visible at 40 tokens.
    ck = tiny["llama3_rope"]
    scaled = reference(ck)
    plain = numpy_llama.NumpyLlama(scaled.cfg, ck.weights, inv_freq=ck.spec.rope_theta ** (
        -np.arange(0, ck.spec.head_dim, 2) / ck.spec.head_dim))
    tokens = (TOKENS * 2)[:40]
    assert np.abs(scaled.logits(tokens) - plain.logits(tokens)).max() > 1e-2


def test_gguf_reader_returns_the_generated_weights(tiny):
    for name, ck in tiny.items():
        cfg, w, types = gguf_weights.load(ck.gguf_path)
        assert set(w) == set(ck.weights), name
        for n, want in ck.weights.items():
            err = float(np.abs(w[n] - want).max())
            if types[n] == "F32":
                assert err == 0, f"{name} {n}"
            elif types[n] in kquants.IQ_RANDOM_TYPES:  # random blocks at the weights' scale, not an approximation
                ratio = float(np.sqrt((w[n] ** 2).mean() / (want ** 2).mean()))
                assert np.isfinite(w[n]).all() and 0.25 < ratio < 4, f"{name} {n} ({types[n]}): RMS ratio {ratio}"
            else:  # quantization error only; a layout mix-up would be O(max |w|)
                # Q2_K: half of a 2-bit step is up to a sixth of a 16-value sub-block's range, a third
                # of max |w| (plus its 4-bit scale's rounding); the others' steps are finer.
                bound = 0.4 if types[n] == "Q2_K" else 0.25
                assert err < bound * float(np.abs(want).max()), f"{name} {n} ({types[n]}): {err}"


def test_tiny_logits_are_in_a_useful_range(tiny):
    # Not saturated, not flat: a wrong norm or head shows up as a clear difference.
    for name, ck in tiny.items():
        logits = reference(ck).logits(TOKENS)
        assert 1.0 < logits.std() < 5.0 and np.abs(logits).max() < 30, (name, logits.std(), np.abs(logits).max())


def test_tiny_tokenizer_json_and_gguf_vocabulary_agree(tiny):
    import gguf
    from tokenizers import Tokenizer
    ck = tiny["gqa_untied"]
    tok = Tokenizer.from_file(str(ck.hf_dir / "tokenizer.json"))
    assert tok.get_vocab_size() == ck.spec.vocab
    r = gguf.GGUFReader(str(ck.gguf_path))
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    assert [tok.id_to_token(i) for i in range(ck.spec.vocab)] == tokens
    assert json.loads((ck.hf_dir / "tokenizer.json").read_text())["model"]["merges"] == merges
    text = "<|im_start|>user\nThe quick brown fox.<|im_end|>"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids[0] == tiny_tokenizer.BOS_ID and ids[-1] == tiny_tokenizer.EOS_ID
    assert len(ids) < len(text.encode()) - 10, "merges should shorten English text"
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_the_iq_grid_tables_are_what_the_generator_writes_from_the_gguf_package():
    """gpu/host/iq_grids.h is generated (tools/gen/iq_grids.py) from gguf.quants, the code the
    oracle dequantizes the IQ1-IQ3 types with: a hand edit or another package version shows here."""
    import subprocess
    from conftest import SOURCE_DIR
    r = subprocess.run([sys.executable, str(SOURCE_DIR / "tools" / "gen" / "iq_grids.py"), "--check",
                        str(SOURCE_DIR / "gpu" / "host" / "iq_grids.h")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("kind", ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"])
def test_random_iq_blocks_hold_values_at_the_inputs_scale(kind):
    """kquants.iq_random_blocks: valid blocks (gguf dequantizes them to finite values) whose RMS is
    within 4x of the input's, so the tiny iq1_iq3 model's activations stay in range."""
    import gguf
    x = tiny_models.uniform(12, "iq-random", (4, 512)).astype(np.float32) * 0.05
    y = gguf.quants.dequantize(kquants.iq_random_blocks(x, kind), gguf.GGMLQuantizationType[kind])
    assert y.shape == x.shape and np.isfinite(y).all()
    ratio = np.sqrt((y ** 2).mean()) / np.sqrt((x ** 2).mean())
    assert 0.25 < ratio < 4, f"{kind}: RMS ratio {ratio:.2f}"
