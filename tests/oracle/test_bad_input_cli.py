"""Bad model files given to the `specula` program: each must end in a non-zero exit, exactly one
line on stderr naming the problem, and no crash (an exit by signal or an abort).

The files are a tiny valid Llama written with gguf's GGUFWriter and then cut or corrupted at known
places, plus broken Hugging Face directories. A valid copy is loaded first as the positive control,
so a failure below is caused by the damage, not by the writer.
"""
from __future__ import annotations

import json
import os
import pathlib
import struct
import subprocess

import gguf
import numpy as np
import pytest
from safetensors.numpy import save_file

HIDDEN, INTER, HEADS, KV_HEADS, LAYERS, CTX = 32, 64, 2, 1, 1, 64
HEAD_DIM = HIDDEN // HEADS


def byte_tokens() -> list[str]:
    """3 specials then the 256 byte tokens in GPT-2's byte-to-unicode spelling, then one merge."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out, n = [], 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(0x100 + n))
            n += 1
    return ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *out, "th"]


TOKENS = byte_tokens()
VOCAB = len(TOKENS)


def tensor_shapes(arch_ok: bool = True) -> dict[str, tuple[int, ...]]:
    """GGUF names -> numpy (outermost-first) shapes of a tied tiny Llama."""
    s = {"token_embd.weight": (VOCAB, HIDDEN), "output_norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"blk.{i}."
        s |= {
            p + "attn_norm.weight": (HIDDEN,), p + "ffn_norm.weight": (HIDDEN,),
            p + "attn_q.weight": (HEADS * HEAD_DIM, HIDDEN), p + "attn_k.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            p + "attn_v.weight": (KV_HEADS * HEAD_DIM, HIDDEN), p + "attn_output.weight": (HIDDEN, HEADS * HEAD_DIM),
            p + "ffn_gate.weight": (INTER, HIDDEN), p + "ffn_up.weight": (INTER, HIDDEN),
            p + "ffn_down.weight": (HIDDEN, INTER),
        }
    return s


def write_gguf(path: pathlib.Path, arch: str = "llama", drop: str | None = None,
               reshape: dict[str, tuple[int, ...]] | None = None, tokens: list[str] | None = None,
               merges: list[str] | None = None) -> pathlib.Path:
    tokens, merges = tokens or TOKENS, merges or ["t h"]
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    shapes = tensor_shapes() | {"token_embd.weight": (len(tokens), HIDDEN)} | (reshape or {})
    for name, shape in shapes.items():
        if name == drop:
            continue
        w.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def good_gguf(work_dir) -> pathlib.Path:
    return write_gguf(work_dir / "good.gguf")


def run(specula_bin, command: str, model: pathlib.Path | str) -> subprocess.CompletedProcess:
    args = [str(specula_bin), command, "--model", str(model)]
    if command == "generate":
        args += ["--prompt", "hi", "--max-tokens", "2", "--temperature", "0"]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_the_valid_tiny_model_loads(specula_bin, good_gguf):
    p = run(specula_bin, "info", good_gguf)
    assert p.returncode == 0, p.stderr
    assert f"vocab         {VOCAB}" in p.stdout
    assert "layers        1" in p.stdout


# ---- the broken files, each with the words its error must contain -----------------------------

def cut(src: pathlib.Path, dst: pathlib.Path, at: int) -> pathlib.Path:
    dst.write_bytes(src.read_bytes()[:at])
    return dst


def patched(src: pathlib.Path, dst: pathlib.Path, pos: int, fmt: str, value) -> pathlib.Path:
    b = bytearray(src.read_bytes())
    struct.pack_into(fmt, b, pos, value)
    dst.write_bytes(bytes(b))
    return dst


def info_field_pos(reader: gguf.GGUFReader, tensor: str, part: int) -> int:
    """Byte position of one part of a tensor's info (-1 = its data offset, -2 = its type)."""
    t = next(t for t in reader.tensors if t.name == tensor)
    return int(t.field.offset) + sum(int(p.nbytes) for p in t.field.parts[:part])


