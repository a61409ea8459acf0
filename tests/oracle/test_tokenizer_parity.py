"""Tokenizer parity: `specula tokenize` must give the same ids as Hugging Face `tokenizers`, and
decode(encode(s)) == s on both, over the corpus of tokenizer_corpus.py (2,000+ strings).

References, both built here from primary data rather than trusted from Specula:
- SmolLM2: the default GGUF's own vocabulary and merges, with HF SmolLM2's pre-tokenizer
  (Digits(individual) then ByteLevel with the GPT-2 regex) and its control tokens as added
  tokens. Specula is run on the GGUF (`--model`) and on this tokenizer.json (`--tokenizer`).
- Llama 3: Meta's tiktoken ranks from the llama-models wheel, turned into a BPE tokenizer.json
  the way transformers' TikTokenConverter does (merges recovered from the ranks). It must first
  reproduce llama.cpp's llama-bpe test vectors in HF, which shows the construction is right.
  Specula is run on the tokenizer.json and on a vocabulary-only GGUF (pre "llama-bpe").
"""
import base64
import json
import subprocess
import sys
import zipfile

import gguf
import pytest
from tokenizers import Tokenizer as HFTokenizer

import tokenizer_corpus
from conftest import CACHE_DIR, SHARED_DIR

VECTORS_DIR = SHARED_DIR / "data" / "tokenizer-vectors"
LLAMA_MODELS = "llama-models==0.3.0"
LLAMA_MODELS_WHEEL = CACHE_DIR / "pip" / "llama_models-0.3.0-py3-none-any.whl"
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


# ---- building the references -------------------------------------------------------------------

def bytes_to_unicode():
    """GPT-2's byte -> printable character map (the ByteLevel alphabet)."""
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(0x100 + n)
            n += 1
    return chars


BYTE_CHARS = bytes_to_unicode()


def byte_level(token: bytes) -> str:
    return "".join(BYTE_CHARS[b] for b in token)


def tokenizer_json(vocab, merges, added, pre_tokenizer, ignore_merges):
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": pre_tokenizer, "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges},
    }


def added_token(i, content):
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def smollm_reference(gguf_path):
    """HF SmolLM2's tokenizer.json, rebuilt from the GGUF's vocabulary and merges."""
    fields = gguf.GGUFReader(str(gguf_path)).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    types = fields["tokenizer.ggml.token_type"].contents()
    merges = fields["tokenizer.ggml.merges"].contents()
    assert fields["tokenizer.ggml.pre"].contents() == "smollm"
    pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ]}
    added = [added_token(i, t) for i, t in enumerate(tokens) if types[i] == 3]
    return tokenizer_json({t: i for i, t in enumerate(tokens)}, merges, added, pre, ignore_merges=False)


def llama_models_wheel():
    """The llama-models wheel, from the cache or fetched once into it."""
    if not LLAMA_MODELS_WHEEL.exists():
        LLAMA_MODELS_WHEEL.parent.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", LLAMA_MODELS,
                            "-d", str(LLAMA_MODELS_WHEEL.parent)], capture_output=True, text=True)
        assert LLAMA_MODELS_WHEEL.exists(), f"could not fetch {LLAMA_MODELS} into {LLAMA_MODELS_WHEEL.parent}:\n{r.stderr[-2000:]}"
    return LLAMA_MODELS_WHEEL


def llama3_special_tokens(tokenizer_py: str):
    """The 256 special tokens in llama_models/llama3/tokenizer.py's order (ids 128000 on)."""
    named = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
             "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
             "<|eot_id|>", "<|python_tag|>", "<|image|>"]
    for t in named:  # guard against a wheel whose list differs from the one written here
        assert f'"{t}"' in tokenizer_py, f"{t} is not in llama_models/llama3/tokenizer.py"
    assert "num_reserved_special_tokens = 256" in tokenizer_py
    return named + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(named))]


def llama3_reference(wheel):
    """Llama 3's tokenizer.json from the tiktoken ranks, as transformers' TikTokenConverter builds it."""
    with zipfile.ZipFile(wheel) as z:
        model = z.read("llama_models/llama3/tokenizer.model").decode()
        tokenizer_py = z.read("llama_models/llama3/tokenizer.py").decode()
    ranks = {}
    for line in model.splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    assert len(ranks) == 128000
    # Every split of a token into two tokens is a merge, ordered by the rank of the result and
    # then by the ranks of the parts; BPE with these merges equals tiktoken's rank-driven merging.
    merges = []
    for token, rank in ranks.items():
        local = [(token[:i], token[i:], rank) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
        local.sort(key=lambda m: (ranks[m[0]], ranks[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2])
    merges = [[byte_level(a), byte_level(b)] for a, b, _ in merges]
    vocab = {byte_level(t): r for t, r in ranks.items()}
    specials = llama3_special_tokens(tokenizer_py)
    added = [added_token(128000 + i, t) for i, t in enumerate(specials)]
    pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ]}
    return tokenizer_json(vocab, merges, added, pre, ignore_merges=True)


