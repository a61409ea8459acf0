"""scripts/train_draft.sh --toy, end to end (issue 13's training half, docs/draft.md): a tiny
random target writes its own Magpie data through `specula`, a draft head trains on it for a few
hundred steps and exports one GGUF. The file must be small, carry the metadata the runtime reads
(dims, RoPE, the target's hash recomputed here independently from the definition in the docs),
read back to the training forward's logits at every depth, and the training must have learnt
something a trivial predictor cannot. The data format's reader must reject a truncated file."""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from conftest import BUILD_DIR, CACHE_DIR, SHARED_DIR, SOURCE_DIR

sys.path.insert(0, str(SOURCE_DIR / "tools"))
from draft import data_format  # noqa: E402  (NumPy only: runs in the oracle venv)

MAX_BYTES = 16_000_000


def _train_toy(specula_bin, out, *extra):
    """scripts/train_draft.sh --toy into `out`: (out, the metrics JSON it prints last)."""
    env = dict(os.environ, SPECULA_BIN=str(specula_bin), SPECULA_BUILD=str(BUILD_DIR), SPECULA_CACHE=str(CACHE_DIR))
    cmd = ["bash", str(SOURCE_DIR / "scripts" / "train_draft.sh"), "--toy", "--out", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr[-3000:]}"
    return out, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def toy_run(specula_bin, tmp_path_factory):
    return _train_toy(specula_bin, tmp_path_factory.mktemp("draft-toy"))


def _train_py(out, dest, *extra, data=None):
    """train.py on the toy run's target and data (or `data`) into `dest` (depth 3, windows of 64,
    batches of 8)."""
    py = BUILD_DIR / "draft-venv" / "bin" / "python"
    env = dict(os.environ, PYTHONPATH=str(SOURCE_DIR / "tools"))
    return subprocess.run([str(py), "-m", "draft.train", "--target", str(out / "target" / "q4_1_tied" / "model.gguf"),
                           "--data", str(data or out / "data.spd"), "--out", str(dest), "--depth", "3", "--window", "64",
                           "--batch", "8", "--export-type", "Q8_0", *extra], capture_output=True, text=True, env=env, timeout=600)


def _metrics(p):
    """The metrics JSON a successful train.py run printed last."""
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _fields(path):
    import gguf
    r = gguf.GGUFReader(str(path))
    return r, {k: f.contents() for k, f in r.fields.items()}


def _target_hash(path) -> str:
    """docs/draft.md's definition, written again here: per tensor in file order, u64 name length,
    name, u32 n_dims, u64 dims, u32 type, u64 n_bytes, the data bytes."""
    r, _ = _fields(path)
    raw = pathlib.Path(path).read_bytes()
    h = hashlib.sha256()
    for t in r.tensors:
        dims = [int(d) for d in t.shape]
        h.update(struct.pack("<Q", len(t.name.encode())) + t.name.encode())
        h.update(struct.pack(f"<I{len(dims)}Q", len(dims), *dims) + struct.pack("<IQ", int(t.tensor_type), int(t.n_bytes)))
        h.update(raw[int(t.data_offset):int(t.data_offset) + int(t.n_bytes)])
    return h.hexdigest()


