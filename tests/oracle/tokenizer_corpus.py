"""Strings for tokenizer parity tests, the same on every run: hand-written edge cases, the chat
prompts in shared/data/prompts/chat.jsonl (alone and rendered in the model's chat format), and
seeded random mixtures of ASCII, CJK, emoji, combining marks, other scripts, digit runs,
whitespace runs, code and special-token text written literally.

Characters come from long-assigned Unicode blocks only: Oniguruma (inside HF tokenizers) and
PCRE2 (inside Specula) ship different Unicode versions, and newly assigned code points would
test that difference rather than the tokenizer.
"""
import json
import pathlib
import random

WORDS = (
    "the of and to in is you that it he was for on are as with his they I at be this have from or one had by word "
    "but not what all were we when your can said there use an each which she do how their if will up other about out "
    "many then them these so some her would make like him into time has look two more write go see number no way "
    "could people my than first water been call who oil its now find long down day did get come made may part "
    "Hello World Tokenizer SmolLM Llama GPU CUDA HTTP JSON naïve café résumé Zürich São Paulo"
).split()

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D", "'x", "''", "'"]
PUNCT = list(".,;:!?-_()[]{}<>/\\|@#$%^&*+=~`\"'") + ["...", "!!", "?!", "--", "->", "=>", "::", "**", "//", "/*", "*/"]

HAN = (0x4E00, 0x9FA5)
HIRAGANA = (0x3041, 0x3096)
KATAKANA = (0x30A1, 0x30FA)
HANGUL = (0xAC00, 0xD7A3)
CYRILLIC = (0x0410, 0x044F)
GREEK = (0x0391, 0x03C9)
ARABIC = (0x0621, 0x064A)
HEBREW = (0x05D0, 0x05EA)
DEVANAGARI = (0x0905, 0x0939)
THAI = (0x0E01, 0x0E30)
LATIN_EXT = (0x00C0, 0x017F)
COMBINING = (0x0300, 0x036F)

EMOJI = [
    "😀", "😂", "🥲", "🙂", "🤖", "🦙", "🐍", "🚀", "🔥", "✨", "❤️", "👍", "👍🏽", "👋🏿", "🎉", "🌍", "🧪",
    "👨‍💻", "👩‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "1️⃣", "#️⃣", "©️", "™", "☀", "✅", "❌", "⭐", "🫠", "🙏🏻",
]
OTHER_DIGITS = ["٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "²³¹", "½¼¾", "ⅫⅣ", "①②③", "߀߁"]
WHITESPACE = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", " \t ", "\n \n", "\u00a0", "\u3000",
              "\u2009", "\u200b", "\x0b", "\x0c", "\u0085", "\u2028", " \n\t\r "]
CONTROL = ["\x00", "\x01", "\x1b", "\x7f", "\x1f", "\ufeff", "\ufffd"]
CODE = [
    "def f(x):\n    return x ** 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    '{"key": [1, 2.5, -3e10], "nested": {"a": null}}',
    "#include <vector>\nint main() { return 0; }",
    "SELECT id, name FROM users WHERE age >= 18;",
    "<div class=\"x\">&nbsp;&lt;tag&gt;</div>",
    "x=1;y=2;z=x+y  # comment",
    "    indented\n        more\n    back",
    "$ ls -la | grep '\\.cpp$'",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "lambda x: x if x else None",
    "0x1F 0b1010 1_000_000 3.14159e-10 1e9",
]

EDGE_CASES = [
    "", " ", "  ", "\n", "\t", "\r\n", "a", "A", "0", "00", "007", "1234567890", "12345678901234567890",
    "3.14", "3..14", "1,000,000", "-42", "+7", "1/2", "10%", "v1.2.3", "2024-06-11T12:00:00Z",
    "Hello", " Hello", "  Hello", "   Hello", "Hello ", "Hello  ", "Hello\n", "Hello world", "hello, world!",
    "HELLO WORLD", "I'm", "I'M", "you're", "we'VE", "don't", "it's", "'s", "'ll", "''", "' '",
    "a  b", "a   b", "a\tb", "a\t\tb", "a \tb", "a\n\nb", "a \n b", "a\r\nb", " \n", "\n ", "\t\n\t",
    "   \n   \n", "trailing spaces   ", "   leading spaces", "\n\n\n\n", "                    ",
    "日本語", "日本語のテキスト", "中文字符", "한국어 텍스트", "Привет, мир!", "Γειά σου Κόσμε", "مرحبا بالعالم",
    "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Ḁḁ Ẁẁ", "e\u0301", "a\u0300\u0301\u0302", "n\u0303o\u0308",
    "Zalgo: z\u0351\u0300a\u0336l\u0327g\u0335o\u0352", "ǅ ǈ ǋ", "ß ẞ ſ", "'ſ", "İstanbul", "ﬁ ﬂ",
    "😀", "😀😀😀", "👨‍👩‍👧", "🇺🇸🇬🇧", "👍🏽👍🏿", "a😀b", " 😀", "😀 ", "1️⃣2️⃣", "❤️‍🔥",
    "٣٤٥", "१२३", "１２３", "²", "½", "Ⅻ", "3²", "x₁₂",
    "\x00", "a\x00b", "\x1b[31mred\x1b[0m", "\ufeffBOM", "\u200bzero\u200bwidth", "\u00a0nbsp\u00a0",
    "!!!!!!", "??????", "......", "''''''", "``````", '""""""', "------======", "<<<>>>", "___", "___init___",
    "http://example.com/path?q=1&r=2#frag", "user@example.com", "C:\\Windows\\System32", "~/.config/specula",
    "ied 4 ½ months", "Äpfel", "Ⅰ Ⅱ Ⅲ", "ℕ ℤ ℚ ℝ ℂ", "∀x∈ℝ: x²≥0", "→ ← ↔ ⇒", "©®™",
]