def write_vocab_gguf(path, tj, pre):
    """A vocabulary-only GGUF (no tensors) holding a tokenizer.json's tokens and merges."""
    size = max(max(tj["model"]["vocab"].values()), max(a["id"] for a in tj["added_tokens"])) + 1
    tokens, types = [""] * size, [1] * size
    for t, i in tj["model"]["vocab"].items():
        tokens[i] = t
    for a in tj["added_tokens"]:
        tokens[a["id"]], types[a["id"]] = a["content"], 3
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


class Reference:
    def __init__(self, name, tj, work_dir, chat_format):
        self.name = name
        self.dir = work_dir / name
        self.dir.mkdir(exist_ok=True)
        self.json_path = self.dir / "tokenizer.json"
        self.json_path.write_text(json.dumps(tj, ensure_ascii=False), encoding="utf-8")
        self.hf = HFTokenizer.from_file(str(self.json_path))
        self.specials = [a["content"] for a in tj["added_tokens"]]
        self.corpus = tokenizer_corpus.corpus(SHARED_DIR, self.specials, chat_format)
        self.gguf_path = None

    def encode(self, strings, parse_special=True):
        self.hf.encode_special_tokens = not parse_special
        try:
            return [e.ids for e in self.hf.encode_batch(strings, add_special_tokens=False)]
        finally:
            self.hf.encode_special_tokens = False

    def decode(self, ids_list):
        return self.hf.decode_batch(ids_list, skip_special_tokens=False)


@pytest.fixture(scope="module")
def smollm(default_model, work_dir):
    ref = Reference("smollm2", smollm_reference(default_model), work_dir, "chatml")
    ref.gguf_path = default_model
    return ref


@pytest.fixture(scope="module")
def llama3(work_dir):
    ref = Reference("llama3", llama3_reference(llama_models_wheel()), work_dir, "llama3")
    ref.gguf_path = ref.dir / "llama3-vocab.gguf"
    write_vocab_gguf(ref.gguf_path, json.loads(ref.json_path.read_text(encoding="utf-8")), "llama-bpe")
    return ref


# ---- running Specula ---------------------------------------------------------------------------

def specula_tokenize(specula_bin, source, strings, out_dir, tag, parse_special=True):
    """`specula tokenize` over strings; returns [(ids, decoded)] in input order."""
    inp, out = out_dir / f"{tag}.in.jsonl", out_dir / f"{tag}.out.jsonl"
    inp.write_text("".join(json.dumps(s) + "\n" for s in strings), encoding="utf-8")
    flag = "--model" if str(source).endswith(".gguf") else "--tokenizer"
    cmd = [str(specula_bin), "tokenize", flag, str(source), "--input", str(inp), "--output", str(out)]
    if not parse_special:
        cmd.append("--no-special")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr}"
    print(f"[{tag}] {r.stderr.strip()}")
    # Split on "\n" only: the output holds raw U+2028 and U+0085, which splitlines() breaks on.
    rows = [json.loads(line) for line in out.read_bytes().decode("utf-8").split("\n") if line]
    assert len(rows) == len(strings), f"{len(rows)} output lines for {len(strings)} inputs"
    return [(row["ids"], row["decoded"]) for row in rows]


def assert_parity(strings, ours, hf_ids, hf_decoded):
    bad = [f"{s!r}\n    specula {o[0]}\n    hf      {h}" for s, o, h in zip(strings, ours, hf_ids) if o[0] != h]
    assert not bad, f"{len(bad)} of {len(strings)} strings tokenize differently, e.g.\n" + "\n".join(bad[:5])
    bad = [f"{s!r} -> specula {o[1]!r}" for s, o in zip(strings, ours) if o[1] != s]
    assert not bad, f"{len(bad)} strings do not survive specula's decode(encode(s)), e.g.\n" + "\n".join(bad[:5])
    bad = [f"{s!r} -> hf {d!r}" for s, d in zip(strings, hf_decoded) if d != s]
    assert not bad, f"{len(bad)} strings do not survive HF's decode(encode(s)), e.g.\n" + "\n".join(bad[:5])