def _runtime_chains(specula_bin, out, draft, tmp_path) -> dict:
    """`specula draft-eval --depth 3` with `draft` over train.py's validation split of the toy data
    (seed 0, 10% of the sequences, written out for the runtime): its JSON."""
    header, seqs = data_format.read(out / "data.spd")
    order = np.random.default_rng(0).permutation(len(seqs))
    val = tmp_path / "val.spd"
    with data_format.Writer(val, header) as w:
        for i in order[:max(1, int(round(len(seqs) * 0.1)))]:
            w.write(seqs[i])
    p = subprocess.run([str(specula_bin), "draft-eval", "--model", str(out / "target" / "q4_1_tied" / "model.gguf"),
                        "--draft", f"eagle:{draft}", "--data", str(val), "--responses-only", "--depth", "3"],
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_toy_pipeline_writes_one_draft_gguf_under_16_mb_with_the_targets_shape_and_hash(toy_run):
    out, metrics = toy_run
    draft = out / "draft.gguf"
    target_path = out / "target" / "q4_1_tied" / "model.gguf"
    assert draft.exists() and 0 < draft.stat().st_size <= MAX_BYTES
    assert metrics["gguf_bytes"] == draft.stat().st_size
    r, meta = _fields(draft)
    _, tmeta = _fields(target_path)
    arch = meta["general.architecture"]
    assert arch == "specula-eagle"
    for key in ("embedding_length", "feed_forward_length", "attention.head_count", "attention.head_count_kv",
                "rope.dimension_count"):
        assert meta[f"{arch}.{key}"] == tmeta[f"llama.{key}"], key
    assert meta[f"{arch}.rope.freq_base"] == pytest.approx(tmeta["llama.rope.freq_base"])
    assert meta[f"{arch}.attention.layer_norm_rms_epsilon"] == pytest.approx(tmeta["llama.attention.layer_norm_rms_epsilon"])
    assert meta[f"{arch}.block_count"] == 1
    assert meta["draft.target_hash"] == _target_hash(target_path)
    assert meta["draft.target_vocab_size"] == tmeta["llama.vocab_size"]
    tensors = {t.name: t for t in r.tensors}
    n = meta[f"{arch}.vocab_size"]
    token_map = np.asarray(meta["draft.token_map"])
    assert r.fields["draft.token_map"].types[-1].name == "INT32" and token_map.shape == (n,)
    assert len(set(token_map.tolist())) == n and token_map.min() >= 0 and token_map.max() < tmeta["llama.vocab_size"]
    hidden = meta[f"{arch}.embedding_length"]
    assert [int(d) for d in tensors["fc.weight"].shape] == [2 * hidden, hidden]
    assert [int(d) for d in tensors["output.weight"].shape] == [hidden, n]
    for name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight",
                 "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "fc.weight", "output.weight"):
        assert tensors[name].tensor_type.name == "Q8_0", name
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        assert tensors[name].tensor_type.name == "F32", name


def test_the_exported_file_read_as_the_runtime_reads_it_drafts_like_the_training_forward(toy_run):
    _, metrics = toy_run
    check = metrics["export_check"]
    assert check["ok"], check
    assert max(check["max_rel_error"]) < check["tolerance"]
    assert check["control_rel_error"] > 10 * check["tolerance"]  # feeding h instead of g at depth 2 is caught


def test_toy_training_lowers_the_loss_and_beats_the_most_frequent_token_at_every_depth(toy_run):
    _, metrics = toy_run
    assert metrics["final_train_loss"] < 0.5 * metrics["first_train_loss"], metrics
    val, init = metrics["validation"], metrics["initial_validation"]
    assert len(val["top1"]) == metrics["depth"] == 3
    for j, acc in enumerate(val["top1"]):
        assert acc > metrics["baseline_top1"] + 0.15, (j + 1, acc, metrics["baseline_top1"])
        assert acc > init["top1"][j] + 0.2, (j + 1, acc, init["top1"][j])
        assert val["loss"][j] < init["loss"][j]
        assert val["alpha_lower_bound"][j] > init["alpha_lower_bound"][j]


def test_training_from_a_head_starts_where_that_head_left_off_and_its_file_reads_back_byte_for_byte(toy_run, tmp_path):
    """train.py --init-from (fine-tuning a shipped head on more data, docs/draft.md): export.read
    inverts export.write (the toy head read back and written again at its type has every tensor's
    bytes), and a run started from the toy head measures, before its first step, the validation
    the head ended with; the random start under the same settings, the control, is far below it."""
    out, metrics = toy_run
    py = BUILD_DIR / "draft-venv" / "bin" / "python"
    env = dict(os.environ, PYTHONPATH=str(SOURCE_DIR / "tools"))
    head, again = out / "draft.gguf", tmp_path / "again.gguf"
    roundtrip = """
import sys
from draft import export
cfg, params, token_map, layers, meta = export.read(sys.argv[1])
export.write(sys.argv[2], cfg, params, token_map, target_hash=meta["draft.target_hash"], target_name=meta["draft.target_name"],
             target_vocab=int(meta["draft.target_vocab_size"]), tensor_type="Q8_0", feature_layers=layers)
"""
    p = subprocess.run([str(py), "-c", roundtrip, str(head), str(again)], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    ra, _ = _fields(head)
    rb, _ = _fields(again)
    ta, tb = {t.name: t for t in ra.tensors}, {t.name: t for t in rb.tensors}
    assert ta.keys() == tb.keys()
    for name, t in ta.items():
        assert tb[name].tensor_type == t.tensor_type and np.array_equal(np.asarray(t.data), np.asarray(tb[name].data)), name

    def train(dest, *extra):
        return _metrics(_train_py(out, dest, "--vocab", "256", "--steps", "2", "--lr", "1e-9", *extra))

    fresh = train(tmp_path / "fresh")
    tuned = train(tmp_path / "tuned", "--init-from", str(head))
    for j, acc in enumerate(metrics["validation"]["top1"]):
        assert abs(tuned["initial_validation"]["top1"][j] - acc) < 0.02, (j + 1, tuned["initial_validation"], acc)
        assert fresh["initial_validation"]["top1"][j] < acc - 0.2, (j + 1, fresh["initial_validation"], acc)
    assert tuned["vocab"] == len(_fields(head)[1]["draft.token_map"])
    # --shuffle-seed (another pass over the same data): the windows come in another order, the
    # validation split stays --seed's, so the head measures exactly the same before its first step.
    reshuffled = train(tmp_path / "reshuffled", "--init-from", str(head), "--shuffle-seed", "5")
    assert reshuffled["initial_validation"] == tuned["initial_validation"]
    assert reshuffled["first_train_loss"] != tuned["first_train_loss"]


def test_a_head_given_feature_layers_it_lacks_starts_as_its_file_and_trains_them(toy_run, specula_bin, tmp_path):
    """train.py --init-from a head whose feature layers lead the data's (a layer added to a shipped
    head, docs/draft.md): the added layers' columns of fuse start at zero, so before its first step
    the head measures exactly what it measures on the data without them; after training those
    columns are no longer zero. A head whose layers do not lead the ones trained is one clear error."""
    out, _ = toy_run
    fed = tmp_path / "fed.spd"
    p = subprocess.run([str(specula_bin), "draft-data", "--model", str(out / "target" / "q4_1_tied" / "model.gguf"),
                        "--from", str(out / "data.spd"), "--out", str(fed), "--feature-layers", "0"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr

    def train(dest, data, head, *extra):
        return _train_py(out, dest, "--init-from", str(head), "--steps", "30", "--lr", "1e-3", *extra, data=data)

    plain = _metrics(train(tmp_path / "plain", None, out / "draft.gguf"))
    added = _metrics(train(tmp_path / "added", fed, out / "draft.gguf"))
    assert added["feature_layers"] == [0] and plain["feature_layers"] == []
    assert added["initial_validation"]["top1"] == plain["initial_validation"]["top1"], (plain, added)
    assert added["initial_validation"]["loss"] == pytest.approx(plain["initial_validation"]["loss"], rel=1e-5)
    fuse = np.load(tmp_path / "added" / "params.npz")["fuse"]
    hidden = fuse.shape[0]
    assert fuse.shape == (hidden, 2 * hidden) and np.abs(fuse[:, hidden:]).max() > 0
    bad = train(tmp_path / "bad", fed, tmp_path / "added" / "draft.gguf", "--feature-chunks", "1")
    assert bad.returncode != 0 and "reads feature layers [0]" in bad.stderr, bad.stderr[-2000:]


def test_a_head_given_a_second_layer_starts_as_its_file_and_the_runtime_drafts_it_as_trained(toy_run, specula_bin,
                                                                                              tmp_path):
    """train.py --init-from HEAD --layers 2 appends a decoder layer that starts as the identity (its
    two output matrices at zero): before its first step the head measures what the file measures;
    after training the layer writes into the residual. The exported file has two blocks; read as the
    runtime reads it (reference_drafter.py, one entry at a time, a cache per layer) it gives the
    training forward's logits at every depth, and the C++ drafter's greedy chains over the
    validation split match train.py's. Fewer layers than the file's is one clear error."""
    out, metrics = toy_run
    target = out / "target" / "q4_1_tied" / "model.gguf"

    def train(dest, head, *extra):
        return _train_py(out, dest, "--init-from", str(head), "--steps", "40", "--lr", "1e-3", *extra)

    plain = _metrics(train(tmp_path / "plain", out / "draft.gguf"))
    two = _metrics(train(tmp_path / "two", out / "draft.gguf", "--layers", "2", "--new-layer-lr-scale", "2"))
    assert two["layers"] == 2 and plain["layers"] == 1
    assert two["initial_validation"]["top1"] == plain["initial_validation"]["top1"], (plain, two)
    assert two["initial_validation"]["loss"] == pytest.approx(plain["initial_validation"]["loss"], rel=1e-5)
    z = np.load(tmp_path / "two" / "params.npz")
    assert np.abs(z["l1.wo"]).max() > 0 and np.abs(z["l1.w_down"]).max() > 0
    draft = tmp_path / "two" / "draft.gguf"
    r, meta = _fields(draft)
    assert meta["specula-eagle.block_count"] == 2
    assert {"blk.1.attn_q.weight", "blk.1.ffn_down.weight"} <= {t.name for t in r.tensors}

    py = BUILD_DIR / "draft-venv" / "bin" / "python"
    env = dict(os.environ, PYTHONPATH=str(SOURCE_DIR / "tools"))
    check = subprocess.run([str(py), "-m", "draft.check_export", "--target", str(target), "--draft", str(draft),
                            "--data", str(out / "data.spd")], capture_output=True, text=True, env=env, timeout=600)
    assert check.returncode == 0, check.stdout + check.stderr[-2000:]
    assert json.loads(check.stdout)["ok"]

    acc, want = _runtime_chains(specula_bin, out, draft, tmp_path)["accepted"], two["validation"]["chain_accepted"]
    for j in range(3):
        assert abs(acc[j] - want[j]) < 0.03, (acc, want)

    # --new-layer-from previous: the appended layer starts as a copy of layer 0 but for its output
    # matrices, so the head again starts as the file (a rate of 1e-9 keeps the weights where they began).
    copied = _metrics(_train_py(out, tmp_path / "copied", "--init-from", str(out / "draft.gguf"), "--layers", "2",
                                "--new-layer-from", "previous", "--steps", "2", "--lr", "1e-9"))
    assert copied["initial_validation"]["top1"] == plain["initial_validation"]["top1"]
    z = np.load(tmp_path / "copied" / "params.npz")
    assert np.allclose(z["l1.wq"], z["wq"], atol=1e-6) and np.allclose(z["l1.w_gate"], z["w_gate"], atol=1e-6)
    assert np.abs(z["l1.wo"]).max() < 1e-6 and np.abs(z["l1.w_down"]).max() < 1e-6

    fewer = train(tmp_path / "fewer", draft, "--layers", "1")
    assert fewer.returncode != 0 and "has 2 layers" in fewer.stderr, fewer.stderr[-2000:]


def test_extending_a_token_map_appends_the_most_frequent_tokens_it_lacks_in_order():
    """vocab.extend: the map first, then the text's most frequent tokens outside it (ties to the
    lower id), never one twice, up to N or the target's vocabulary."""
    from draft import vocab
    text = [[5, 5, 5, 1, 1, 2, 7, 7, 7, 7], [2, 9, 3, 3]]  # counts: 7:4 5:3 1:2 2:2 3:2 9:1
    grown = vocab.extend(np.array([7, 4], np.int32), text, 5, 10)
    assert grown.tolist() == [7, 4, 5, 1, 2]
    assert vocab.extend(np.array([7, 4], np.int32), text, 99, 10).tolist() == [7, 4, 5, 1, 2, 3, 9, 0, 6, 8]
    assert vocab.extend(np.array([7, 4], np.int32), text, 2, 10).tolist() == [7, 4]


def test_a_head_given_a_larger_vocab_keeps_its_tokens_and_rows_and_adds_the_next_most_frequent(toy_run, specula_bin,
                                                                                               tmp_path):
    """train.py --init-from HEAD --vocab N larger than HEAD's (docs/draft.md, "A 4,096-token head"):
    the toy head cut to 128 tokens and grown back to 256 keeps its token map first and its output
    rows, adds the training text's most frequent tokens it lacked (so it covers more of the
    validation text), and the new rows start as the target's output rows times one scale. A
    smaller N is one clear error (that is draft.prune's job)."""
    out, _ = toy_run
    py = BUILD_DIR / "draft-venv" / "bin" / "python"
    env = dict(os.environ, PYTHONPATH=str(SOURCE_DIR / "tools"))
    cut = tmp_path / "cut.gguf"
    p = subprocess.run([str(py), "-m", "draft.prune", "--draft", str(out / "draft.gguf"), "--vocab", "128", "--out", str(cut)],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr

    def train(dest, *extra):
        return _train_py(out, dest, "--init-from", str(cut), "--steps", "2", "--lr", "1e-9", *extra)

    kept = _metrics(train(tmp_path / "kept"))
    grown = _metrics(train(tmp_path / "grown", "--vocab", "256"))
    assert kept["vocab"] == 128 and grown["vocab"] == 256
    assert grown["vocab_coverage"] > kept["vocab_coverage"], (kept["vocab_coverage"], grown["vocab_coverage"])
    old_map = np.asarray(_fields(cut)[1]["draft.token_map"])
    new_map = np.asarray(_fields(tmp_path / "grown" / "draft.gguf")[1]["draft.token_map"])
    assert np.array_equal(new_map[:128], old_map) and len(set(new_map.tolist())) == 256
    added = new_map[128:]
    rows = np.load(tmp_path / "grown" / "params.npz")["head"]
    before = np.load(tmp_path / "kept" / "params.npz")["head"]
    np.testing.assert_allclose(rows[:128], before, atol=1e-6)
    from draft import target  # numpy and gguf only, as data_format
    t = target.output_rows(out / "target" / "q4_1_tied" / "model.gguf")[added]
    scale = np.sum(rows[128:] * t) / np.sum(t * t)
    assert scale > 0.1
    np.testing.assert_allclose(rows[128:], scale * t, atol=1e-5)
    smaller = train(tmp_path / "smaller", "--vocab", "64")
    assert smaller.returncode != 0 and "draft.prune" in smaller.stderr, smaller.stderr[-2000:]
    # Through scripts/train_draft.sh (its data reused): a fine-tune keeps the head's vocabulary
    # although the script has a default N, and grows it only when --vocab is given.
    for name, extra, want in (("script-keeps", (), 128), ("script-grows", ("--vocab", "192"), 192)):
        dest = tmp_path / name
        dest.mkdir()
        shutil.copy(out / "data.spd", dest / "data.spd")
        _, m = _train_toy(specula_bin, dest, "--steps", "2", *extra, "--", "--init-from", str(cut), "--lr", "1e-9")
        assert m["vocab"] == want, (name, m["vocab"])


def test_the_overlap_term_raises_the_heads_overlap_with_the_target_at_its_temperature(toy_run, tmp_path):
    """train.py --overlap-weight W --temperature T (the eighth fine-tune's loss, docs/draft.md): the
    same steps from the toy head over the same windows, with the term and without it (the control);
    with it the validation's overlap at T rises above the control's. At T = 1 the overlap, whose
    p is renormalised over the data's top-k, is at least the alpha_lower_bound of the raw p.
    A temperature of 0 and the term without soft labels are one clear error each."""
    out, _ = toy_run

    def train(dest, *extra):
        return _train_py(out, dest, "--init-from", str(out / "draft.gguf"), "--steps", "60", "--lr", "1e-3", *extra)

    plain = _metrics(train(tmp_path / "plain", "--temperature", "0.8"))
    overlap = _metrics(train(tmp_path / "overlap", "--temperature", "0.8", "--overlap-weight", "4"))
    assert plain["initial_validation"] == overlap["initial_validation"]
    assert plain["validation"]["temperature"] == overlap["validation"]["temperature"] == 0.8
    for j in range(3):
        assert overlap["validation"]["overlap_at_t"][j] > plain["validation"]["overlap_at_t"][j], (j + 1, plain, overlap)
    at_one = _metrics(train(tmp_path / "at-one", "--temperature", "1", "--steps", "2", "--lr", "1e-9"))["validation"]
    for j in range(3):
        assert at_one["overlap_at_t"][j] >= at_one["alpha_lower_bound"][j] - 1e-4, at_one
    for extra, said in ((["--temperature", "0"], "--temperature must be > 0"),
                        (["--overlap-weight", "1", "--labels", "hard"], "needs soft labels")):
        p = train(tmp_path / "bad", *extra)
        assert p.returncode != 0 and said in p.stderr, p.stderr[-2000:]


def test_the_argmax_term_raises_the_heads_agreement_with_the_targets_argmax(toy_run, tmp_path):
    """train.py --argmax-weight W (docs/draft.md, "The ninth fine-tune"): the same
    steps from the toy head over the same windows, with the cross-entropy to the target's argmax
    beside the soft labels and without it (the control); with it the validation's top-1 agreement
    rises above the control's over all depths together, and falls at none (on a Zen 3's AVX2
    PyTorch kernels depth 2 ties, 609 of 768 either way, with +11 and +12 at depths 1 and 3; on
    the AVX-512 machines it rose at every depth). The term without soft labels, or with a negative
    weight, is one clear error."""
    out, _ = toy_run

    def train(dest, *extra):
        return _train_py(out, dest, "--init-from", str(out / "draft.gguf"), "--steps", "60", "--lr", "1e-3", *extra)

    plain = _metrics(train(tmp_path / "plain"))
    argmax = _metrics(train(tmp_path / "argmax", "--argmax-weight", "4"))
    assert plain["initial_validation"] == argmax["initial_validation"]
    assert plain["argmax_weight"] == 0 and argmax["argmax_weight"] == 4
    def agreeing(m, j):  # validation entries at depth j + 1 whose top-1 is the target's argmax
        return round(m["validation"]["top1"][j] * m["validation"]["entries"][j])

    for j in range(3):
        assert agreeing(argmax, j) >= agreeing(plain, j), (j + 1, plain["validation"], argmax["validation"])
    assert sum(agreeing(argmax, j) for j in range(3)) > sum(agreeing(plain, j) for j in range(3)), (plain["validation"],
                                                                                                    argmax["validation"])
    for extra in (["--argmax-weight", "1", "--labels", "hard"], ["--argmax-weight", "-1"]):
        p = train(tmp_path / "bad", *extra)
        assert p.returncode != 0 and "--argmax-weight" in p.stderr and "needs soft labels" in p.stderr, p.stderr[-2000:]


@pytest.mark.parametrize("layers", [(), (3, 1)])
def test_a_draft_data_file_round_trips_and_a_truncated_one_is_one_clear_error(tmp_path, layers):
    """Version 1 (final hidden states) and version 2 (C feature layers: rows of H (1 + C))."""
    rng = np.random.default_rng(0)
    header = data_format.Header(hidden=8, topk=3, vocab=50, feature_layers=layers)
    W = 8 * (1 + len(layers))
    seqs = []
    for T in (5, 1, 9):
        logits = rng.normal(size=(T, 50)).astype(np.float32)
        ids, probs = data_format.top_k(logits, 3)
        assert (ids[:, 0] == logits.argmax(-1)).all() and (np.diff(probs.astype(np.float32), axis=1) <= 0).all()
        seqs.append(data_format.Sequence(tokens=rng.integers(0, 50, T).astype(np.int32),
                                         hidden=rng.normal(size=(T, W)).astype(np.float16), n_prompt=T // 2,
                                         topk_ids=ids, topk_probs=probs))
    path = tmp_path / "d.spd"
    with data_format.Writer(path, header) as w:
        for s in seqs:
            w.write(s)
    # 32-byte header (+ 4 bytes a feature layer), then per record 8 + T*4 + T*W*2 + T*K*(4+2) bytes.
    assert path.stat().st_size == 32 + 4 * len(layers) + sum(8 + T * 4 + T * W * 2 + T * 18 for T in (5, 1, 9))
    assert path.read_bytes()[8] == (2 if layers else 1)
    got_header, got = data_format.read(path)
    assert got_header == header and len(got) == 3
    for a, b in zip(seqs, got):
        assert b.n_prompt == a.n_prompt
        for field in ("tokens", "hidden", "topk_ids", "topk_probs"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), field
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(ValueError, match="runs past the end"):
        data_format.read(path)


def test_each_draft_data_record_equals_a_single_sequence_forward_of_its_tokens(toy_run, specula_bin, tmp_path):
    """`specula draft-data` batches many sequences at different phases in one forward; a record's
    hidden rows and top-k must be what the target computes for that sequence alone."""
    out, _ = toy_run
    target = out / "target" / "q4_1_tied" / "model.gguf"
    header, seqs = data_format.read(out / "data.spd")
    assert len(seqs) >= 100 and header.topk == 8
    for s in (seqs[0], seqs[len(seqs) // 2], seqs[-1]):
        assert 0 < s.n_prompt < len(s.tokens)
        lo, hi = tmp_path / "l.npy", tmp_path / "h.npy"
        subprocess.run([str(specula_bin), "logits", "--model", str(target), "--tokens", ",".join(map(str, s.tokens)),
                        "--out", str(lo), "--hidden-out", str(hi)], check=True, capture_output=True)
        assert np.array_equal(np.load(hi).astype(np.float16), s.hidden)
        ids, probs = data_format.top_k(np.load(lo), 8)
        assert np.array_equal(ids, s.topk_ids)
        # The softmax is normalised in double there and in float32 here: one fp16 step apart at most.
        np.testing.assert_allclose(probs.astype(np.float32), s.topk_probs.astype(np.float32), rtol=1e-3, atol=1e-7)


def test_draft_data_refuses_to_append_to_a_file_of_another_shape_and_leaves_it_as_it_was(toy_run, specula_bin, tmp_path):
    out, _ = toy_run
    target = out / "target" / "q4_1_tied" / "model.gguf"
    path = tmp_path / "other.spd"
    with data_format.Writer(path, data_format.Header(hidden=8, topk=8, vocab=50)):
        pass
    before = path.read_bytes()
    p = subprocess.run([str(specula_bin), "draft-data", "--model", str(target), "--out", str(path), "--samples", "1"],
                       capture_output=True, text=True)
    assert p.returncode != 0
    assert "its header has hidden 8, top-k 8, vocabulary 50" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert path.read_bytes() == before


def test_the_runtime_drafter_predicts_the_toy_data_as_well_as_the_trainer_measured(toy_run, specula_bin):
    """The C++ drafter, teacher-forced over the data with the file's hidden rows (`specula
    draft-eval`), agrees with the target's argmax at depth 1 about as often as train.py's
    validation says: the runtime reads the exported head as the trainer meant it."""
    out, metrics = toy_run
    target = out / "target" / "q4_1_tied" / "model.gguf"
    p = subprocess.run([str(specula_bin), "draft-eval", "--model", str(target), "--draft", f"eagle:{out / 'draft.gguf'}",
                        "--data", str(out / "data.spd"), "--responses-only"], capture_output=True, text=True, check=True)
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["positions"] > 1000
    assert got["top1_depth1"] > metrics["validation"]["top1"][0] - 0.05, (got, metrics["validation"])
    assert got["top1_depth1"] > metrics["baseline_top1"] + 0.15


def test_the_runtime_drafts_chains_as_the_trainer_measured_them(toy_run, specula_bin, tmp_path):
    """`draft-eval --depth 3` runs the run-time protocol (depths 2 and 3 read the head's own
    features and proposals) and counts how far each greedy chain matches the target's; train.py
    reports the same measure on its validation split (`chain_accepted`). They agree, and the
    chain shortens with depth: the per-depth top-1 of validation is not a chain measure."""
    out, metrics = toy_run
    got = _runtime_chains(specula_bin, out, out / "draft.gguf", tmp_path)
    want = metrics["validation"]["chain_accepted"]
    assert got["depth"] == 3 and got["chain_positions"] > 200, got
    assert len(want) == 3 and metrics["validation"]["mean_accepted_length"] == pytest.approx(sum(want), abs=1e-3)
    acc = got["accepted"]
    assert acc[0] >= acc[1] >= acc[2] > 0, acc
    assert got["mean_accepted_length"] == pytest.approx(sum(acc))
    for j in range(3):  # the same sequences; train.py cuts them into windows of 64 entries, the runtime does not
        assert abs(acc[j] - want[j]) < 0.03, (acc, want)


def test_draft_eval_ranks_count_the_targets_argmax_among_the_heads_likeliest_tokens(toy_run, specula_bin):
    """`draft-eval --ranks N`: the fraction of positions whose target argmax is among the head's j
    likeliest depth-1 tokens. At j = 1 it is the greedy top-1 of the same run (the same decision
    made through the head's sampled q row; without context tokens, whose greedy bias the q row
    does not carry), it grows with j, and the split by the head's confidence adds up to it; an N
    out of range is one clear error."""
    out, _ = toy_run
    target = out / "target" / "q4_1_tied" / "model.gguf"
    base = [str(specula_bin), "draft-eval", "--model", str(target), "--draft", f"eagle:{out / 'draft.gguf'},context=0",
            "--data", str(out / "data.spd"), "--responses-only"]
    p = subprocess.run([*base, "--ranks", "4"], capture_output=True, text=True, check=True)
    got = json.loads(p.stdout.strip().splitlines()[-1])
    top = got["in_top"]
    assert len(top) == 4 and top[0] == pytest.approx(got["top1_depth1"], abs=1e-12), got
    assert top[0] <= top[1] <= top[2] <= top[3] and top[3] > top[0], top
    bins = got["in_top_by_confidence"]
    assert sum(b["positions"] for b in bins) == got["positions"]
    for j in range(4):
        assert sum(b["in_top"][j] * b["positions"] for b in bins) == pytest.approx(top[j] * got["positions"], abs=1e-6)
    p = subprocess.run([*base, "--ranks", "65"], capture_output=True, text=True)
    assert p.returncode != 0 and "--ranks must be 0..64" in p.stderr, p.stderr


def test_draft_eval_proposals_hold_the_heads_drafts_and_the_targets_chain_that_it_counts(toy_run, specula_bin, tmp_path):
    """`draft-eval --proposals FILE`: one line per record with the file's tokens and, at every
    position of the chain measure, the head's drafts and the target's greedy chain. Counted again
    from the file, the per-depth acceptance is the run's own to the position; an unwritable path
    is one clear error."""
    out, _ = toy_run
    target = out / "target" / "q4_1_tied" / "model.gguf"
    base = [str(specula_bin), "draft-eval", "--model", str(target), "--draft", f"eagle:{out / 'draft.gguf'}",
            "--data", str(out / "data.spd"), "--responses-only", "--depth", "3", "--limit", "20"]
    prop = tmp_path / "p.jsonl"
    got = json.loads(subprocess.run([*base, "--proposals", str(prop)], capture_output=True, text=True,
                                    check=True).stdout.strip().splitlines()[-1])
    _, seqs = data_format.read(out / "data.spd")
    lines = [json.loads(l) for l in prop.read_text().splitlines()]
    assert len(lines) == got["sequences"] == 20
    counts, chains = [0, 0, 0], 0
    for i, rec in enumerate(lines):
        assert rec["sequence"] == i and rec["tokens"] == seqs[i].tokens.tolist() and rec["n_prompt"] == seqs[i].n_prompt
        for c in rec["chains"]:
            m, target_chain = c["position"], c["target"]
            assert len(target_chain) == 3 and len(c["draft"]) <= 3
            assert target_chain[:2] == rec["tokens"][m + 1:m + 3]  # a chain position: the file follows the argmax
            chains += 1
            j = 0
            while j < len(c["draft"]) and c["draft"][j] == target_chain[j]:
                counts[j] += 1
                j += 1
    assert chains == got["chain_positions"] > 100
    assert [n / chains for n in counts] == pytest.approx(got["accepted"], abs=1e-12)
    p = subprocess.run([*base, "--proposals", str(tmp_path / "missing" / "p.jsonl")], capture_output=True, text=True)
    assert p.returncode != 0 and "--proposals" in p.stderr and "cannot create" in p.stderr, p.stderr


def test_a_store_drafts_the_most_frequent_continuation_of_the_longest_match_within_a_record():
    """draft.store_eval's retrieval drafter: the longest suffix of the context that occurs, then
    at each depth the most frequent next token among the occurrences that still agree (ties to the
    lower id), never across the end of a record."""
    from draft.store_eval import Store, accepted
    store = Store([[1, 2, 3, 4, 5], [9, 2, 3, 4, 6, 7], [8, 3, 4, 6, 8], [2, 3, 4]], max_n=4)
    assert store.propose([0, 2, 3, 4], 3) == ([5], 3)        # "2 3 4" thrice: 5, 6 and a record's end; the tie -> 5
    assert store.propose([7, 1, 2, 3], 3) == ([4, 5], 3)     # "1 2 3" once: 4 5, then the record ends
    assert store.propose([0, 0, 0, 3, 4], 2) == ([6, 7], 2)  # "3 4" three times before a token: 6 twice
    assert store.propose([5, 5], 2, min_n=2) == ([], 0)
    assert accepted([6, 7, 1], [6, 7, 2]) == 2 and accepted([], [1]) == 0


def test_a_store_of_the_evaluated_records_themselves_drafts_what_follows_a_context_found_once(toy_run, specula_bin,
                                                                                              tmp_path):
    """Where the context's last 8 tokens occur once in a store built from the evaluated records,
    the store's drafts are the record's own next tokens, so they match the target's chain for
    as far as the file follows it."""
    from draft.store_eval import Store, evaluate, read_tokens
    out, _ = toy_run
    target = out / "target" / "q4_1_tied" / "model.gguf"
    prop = tmp_path / "p.jsonl"
    subprocess.run([str(specula_bin), "draft-eval", "--model", str(target), "--draft", f"eagle:{out / 'draft.gguf'}",
                    "--data", str(out / "data.spd"), "--responses-only", "--depth", "3", "--limit", "10",
                    "--proposals", str(prop)], capture_output=True, text=True, check=True)
    store = Store(read_tokens([out / "data.spd"]), max_n=8)
    unique = 0
    for line in prop.read_text().splitlines():
        rec = json.loads(line)
        for c in rec["chains"]:
            m, ctx = c["position"], rec["tokens"][:c["position"] + 1]
            if len(ctx) < 8 or len(store.matches(ctx, 8)) != 1:
                continue
            unique += 1
            drafts, n = store.propose(ctx, 3)
            assert n == 8 and drafts == rec["tokens"][m + 1:m + 4], (m, drafts)
            assert drafts[:2] == c["target"][:2]
    assert unique > 50
    with open(prop) as f:
        r = evaluate(store, f)
    assert r["positions"] == sum(len(json.loads(l)["chains"]) for l in prop.read_text().splitlines())
    assert r["best_of_both"] >= max(r["head"], r["store"]) and r["store"] > 0


def test_draft_data_answers_given_prompts_and_refuses_the_benchmark_set(toy_run, specula_bin, tmp_path):
    """`draft-data --prompts FILE`: sample i is the target's answer to line i of FILE, the prompt
    part exactly the chat-templated message (as `bench spec` renders it); the benchmark's prompt
    set is refused by name, and more samples than prompts is one clear error."""
    out, _ = toy_run
    target = out / "target" / "q4_1_tied" / "model.gguf"
    prompts = tmp_path / "p.jsonl"
    texts = [f"tell me about item {i}" for i in range(5)]
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n" for t in texts))
    data = tmp_path / "given.spd"
    base = [str(specula_bin), "draft-data", "--model", str(target), "--out", str(data), "--batch", "2", "--response-tokens", "8"]
    subprocess.run([*base, "--samples", "5", "--prompts", str(prompts)], capture_output=True, text=True, check=True)
    _, seqs = data_format.read(data)
    assert len(seqs) == 5
    # Each record's prompt is the templated message: records differ only in the item number.
    for s in seqs:
        assert 0 < s.n_prompt < len(s.tokens) + 1 and s.hidden.shape[0] == len(s.tokens)
    assert len({tuple(s.tokens[:s.n_prompt]) for s in seqs}) == 5
    too_many = subprocess.run([*base, "--samples", "6", "--prompts", str(prompts)], capture_output=True, text=True)
    assert too_many.returncode != 0 and "5 prompts" in too_many.stderr, too_many.stderr
    bench = SHARED_DIR / "data" / "prompts" / "chat.jsonl"
    refused = subprocess.run([*base, "--samples", "1", "--prompts", str(bench)], capture_output=True, text=True)
    assert refused.returncode != 0 and "benchmark" in refused.stderr, refused.stderr


def test_draft_data_starts_each_sampled_user_turn_with_one_of_the_given_prefixes(toy_run, specula_bin, tmp_path):
    """`draft-data --user-prefixes FILE`: every record's user turn (after the chat frame that all
    plain Magpie records share) begins with one line of FILE as the tokenizer encodes it, every line
    is used, and the prompts stay distinct; an empty line, a missing file and --prompts beside it
    are each one clear error."""
    out, _ = toy_run
    target = out / "target" / "q4_1_tied" / "model.gguf"
    lines = ["Why does", "Write a poem about"]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(t) + "\n" for t in lines))
    subprocess.run([str(specula_bin), "tokenize", "--model", str(target), "--input", str(tmp_path / "in.jsonl"),
                    "--output", str(tmp_path / "ids.jsonl")], capture_output=True, text=True, check=True)
    wanted = [json.loads(x)["ids"] for x in (tmp_path / "ids.jsonl").read_text().splitlines()]
    assert all(wanted)
    # The frame: the longest prefix that all plain Magpie records share.
    _, plain = data_format.read(out / "data.spd")
    frame = len(os.path.commonprefix([list(s.tokens[:s.n_prompt]) for s in plain]))
    assert frame > 0
    prefixes = tmp_path / "prefixes.txt"
    prefixes.write_text("\n".join(lines) + "\n")
    data = tmp_path / "steered.spd"
    base = [str(specula_bin), "draft-data", "--model", str(target), "--batch", "4", "--response-tokens", "8",
            "--keep-unfinished-prompts", "--prompt-tokens", "24"]
    p = subprocess.run([*base, "--out", str(data), "--samples", "12", "--user-prefixes", str(prefixes)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    _, seqs = data_format.read(data)
    assert len(seqs) == 12
    starts = []
    for s in seqs:
        assert list(s.tokens[:frame]) == list(plain[0].tokens[:frame])
        user = list(s.tokens[frame:s.n_prompt])
        hit = [i for i, w in enumerate(wanted) if user[:len(w)] == w]
        assert hit, f"user turn {user[:8]} starts with none of {wanted}"
        starts.append(hit[0])
    assert set(starts) == {0, 1}
    assert len({tuple(s.tokens[:s.n_prompt]) for s in seqs}) == 12
    empty = tmp_path / "empty_line.txt"
    empty.write_text("Why\n\nHow\n")
    given = tmp_path / "given.jsonl"
    given.write_text(json.dumps({"messages": [{"role": "user", "content": "hello"}]}) + "\n")
    for extra, says in (([str(empty)], "line 2 is empty"), ([str(tmp_path / "missing.txt")], "cannot open"),
                        ([str(prefixes), "--prompts", str(given)], "exclude each other")):
        bad = subprocess.run([*base, "--out", str(tmp_path / "bad.spd"), "--samples", "1", "--user-prefixes", *extra],
                             capture_output=True, text=True)
        assert bad.returncode != 0 and says in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert not (tmp_path / "bad.spd").exists()


def test_speculative_greedy_with_the_trained_head_is_target_only_greedy_accepts_drafts_and_prices_each_round_size(
        toy_run, specula_bin, tmp_path):
    out, _ = toy_run
    target = out / "target" / "q4_1_tied" / "model.gguf"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"tell me about item {i}"}],
                                           "max_tokens": 40}) + "\n" for i in range(6)))
    p = subprocess.run([str(specula_bin), "bench", "spec", "--model", str(target), "--prompts", str(prompts), "--drafts",
                        f"eagle:{out / 'draft.gguf'}", "--spec-k", "4", "--temperature", "0"],
                       capture_output=True, text=True, check=True)
    runs = {r["draft"]: r for r in json.loads(p.stdout)["runs"]}
    eagle = runs["eagle"]
    assert eagle["text_matches_target"] is True
    assert eagle["accepted"] > 0.2 * eagle["drafted"], eagle
    # The verify cost by round size covers every round once, at its own draft length, and its
    # rounds-weighted mean is the run's verify cost.
    by = eagle["verify_cost_by_draft_length"]
    assert sum(b["rounds"] for b in by) == eagle["rounds"], by
    assert sum(b["drafts"] * b["rounds"] for b in by) == eagle["drafted"], by
    assert all(0 <= b["drafts"] <= 4 and b["verify_cost"] > 0 for b in by), by
    weighted = sum(b["verify_cost"] * b["rounds"] for b in by) / eagle["rounds"]
    assert weighted == pytest.approx(eagle["verify_cost"], rel=1e-9), by


def test_a_head_exported_with_some_matrices_at_another_type_stores_each_at_its_type_and_drafts_as_trained(
        toy_run, specula_bin, tmp_path):
    """export.py --types (train.py --export-types): the shipped head keeps its output and input
    matrices at Q8_0 and the rest at Q4_1 (docs/draft.md, "The fourth fine-tune"). Each tensor is
    stored at the type asked, the runtime reads the mixed file and drafts the toy data about as
    well as the trainer measured, and a misspelt parameter is one clear error."""
    import gguf
    out, metrics = toy_run
    target = out / "target" / "q4_1_tied" / "model.gguf"
    mixed = tmp_path / "mixed.gguf"
    env = dict(os.environ, PYTHONPATH=str(SOURCE_DIR / "tools"))
    py = BUILD_DIR / "draft-venv" / "bin" / "python"
    base = [str(py), "-m", "draft.export", "--target", str(target), "--params", str(out / "params.npz")]
    p = subprocess.run([*base, "--out", str(mixed), "--type", "Q4_1", "--types", "head=Q8_0,fc=Q8_0"],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    types = {t.name: t.tensor_type for t in _fields(mixed)[0].tensors}
    Q = gguf.GGMLQuantizationType
    assert types["output.weight"] == Q.Q8_0 and types["fc.weight"] == Q.Q8_0, types
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight"):
        assert types[name] == Q.Q4_1, (name, types)
    assert types["output_norm.weight"] == Q.F32
    p = subprocess.run([str(specula_bin), "draft-eval", "--model", str(target), "--draft", f"eagle:{mixed}",
                        "--data", str(out / "data.spd"), "--responses-only"], capture_output=True, text=True, check=True)
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["top1_depth1"] > metrics["validation"]["top1"][0] - 0.05, (got, metrics["validation"])
    p = subprocess.run([*base, "--out", str(tmp_path / "bad.gguf"), "--types", "heads=Q8_0"],
                       capture_output=True, text=True, env=env)
    assert p.returncode != 0 and "'heads=Q8_0': write PARAMETER=TYPE" in p.stderr, p.stderr
    assert not (tmp_path / "bad.gguf").exists()


def test_a_pruned_head_keeps_the_first_n_tokens_byte_for_byte_drafts_the_same_logits_and_speculates_exactly(
        toy_run, specula_bin, tmp_path):
    """draft.prune (docs/draft.md, "Choosing N") cuts the reduced vocabulary to its N most frequent
    tokens without retraining: the kept rows are the full head's bytes, so over those tokens the
    pruned head's logits are the full head's, and the runtime speculates with it exactly."""
    import gguf
    from draft.reference_drafter import ReferenceDrafter
    out, _ = toy_run
    full, pruned, n = out / "draft.gguf", tmp_path / "pruned.gguf", 64
    env = dict(os.environ, PYTHONPATH=str(SOURCE_DIR / "tools"))
    p = subprocess.run([sys.executable, "-m", "draft.prune", "--draft", str(full), "--vocab", str(n), "--out", str(pruned)],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    rf, mf = _fields(full)
    rp, mp = _fields(pruned)
    assert mp["specula-eagle.vocab_size"] == n
    assert list(mp["draft.token_map"]) == list(mf["draft.token_map"])[:n]
    assert hashlib.sha256(full.read_bytes()).hexdigest() in mp["draft.pruned_from"]
    for key in ("draft.target_hash", "draft.target_vocab_size", "specula-eagle.embedding_length"):
        assert mp[key] == mf[key], key
    tf, tp = {t.name: t for t in rf.tensors}, {t.name: t for t in rp.tensors}
    assert tf.keys() == tp.keys()
    for name, t in tf.items():
        a, b = np.asarray(t.data), np.asarray(tp[name].data)
        assert tp[name].tensor_type == t.tensor_type, name
        if name == "output.weight":
            assert b.shape[0] == n and np.array_equal(a[:n], b), name
        else:
            assert np.array_equal(a, b), name
    # The same entries through both files: the pruned logits are the full head's first n.
    hidden, vocab = mf["specula-eagle.embedding_length"], mf["draft.target_vocab_size"]
    rng = np.random.default_rng(5)
    embed = rng.standard_normal((vocab, hidden)).astype(np.float32)
    df, dp = ReferenceDrafter(full, embed), ReferenceDrafter(pruned, embed)
    width = df.w["fuse.weight"].shape[1] if "fuse.weight" in df.w else hidden
    for pos in range(6):
        feature, token = rng.standard_normal(width), int(rng.integers(vocab))
        lf, _ = df.step(feature, token, pos)
        lp, _ = dp.step(feature, token, pos)
        assert lp.shape == (n,) and np.allclose(lp, lf[:n], rtol=1e-12, atol=1e-12)
    # The runtime: greedy speculation with the pruned head is target-only greedy and accepts drafts.
    target = out / "target" / "q4_1_tied" / "model.gguf"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"tell me about item {i}"}],
                                           "max_tokens": 40}) + "\n" for i in range(6)))
    p = subprocess.run([str(specula_bin), "bench", "spec", "--model", str(target), "--prompts", str(prompts), "--drafts",
                        f"eagle:{pruned}", "--spec-k", "4", "--temperature", "0"], capture_output=True, text=True, check=True)
    eagle = {r["draft"]: r for r in json.loads(p.stdout)["runs"]}["eagle"]
    assert eagle["text_matches_target"] is True and eagle["accepted"] > 0, eagle
    # Asking for more tokens than the head has, or none, is one clear error and writes nothing.
    for bad in ("0", "257"):
        p = subprocess.run([sys.executable, "-m", "draft.prune", "--draft", str(full), "--vocab", bad, "--out",
                            str(tmp_path / f"bad{bad}.gguf")], capture_output=True, text=True, env=env)
        assert p.returncode != 0 and "--vocab must be between 1 and the head's 256 tokens" in p.stderr, p.stderr
        assert not (tmp_path / f"bad{bad}.gguf").exists()