def write_hf_dir(d: pathlib.Path, config: str, safetensors: bytes | None = None) -> pathlib.Path:
    d.mkdir()
    (d / "config.json").write_text(config)
    (d / "tokenizer.json").write_text("{}")
    if safetensors is not None:
        (d / "model.safetensors").write_bytes(safetensors)
    return d


HF_CONFIG = json.dumps({
    "architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN, "intermediate_size": INTER,
    "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
    "vocab_size": VOCAB, "max_position_embeddings": CTX, "tie_word_embeddings": True,
})


def make_bad(kind: str, good: pathlib.Path, d: pathlib.Path) -> tuple[pathlib.Path | str, list[str]]:
    """(path of a broken model, words its one-line error must contain)."""
    r = gguf.GGUFReader(str(good))
    size = good.stat().st_size
    tokens_at = int(r.fields["tokenizer.ggml.tokens"].offset)
    first_info = info_field_pos(r, "token_embd.weight", 0)
    if kind == "missing":
        return d / "no-such-model.gguf", ["model not found", "no-such-model.gguf"]
    if kind == "empty":
        (d / "empty.gguf").write_bytes(b"")
        return d / "empty.gguf", ["empty"]
    if kind == "not_gguf":
        (d / "notes.gguf").write_text("these are not weights\n")
        return d / "notes.gguf", ["not a GGUF file"]
    if kind == "truncated_header":
        return cut(good, d / "t_header.gguf", 20), ["truncated", "has 20 bytes"]
    if kind == "truncated_kv":
        return cut(good, d / "t_kv.gguf", tokens_at + 100), ["truncated", str(tokens_at + 100)]
    if kind == "truncated_infos":
        return cut(good, d / "t_infos.gguf", first_info + 30), ["truncated", str(first_info + 30)]
    if kind == "truncated_data":
        return cut(good, d / "t_data.gguf", size - 1000), ["truncated", str(size - 1000)]
    if kind == "corrupt_offset":
        pos = info_field_pos(r, "blk.0.ffn_up.weight", -1)
        return patched(good, d / "offset.gguf", pos, "<Q", 1 << 40), ["blk.0.ffn_up.weight", "past the end"]
    if kind == "unsupported_type":
        pos = info_field_pos(r, "blk.0.attn_q.weight", -2)
        return patched(good, d / "tq1_0.gguf", pos, "<I", 34), ["'blk.0.attn_q.weight'", "TQ1_0 (34)"]
    if kind == "not_llama":
        return write_gguf(d / "qwen.gguf", arch="qwen2"), ["unsupported architecture 'qwen2'"]
    if kind == "missing_tensor":
        return write_gguf(d / "drop.gguf", drop="blk.0.ffn_down.weight"), ["'blk.0.ffn_down.weight' is missing"]
    if kind == "wrong_shape":
        bad = write_gguf(d / "shape.gguf", reshape={"blk.0.attn_k.weight": (HIDDEN, HIDDEN)})
        return bad, ["'blk.0.attn_k.weight'", f"[{HIDDEN}, {HIDDEN}]", f"[{HEAD_DIM}, {HIDDEN}]"]
    if kind == "hf_malformed_config":
        return write_hf_dir(d / "hf_json", HF_CONFIG[:-10]), ["config.json", "not valid JSON"]
    if kind == "hf_not_llama":
        cfg = json.loads(HF_CONFIG) | {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
        return write_hf_dir(d / "hf_qwen", json.dumps(cfg)), ["unsupported architecture 'Qwen2ForCausalLM'"]
    if kind == "hf_missing_field":
        cfg = json.loads(HF_CONFIG)
        del cfg["num_attention_heads"]
        return write_hf_dir(d / "hf_field", json.dumps(cfg)), ["config.json", "num_attention_heads"]
    if kind == "hf_bad_offsets":
        save_file({"model.norm.weight": np.ones(HIDDEN, np.float32)}, str(d / "ok.safetensors"))
        st = bytearray((d / "ok.safetensors").read_bytes())
        n = struct.unpack_from("<Q", st, 0)[0]
        header = st[8:8 + n].decode().replace(f"[0,{HIDDEN * 4}]", f"[0,{HIDDEN * 8}]")
        assert len(header) == n, "the edit keeps the header length"
        st[8:8 + n] = header.encode()
        return write_hf_dir(d / "hf_offsets", HF_CONFIG, bytes(st)), ["model.norm.weight", "data_offsets"]
    if kind == "hf_no_weights":
        return write_hf_dir(d / "hf_empty", HF_CONFIG), ["model.safetensors"]
    raise AssertionError(kind)


KINDS = ["missing", "empty", "not_gguf", "truncated_header", "truncated_kv", "truncated_infos", "truncated_data",
         "corrupt_offset", "unsupported_type", "not_llama", "missing_tensor", "wrong_shape", "hf_malformed_config", "hf_not_llama",
         "hf_missing_field", "hf_bad_offsets", "hf_no_weights"]


def expect_one_line_error(p: subprocess.CompletedProcess, words: list[str]) -> None:
    """A non-zero exit that is not a crash, and exactly one stderr line holding every word."""
    assert p.returncode > 0, f"exit {p.returncode} (negative = killed by a signal); stderr: {p.stderr!r}"
    assert p.returncode not in (134, 139), f"exit {p.returncode} looks like an abort or a segfault: {p.stderr!r}"
    lines = p.stderr.splitlines()
    assert len(lines) == 1, f"want exactly one line on stderr, got {len(lines)}: {p.stderr!r}"
    for w in words:
        assert w in lines[0], f"{w!r} not in: {lines[0]}"


@pytest.mark.parametrize("command", ["info", "generate"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_bad_model_is_one_line_on_stderr_and_a_nonzero_exit(specula_bin, good_gguf, tmp_path, kind, command):
    model, words = make_bad(kind, good_gguf, tmp_path)
    p = run(specula_bin, command, model)
    expect_one_line_error(p, words)
    assert p.stdout == "", f"nothing should reach stdout: {p.stdout!r}"


# ---- bad speculation settings (issue 3): a clear one-line error and a non-zero exit -------------

def speculate(specula_bin, model: pathlib.Path, *flags: str) -> subprocess.CompletedProcess:
    args = [str(specula_bin), "generate", "--model", str(model), "--prompt", "hi", "--max-tokens", "2",
            "--temperature", "0", *flags]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_speculation_with_good_settings_runs_on_the_tiny_model(specula_bin, good_gguf):
    """The positive control for the cases below: the same command with valid settings succeeds."""
    for flags in (["--draft", "ngram", "--spec-k", "4"], ["--draft", str(good_gguf), "--spec-k", "16"]):
        p = speculate(specula_bin, good_gguf, *flags)
        assert p.returncode == 0, f"{flags}: {p.stderr}"


@pytest.mark.parametrize("flags,words", [
    (["--draft", "ngram", "--spec-k", "0"], ["--spec-k", "between 1 and 16", "got 0"]),
    (["--draft", "ngram", "--spec-k", "17"], ["--spec-k", "between 1 and 16", "got 17"]),
    (["--draft", "ngram", "--adaptive", "--spec-k-min", "5", "--spec-k-max", "3"], ["K_min 5", "K_max 3"]),
    (["--draft", "ngram", "--spec-k-max-greedy", "17"], ["K_max for greedy requests", "between 1 and 16", "got 17"]),
    (["--draft", "ngram", "--adaptive", "--spec-k-min", "5", "--spec-k-max-greedy", "3"],
     ["K_min 5", "K_max for greedy requests 3"]),
    (["--draft", "skip:0"], ["skips every one of the model's 1 layers"]),
    (["--draft", "ngram:n=x"], ["ngram:n=x"]),
    (["--draft", "ngram:n=0"], ["ngram n", "got 0"]),
    (["--draft", "ngram:n=3+ngram"], ["ngram:n=3+ngram", "in front of one other drafter"]),
    (["--draft", "ngram:n=2,min=3+skip:0"], ["ngram min", "got 3"]),
    (["--draft", "ngram", "--spec-sampling", "maybe"], ["'exact', 'block' or 'coupled'", "maybe"]),
    (["--draft", "ngram", "--draft-confidence", "1.5"], ["--draft-confidence", "[0, 1)", "got 1.5"]),
    (["--draft", "ngram", "--draft-confidence", "auto"], ["--draft-confidence auto", "give --adaptive"]),
], ids=["k0", "k17", "kmin_gt_kmax", "greedy_kmax17", "kmin_gt_greedy_kmax", "skip_all", "ngram_not_a_number", "ngram_zero", "lookup_before_lookup",
    "lookup_min_above_n", "bad_sampling_mode", "confidence_above_one", "confidence_auto_without_adaptive"])
def test_a_bad_speculation_setting_is_one_line_on_stderr_and_a_nonzero_exit(specula_bin, good_gguf, flags, words):
    expect_one_line_error(speculate(specula_bin, good_gguf, *flags), words)


def test_a_draft_model_with_another_vocabulary_is_refused_naming_the_first_difference(specula_bin, good_gguf, tmp_path):
    other = list(TOKENS)
    other[-1] = "he"  # the one merged token differs
    draft = write_gguf(tmp_path / "other_vocab.gguf", tokens=other, merges=["h e"])
    expect_one_line_error(speculate(specula_bin, good_gguf, "--draft", str(draft)), [f"token {VOCAB - 1}", '"he" in the draft', '"th" in the target'])
    bigger = write_gguf(tmp_path / "bigger_vocab.gguf", tokens=[*TOKENS, "he"])
    expect_one_line_error(speculate(specula_bin, good_gguf, "--draft", str(bigger)), [str(VOCAB), str(VOCAB + 1)])


def test_a_missing_draft_model_is_one_line_naming_the_file(specula_bin, good_gguf, tmp_path):
    expect_one_line_error(speculate(specula_bin, good_gguf, "--draft", str(tmp_path / "no-draft.gguf")), ["draft model not found", "no-draft.gguf"])


def _has_avx512() -> bool:
    try:
        flags = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return all(f in flags.split() for f in ("avx512f", "avx512bw", "avx512vl"))


@pytest.mark.parametrize("value,words", [
    ("avx9", ["SPECULA_SIMD=avx9", "not a host path"]),
    ("fastest", ["SPECULA_SIMD=fastest", "not a host path"]),
    ("avx512", ["SPECULA_SIMD=avx512", "this CPU has no AVX-512"]),
], ids=["unknown", "unknown_word", "avx512_missing"])
def test_a_host_path_that_is_not_one_or_that_the_cpu_lacks_is_one_line_and_a_nonzero_exit(specula_bin, good_gguf, value, words):
    if value == "avx512" and _has_avx512():
        pytest.skip("this CPU has AVX-512: the missing-path case cannot be shown here")
    p = subprocess.run([str(specula_bin), "generate", "--model", str(good_gguf), "--prompt-ids", "1,2", "--max-tokens", "2",
                        "--temperature", "0"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "SPECULA_SIMD": value})
    expect_one_line_error(p, words)
    # The same file runs on each path the CPU has (the positive control).
    for ok in ("", "reference", "portable", "reference-portable"):
        q = subprocess.run([str(specula_bin), "generate", "--model", str(good_gguf), "--prompt-ids", "1,2", "--max-tokens", "2",
                            "--temperature", "0"], capture_output=True, text=True, timeout=60, env={**os.environ, "SPECULA_SIMD": ok})
        assert q.returncode == 0, f"SPECULA_SIMD={ok!r}: {q.stderr}"