def _from(rng, block, n):
    return "".join(chr(rng.randint(*block)) for _ in range(n))


def _fragment(rng, specials):
    kind = rng.randrange(16)
    if kind == 0:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
    if kind == 1:
        return rng.choice(WORDS) + rng.choice(CONTRACTIONS)
    if kind == 2:
        return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 5)))
    if kind == 3:
        return _from(rng, rng.choice([HAN, HIRAGANA, KATAKANA, HANGUL]), rng.randint(1, 8))
    if kind == 4:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4)))
    if kind == 5:  # letters carrying one or more combining marks
        return "".join(chr(rng.randint(0x61, 0x7A)) + _from(rng, COMBINING, rng.randint(1, 3)) for _ in range(rng.randint(1, 4)))
    if kind == 6:
        return _from(rng, rng.choice([CYRILLIC, GREEK, ARABIC, HEBREW, DEVANAGARI, THAI, LATIN_EXT]), rng.randint(1, 10))
    if kind == 7:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 20)))
    if kind == 8:
        return rng.choice(OTHER_DIGITS)[: rng.randint(1, 10)]
    if kind == 9:
        return "".join(rng.choice(WHITESPACE) for _ in range(rng.randint(1, 4)))
    if kind == 10:
        return rng.choice(CODE)
    if kind == 11:
        return rng.choice(specials) if specials else " "
    if kind == 12:  # a special token cut short or wrapped, which must stay plain text
        s = rng.choice(specials) if specials else "<|x|>"
        return rng.choice([s[:-1], s[1:], s[: len(s) // 2], "<" + s, s + ">", s.upper()])
    if kind == 13:
        return rng.choice(CONTROL)
    if kind == 14:
        return "".join(chr(rng.randint(0x21, 0x7E)) for _ in range(rng.randint(1, 12)))
    return f"{rng.randint(0, 10**rng.randint(1, 12))}{rng.choice(['', '.', ',', ' ', 'px', '%', 'th'])}"


def random_strings(n, seed, specials):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = [_fragment(rng, specials) for _ in range(rng.randint(1, 10))]
        seps = ["", " ", " ", "\n", "\t", "  "]
        out.append("".join(p + rng.choice(seps) for p in parts).rstrip(rng.choice(["", " ", "\n"])))
    return out


def chat_prompts(shared_dir):
    path = pathlib.Path(shared_dir) / "data" / "prompts" / "chat.jsonl"
    return [json.loads(line) for line in path.read_bytes().decode("utf-8").split("\n") if line.strip()]


def render_chat(messages, chat_format):
    """The prompt text of a conversation, as model/chat_template.cpp renders it."""
    if chat_format == "chatml":
        text = ""
        if messages[0]["role"] != "system":
            text += "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        for m in messages:
            text += f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n"
        return text + "<|im_start|>assistant\n"
    if chat_format == "llama3":
        text = "<|begin_of_text|>"
        for m in messages:
            text += f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content'].strip()}<|eot_id|>"
        return text + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    raise ValueError(f"unknown chat format {chat_format!r}")


def corpus(shared_dir, specials, chat_format, n_random=2000, seed=1234):
    """Edge cases + chat prompts (contents and rendered) + n_random seeded strings, in order."""
    prompts = chat_prompts(shared_dir)
    strings = list(EDGE_CASES) + list(CODE) + list(WHITESPACE) + list(CONTROL)
    strings += [" ".join(specials[:3]), "".join(specials[:5]), f"x{specials[0]}y" if specials else "x"]
    strings += [m["content"] for p in prompts for m in p["messages"]]
    strings += [render_chat(p["messages"], chat_format) for p in prompts]
    strings += random_strings(n_random, seed, specials)
    return strings
