"""The default model (SmolLM2-135M-Instruct GGUF) for the oracle tests: a tokenizers-library
tokenizer rebuilt from the GGUF vocabulary, the fixed chat prompts, and the NumPy reference on
its dequantized weights."""
from __future__ import annotations

import functools
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gguf_weights  # noqa: E402
import numpy_llama  # noqa: E402

SYSTEM_LINE = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"  # the template's default

# Open questions whose answers run well past 16 tokens, so EOS does not end the comparison early.
QUESTIONS = [
    "Explain why the sky is blue.",
    "Write a short story about a cat who learns to fly.",
    "What are the main causes of climate change?",
    "Give me some tips for learning a new language.",
    "Describe how a bicycle works.",
]

# Plain English passages for the golden logits (first 32 tokens of each).
PASSAGES = [
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based ink and a wooden press into a system that could produce books quickly.",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide to make "
    "sugar and oxygen. It takes place mostly in the leaves, inside small structures called chloroplasts.",
    "<|im_start|>user\nCan you recommend a good book for a long train journey?<|im_end|>\n<|im_start|>assistant\n"
    "Of course! If you enjoy adventure, you might like a classic novel such as",
    "To bake a simple loaf of bread, mix flour, water, salt and yeast, knead the dough until it is smooth, "
    "let it rise in a warm place, shape it, and bake it in a hot oven.",
    "The city council met on Tuesday evening to discuss the new park. Most residents who spoke were in "
    "favour of the plan, although some worried about traffic and parking near the entrance.",
]


def chat_text(question: str) -> str:
    """ChatML as SmolLM2's template renders one user turn with the default system line."""
    return (f"<|im_start|>system\n{SYSTEM_LINE}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")


@functools.lru_cache(maxsize=2)
def tokenizer(path: str):
    """A tokenizers.Tokenizer equivalent to SmolLM2's tokenizer.json, built from the GGUF's
    tokens and merges: BPE, digits split one by one, then the GPT-2 byte-level regex."""
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    r = gguf.GGUFReader(path)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ", 1)) for m in r.fields["tokenizer.ggml.merges"].contents()]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == 3])
    return tok


def encode(path, text: str) -> list[int]:
    return tokenizer(str(path)).encode(text, add_special_tokens=False).ids


def decode(path, ids) -> str:
    return tokenizer(str(path)).decode(list(ids), skip_special_tokens=True)


@functools.lru_cache(maxsize=1)
def reference(path: str) -> numpy_llama.NumpyLlama:
    """NumPy reference in float32 on the file's weights dequantized by the gguf package, q/k
    un-permuted to HF layout (so RoPE is the half-split kind)."""
    cfg, weights, _ = gguf_weights.load(path)
    return numpy_llama.NumpyLlama(cfg, weights, dtype=np.float32)


def stop_ids(path) -> set[int]:
    """<|im_end|> ends an assistant turn; <|endoftext|> ends a document."""
    tok = tokenizer(str(path))
    return {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")}
