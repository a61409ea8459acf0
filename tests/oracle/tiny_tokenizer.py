"""A small byte-level BPE vocabulary for the tiny test models, as tokenizer.json and as GGUF lists.

Layout (vocab_size = 3 + 256 + n_merges):
  ids 0-2      special tokens <|endoftext|>, <|im_start|>, <|im_end|> (as SmolLM2 has them at 0-2)
  ids 3-258    the 256 byte tokens, in byte order, spelled with GPT-2's byte-to-unicode map
  ids 259-...  one token per merge, in merge order (merge rank = its index)
The merges are learnt by a deterministic little BPE trainer over a fixed English text, so the
file is the same on every machine and every library version.
"""
from __future__ import annotations

import json
import re
from collections import Counter

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BOS_ID = 1  # <|im_start|>, as in SmolLM2
EOS_ID = 2  # <|im_end|>

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_TRAINING_TEXT = (
    "The quick brown fox jumps over the lazy dog. There is nothing either good or bad, but thinking "
    "makes it so. It is a truth universally acknowledged, that a single man in possession of a good "
    "fortune, must be in want of a wife. In the beginning the universe was created. This has made a "
    "lot of people very angry and been widely regarded as a bad move. All happy families are alike; "
    "each unhappy family is unhappy in its own way. The sky above the port was the color of "
    "television, tuned to a dead channel. Call me Ishmael. It was the best of times, it was the "
    "worst of times, it was the age of wisdom, it was the age of foolishness.\n"
)

# GPT-2's pre-tokenizer regex restricted to ASCII (the training text is ASCII; Python's `re` has no \p{L}).
_PRETOKENIZE = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map: printable bytes map to themselves, the other 68 to U+0100 + n in byte order."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(0x100 + n)
            n += 1
    return out


def train_merges(n_merges: int) -> list[tuple[str, str]]:
    """Classic BPE training: repeatedly merge the most frequent adjacent pair (ties: smallest pair)."""
    b2u = bytes_to_unicode()
    words = Counter(
        tuple(b2u[b] for b in piece.encode("utf-8")) for piece in _PRETOKENIZE.findall(_TRAINING_TEXT)
    )
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        pairs: Counter = Counter()
        for word, count in words.items():
            for a, b in zip(word, word[1:]):
                pairs[(a, b)] += count
        if not pairs:
            raise ValueError(f"training text supports only {len(merges)} merges, {n_merges} asked")
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged: Counter = Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    return merges


def vocabulary(vocab_size: int) -> tuple[list[str], list[str]]:
    """(tokens by id, merges as "a b" strings) for a vocabulary of exactly vocab_size tokens."""
    n_merges = vocab_size - len(SPECIAL_TOKENS) - 256
    if n_merges < 0:
        raise ValueError(f"vocab_size {vocab_size} is smaller than the {len(SPECIAL_TOKENS) + 256} fixed tokens")
    b2u = bytes_to_unicode()
    merges = train_merges(n_merges)
    tokens = SPECIAL_TOKENS + [b2u[b] for b in range(256)] + [a + b for a, b in merges]
    assert len(set(tokens)) == len(tokens) == vocab_size, "merges must create distinct tokens"
    return tokens, [f"{a} {b}" for a, b in merges]


def gguf_token_types(vocab_size: int) -> list[int]:
    """GGUF token types: 3 (control) for the special tokens, 1 (normal) for the rest, as
    llama.cpp's converter writes them for a gpt2-style vocabulary."""
    return [3] * len(SPECIAL_TOKENS) + [1] * (vocab_size - len(SPECIAL_TOKENS))


def tokenizer_json(vocab_size: int) -> dict:
    """A Hugging Face tokenizer.json: BPE model, ByteLevel pre-tokenizer (GPT-2 regex) and decoder."""
    tokens, merges = vocabulary(vocab_size)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for i, t in enumerate(SPECIAL_TOKENS)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": merges,
        },
    }


def tokenizer_config_json() -> dict:
    return {
        "bos_token": SPECIAL_TOKENS[BOS_ID],
        "eos_token": SPECIAL_TOKENS[EOS_ID],
        "unk_token": None,
        "pad_token": SPECIAL_TOKENS[0],
        "model_max_length": 1024,
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": False,
        "chat_template": CHATML_TEMPLATE,
    }


def write_hf_tokenizer(directory, vocab_size: int) -> None:
    with open(f"{directory}/tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(tokenizer_json(vocab_size), f, ensure_ascii=False, indent=1)
    with open(f"{directory}/tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(tokenizer_config_json(), f, indent=1)