def _with_block_count(head, dest, count: int):
    """The head's file with specula-eagle.block_count (a u32 after its key) set to `count`."""
    raw = bytearray(head.read_bytes())
    key = b"specula-eagle.block_count"
    at = raw.index(key) + len(key)
    assert struct.unpack_from("<I", raw, at)[0] == 4  # GGUF's UINT32 value type
    struct.pack_into("<I", raw, at + 4, count)
    dest.write_bytes(bytes(raw))


@pytest.mark.parametrize("case", ["another target", "truncated", "not a head", "missing", "a layer missing",
                                  "too many layers"])
def test_a_bad_draft_head_is_one_clear_error(toy_run, specula_bin, default_model, tmp_path, case):
    out, _ = toy_run
    head, target = out / "draft.gguf", out / "target" / "q4_1_tied" / "model.gguf"
    want = {"another target": "was trained for 'specula-tiny-q4_1_tied'", "truncated": "is truncated",
            "not a head": "not a draft head (general.architecture is 'llama'", "missing": "draft head not found",
            "a layer missing": "the draft head has no tensor 'blk.1.attn_norm.weight'",
            "too many layers": "a draft head has 1 to 4 layers, this file says 9"}[case]
    if case in ("a layer missing", "too many layers"):
        bad = tmp_path / "layers.gguf"
        _with_block_count(head, bad, 2 if case == "a layer missing" else 9)
        model, spec = target, f"eagle:{bad}"
    elif case == "another target":
        model, spec = default_model, f"eagle:{head}"
    elif case == "truncated":
        cut = tmp_path / "cut.gguf"
        cut.write_bytes(head.read_bytes()[: head.stat().st_size // 2])
        model, spec = target, f"eagle:{cut}"
    elif case == "not a head":
        model, spec = target, f"eagle:{target}"
    else:
        model, spec = target, f"eagle:{tmp_path / 'nope.gguf'}"
    p = subprocess.run([str(specula_bin), "generate", "--model", str(model), "--draft", spec, "--prompt", "hi",
                        "--max-tokens", "4"], capture_output=True, text=True)
    assert p.returncode != 0
    assert want in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    if case == "another target":
        assert str(default_model) in p.stderr  # names both


@pytest.mark.parametrize("pipeline", ["off", "always"])
def test_the_engine_with_the_trained_head_gives_target_only_text_greedy_and_coupled(toy_run, specula_bin, pipeline):
    """Through the actor engine (the verifier hands the head the target's rows through the
    sampler, the scheduler and the draft actor): greedy text and coupled sampling equal
    target-only generation token for token, with pipelining off and on (`always`: on this
    machine's shared cores too)."""
    out, _ = toy_run
    target = out / "target" / "q4_1_tied" / "model.gguf"

    def run(*extra):
        p = subprocess.run([str(specula_bin), "generate", "--model", str(target), "--prompt", "tell me about item 3", "--chat",
                            "--max-tokens", "40", "--json", *extra], capture_output=True, text=True, check=True)
        return json.loads(p.stdout.strip().splitlines()[-1])

    def ids(*extra):
        return run(*extra)["ids"]

    head = ["--draft", f"eagle:{out / 'draft.gguf'}", "--pipeline", pipeline]
    greedy = run("--temperature", "0", *head)
    assert greedy["pipeline"] is greedy["pipelined"] is (pipeline == "always")
    assert greedy["speculative"]["accepted"] > 0.2 * greedy["speculative"]["drafted"], greedy["speculative"]
    assert greedy["ids"] == ids("--temperature", "0", "--draft", "none")
    if pipeline == "always":
        # The optimistic continuation drafts on from the head's own features while a round is
        # verified: its first token is judged at draft position K + 1 (K = 4 here).
        assert len(greedy["speculative"]["per_position_acceptance"]) > 4, greedy["speculative"]
    for seed in ("1", "2"):
        sampled = ("--temperature", "0.8", "--seed", seed)
        assert ids(*sampled, *head, "--spec-sampling", "coupled") == ids(*sampled, "--draft", "none")


@pytest.fixture(scope="module")
def fused_run(specula_bin, tmp_path_factory):
    """The toy pipeline again with --feature-layers 0: the data rows carry the residual after the
    target's first block beside the final hidden state, and the head fuses them (EAGLE-3)."""
    return _train_toy(specula_bin, tmp_path_factory.mktemp("draft-toy-fused"), "--feature-layers", "0")


def test_fused_feature_data_holds_the_final_hidden_state_then_the_layer_and_refeeding_writes_the_same_file(
        toy_run, fused_run, specula_bin, tmp_path):
    """draft-data --feature-layers 0 writes version 2 rows of 2H: the same tokens, final hidden
    states and top-k as the plain run (same target, same seeds), then the layer's residual.
    `draft-data --from` re-feeding the plain file (one prefill per record, every row's features)
    writes the very same bytes as sampling with the layers did (one row per decode step)."""
    (plain, _), (fused, metrics) = toy_run, fused_run
    h1, s1 = data_format.read(plain / "data.spd")
    h2, s2 = data_format.read(fused / "data.spd")
    assert h2.feature_layers == (0,) and h2.row_width == 2 * h1.hidden and h1.feature_layers == ()
    assert len(s1) == len(s2)
    for a, b in zip(s1, s2):
        assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.topk_ids, b.topk_ids)
        assert np.array_equal(a.hidden, b.hidden[:, :h1.hidden])
        assert not np.array_equal(b.hidden[:, h1.hidden:], a.hidden)
    target = plain / "target" / "q4_1_tied" / "model.gguf"
    again = tmp_path / "again.spd"
    subprocess.run([str(specula_bin), "draft-data", "--model", str(target), "--from", str(plain / "data.spd"),
                    "--out", str(again), "--feature-layers", "0", "--batch", "7", "--log", str(tmp_path / "log")],
                   check=True, capture_output=True)
    assert again.read_bytes() == (fused / "data.spd").read_bytes()
    assert "0 rows whose final hidden state differs" in (tmp_path / "log").read_text()
    assert metrics["feature_layers"] == [0] and metrics["export_check"]["ok"], metrics["export_check"]


def test_a_fused_feature_head_names_its_layer_and_the_runtime_drafts_as_the_trainer_measured(fused_run, specula_bin):
    out, metrics = fused_run
    target = out / "target" / "q4_1_tied" / "model.gguf"
    _, f = _fields(out / "draft.gguf")
    assert list(f["draft.feature_layers"]) == [0]
    r, _ = _fields(out / "draft.gguf")
    assert [int(d) for d in next(t for t in r.tensors if t.name == "fuse.weight").shape] == [128, 64]
    assert metrics["validation"]["top1"][0] > metrics["baseline_top1"] + 0.15
    p = subprocess.run([str(specula_bin), "draft-eval", "--model", str(target), "--draft", f"eagle:{out / 'draft.gguf'}",
                        "--data", str(out / "data.spd"), "--responses-only"], capture_output=True, text=True, check=True)
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["top1_depth1"] > metrics["validation"]["top1"][0] - 0.05, (got, metrics["validation"])


def test_a_fused_feature_head_needs_data_that_holds_its_layer(toy_run, fused_run, specula_bin):
    (plain, _), (fused, _) = toy_run, fused_run
    target = plain / "target" / "q4_1_tied" / "model.gguf"
    p = subprocess.run([str(specula_bin), "draft-eval", "--model", str(target), "--draft", f"eagle:{fused / 'draft.gguf'}",
                        "--data", str(plain / "data.spd")], capture_output=True, text=True)
    assert p.returncode != 0 and "reads the target's layer 0, which the file does not hold" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


@pytest.mark.parametrize("pipeline", ["off", "always"])
def test_the_engine_with_a_fused_feature_head_gives_target_only_text_greedy_and_coupled(fused_run, specula_bin, pipeline):
    """The verifier hands the head rows of the final hidden state and the layer's residual: the
    head accepts drafts, and greedy and coupled text equal target-only, pipelining off and on;
    the sequential loop too."""
    out, _ = fused_run
    target = out / "target" / "q4_1_tied" / "model.gguf"

    def run(*extra):
        p = subprocess.run([str(specula_bin), "generate", "--model", str(target), "--prompt", "tell me about item 5", "--chat",
                            "--max-tokens", "40", "--json", *extra], capture_output=True, text=True, check=True)
        return json.loads(p.stdout.strip().splitlines()[-1])

    head = ["--draft", f"eagle:{out / 'draft.gguf'}"]
    want = run("--temperature", "0", "--draft", "none")["ids"]
    for extra in (["--pipeline", pipeline], ["--sequential"]):
        greedy = run("--temperature", "0", *head, *extra)
        assert greedy["ids"] == want
        assert greedy["speculative"]["accepted"] > 0.2 * greedy["speculative"]["drafted"], greedy["speculative"]
    sampled = ("--temperature", "0.8", "--seed", "4")
    coupled = run(*sampled, *head, "--pipeline", pipeline, "--spec-sampling", "coupled")["ids"]
    assert coupled == run(*sampled, "--draft", "none")["ids"]


SHIPPED = SOURCE_DIR / "tools" / "draft" / "heads" / "SmolLM2-135M-Instruct.eagle.gguf"


def test_the_shipped_head_matches_its_sha256_is_for_the_default_model_and_is_found_by_draft_eagle(specula_bin,
                                                                                                  default_model):
    assert SHIPPED.exists() and SHIPPED.stat().st_size <= MAX_BYTES
    want = (SHIPPED.parent / (SHIPPED.name + ".sha256")).read_text().split()[0]
    assert hashlib.sha256(SHIPPED.read_bytes()).hexdigest() == want
    _, meta = _fields(SHIPPED)
    assert meta["general.architecture"] == "specula-eagle"
    assert meta["draft.target_hash"] == _target_hash(default_model)
    assert list(meta["draft.feature_layers"]) == [2, 14]  # EAGLE-3's fused features (docs/draft.md)
    # `--draft eagle` finds it by that hash, and greedy speculation with it is target-only greedy.
    def ids(*draft):
        p = subprocess.run([str(specula_bin), "generate", "--model", str(default_model), "--prompt", "Name three colors.",
                            "--chat", "--max-tokens", "32", "--temperature", "0", "--json", *draft],
                           capture_output=True, text=True, timeout=300, env=dict(os.environ, SPECULA_DRAFT_HEADS=""))
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout.strip().splitlines()[-1])
    with_head = ids("--draft", "eagle")
    assert with_head["speculative"]["draft"] == "eagle"
    assert with_head["speculative"]["drafted"] > 0
    assert with_head["ids"] == ids("--draft", "none")["ids"]
