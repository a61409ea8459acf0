"""Time to first token of each turn of a multi-turn chat, with the prefix cache on and off.

Starts `specula serve` (the main job's drafter) once per configuration, in the order given
(default on, off, on, off: each configuration twice, so that the machine's drift shows), and
plays the same greedy conversation against each: a system prompt and eight user turns, each
request carrying the whole history, as an OpenAI client sends it. Prints one JSON object: per
configuration and pass, each turn's prompt tokens, cached prompt tokens and time to the first
streamed token; and the mean of turns 2.. per configuration.

With `--choices N` it plays OpenAI's `n` instead: four requests of n = N choices, each over a
prompt of its own (a long system prompt opened by the request's number, so nothing is shared
between requests), and reports per request the time until every choice has streamed its first
token and until the last choice ended, and the mean of both per configuration.

    build/venv/bin/python tools/compare/prefix_cache_turns.py [--specula build/specula] [--model M] [--choices N]
"""
import argparse
import json
import pathlib
import shlex
import time

import httpx

from specula_server import serving

ROOT = pathlib.Path(__file__).resolve().parents[2]
SYSTEM = ("You are a patient tutor who explains everyday science to curious adults. Answer in a short "
          "paragraph, give one concrete example, and end with a question that invites the learner to think further.")
TURNS = ["Why is the sky blue?", "Then why are sunsets red?", "Does the same thing happen on Mars?",
         "What colour would the sky be on the Moon?", "Why do clouds look white but sometimes grey?",
         "How do rainbows form?", "Why can't I reach the end of a rainbow?", "Summarise what we talked about."]


def stream(client, url, body):
    """POSTs a streamed chat completion; returns each choice's time to its first token (s) and
    text, by index, and the usage."""
    t0 = time.perf_counter()
    first, texts, usage = {}, {}, None
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for ch in chunk.get("choices", []):
                if ch["delta"].get("content"):
                    first.setdefault(ch["index"], time.perf_counter() - t0)
                    texts[ch["index"]] = texts.get(ch["index"], "") + ch["delta"]["content"]
    return first, texts, usage


def play(url, max_tokens):
    messages = [{"role": "system", "content": SYSTEM}]
    turns = []
    with httpx.Client(timeout=300) as c:
        for q in TURNS:
            messages.append({"role": "user", "content": q})
            body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}}
            first, texts, usage = stream(c, url, body)
            text = texts.get(0, "")
            messages.append({"role": "assistant", "content": text})
            turns.append({"prompt_tokens": usage["prompt_tokens"],
                          "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                          "ttft_ms": round(first[0] * 1000, 1), "text": text})
    return turns


def play_choices(url, n, max_tokens):
    out = []
    with httpx.Client(timeout=300) as c:
        for i in range(4):
            system = f"Request {i * 7919 % 1000}. " + " ".join([SYSTEM] * 8)
            body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": TURNS[i]}],
                    "max_tokens": max_tokens, "temperature": 0.8, "seed": i, "n": n, "stream": True,
                    "stream_options": {"include_usage": True}}
            t0 = time.perf_counter()
            first, texts, usage = stream(c, url, body)
            out.append({"prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"],
                        "all_first_tokens_ms": round(max(first.values()) * 1000, 1),
                        "total_ms": round((time.perf_counter() - t0) * 1000, 1),
                        "text": [texts[k] for k in sorted(texts)]})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--specula", default=str(ROOT / "build" / "specula"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--order", default="on,off,on,off")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--choices", type=int, default=0, help="play n = CHOICES requests instead of a chat")
    a = ap.parse_args()
    args = shlex.split((ROOT / "scripts" / "main_job.args").read_text())
    runs = []
    for config in a.order.split(","):
        with serving(a.specula, ["--prefix-cache", config, "--threads", "2", *args], a.model) as (url, _):
            if a.choices:
                runs.append({"prefix_cache": config, "requests": play_choices(url, a.choices, a.max_tokens)})
            else:
                runs.append({"prefix_cache": config, "turns": play(url, a.max_tokens)})
    # Per configuration, the mean of each measure over the requests (n) or the turns from the second (chat).
    items, first, measures = (("requests", 0, {"all_first_tokens_ms": "mean_all_first_tokens_ms", "total_ms": "mean_total_ms",
                                               "prompt_tokens": "mean_prompt_tokens"}) if a.choices else
                              ("turns", 1, {"ttft_ms": "mean_ttft_ms_turns_2_on", "prompt_tokens": "mean_prompt_tokens",
                                            "cached_tokens": "mean_cached_tokens"}))
    texts = {json.dumps([q["text"] for q in r[items]]) for r in runs}
    summary = {}
    for config in sorted({r["prefix_cache"] for r in runs}):
        qs = [q for r in runs if r["prefix_cache"] == config for q in r[items][first:]]
        summary[config] = {name: round(sum(q[key] for q in qs) / len(qs), 1) for key, name in measures.items()}
    for r in runs:
        for q in r[items]:
            del q["text"]
    print(json.dumps({"same_text_in_every_run": len(texts) == 1, "summary": summary, "runs": runs}, indent=1))

if __name__ == "__main__":
    main()