# ---- tests -------------------------------------------------------------------------------------

def test_corpus_has_two_thousand_strings_with_every_kind_of_text(smollm):
    c = smollm.corpus
    assert len(c) >= 2000 and len(set(c)) >= 2000
    assert c == tokenizer_corpus.corpus(SHARED_DIR, smollm.specials, "chatml"), "the corpus must be deterministic"
    has = lambda pred: sum(1 for s in c if any(pred(ch) for ch in s))
    assert has(lambda ch: 0x4E00 <= ord(ch) <= 0x9FFF) >= 50, "CJK"
    assert has(lambda ch: ord(ch) >= 0x1F300) >= 50, "emoji"
    assert has(lambda ch: 0x0300 <= ord(ch) <= 0x036F) >= 50, "combining marks"
    assert sum(1 for s in c if "\t" in s and "\n" in s and "  " in s) >= 50, "mixed whitespace runs"
    assert sum(1 for s in c if any(t in s for t in smollm.specials)) >= 100, "special tokens written literally"
    assert sum(1 for s in c if any(ch.isdigit() for ch in s)) >= 300, "digit runs"


def test_llama3_reference_reproduces_llama_cpp_test_vectors(llama3):
    cases = load_vectors("ggml-vocab-llama-bpe.gguf")
    got = llama3.encode([s for s, _ in cases])
    assert [ids for _, ids in cases] == got


@pytest.mark.parametrize("source", ["json", "gguf"])
def test_specula_reproduces_llama_cpp_llama3_test_vectors(specula_bin, llama3, work_dir, source):
    cases = load_vectors("ggml-vocab-llama-bpe.gguf")
    path = llama3.json_path if source == "json" else llama3.gguf_path
    ours = specula_tokenize(specula_bin, path, [s for s, _ in cases], work_dir, f"llama3-vectors-{source}")
    for (text, expected), (ids, decoded) in zip(cases, ours):
        assert ids == expected, f"{text!r}"
        assert decoded == text


@pytest.mark.parametrize("parse_special", [True, False], ids=["special", "no-special"])
@pytest.mark.parametrize("source", ["gguf", "json"])
@pytest.mark.parametrize("model", ["smollm", "llama3"])
def test_specula_matches_hugging_face_on_the_corpus(request, specula_bin, work_dir, model, source, parse_special):
    ref = request.getfixturevalue(model)
    path = ref.gguf_path if source == "gguf" else ref.json_path
    tag = f"{model}-{source}-{'special' if parse_special else 'nospecial'}"
    ours = specula_tokenize(specula_bin, path, ref.corpus, work_dir, tag, parse_special)
    hf_ids = ref.encode(ref.corpus, parse_special)
    assert_parity(ref.corpus, ours, hf_ids, ref.decode(hf_ids))
    if parse_special:  # the literal special tokens in the corpus must have become their ids
        special_ids = set(ref.hf.token_to_id(t) for t in ref.specials)
        assert sum(1 for ids, _ in ours if special_ids.intersection(ids)) >= 100


def test_bad_input_lines_are_one_line_errors(specula_bin, default_model, work_dir):
    for content, message in [('"ok"\n[1, 2]\n', "line 2 is a JSON array"), ('"unterminated\n', "line 1 is not valid JSON")]:
        inp = work_dir / "bad.jsonl"
        inp.write_text(content, encoding="utf-8")
        r = subprocess.run([str(specula_bin), "tokenize", "--model", str(default_model), "--input", str(inp),
                            "--output", str(work_dir / "bad.out.jsonl")], capture_output=True, text=True)
        assert r.returncode == 1
        assert message in r.stderr and r.stderr.count("\n") == 1, r.stderr


def load_vectors(name):
    """llama.cpp's vectors: inputs each followed by a `__ggml_vocab_test__` line; one id line each."""
    text = (VECTORS_DIR / f"{name}.inp").read_bytes().decode("utf-8")  # bytes: keep "\r\n" as written
    inputs = text.split("\n__ggml_vocab_test__\n")[:-1]
    outputs = (VECTORS_DIR / f"{name}.out").read_text(encoding="utf-8").split("\n")[: len(inputs)]
    assert len(inputs) == 46
    return [(s, [int(x) for x in line.split()]) for s, line in zip(inputs, outputs)]
