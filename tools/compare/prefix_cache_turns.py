"""Time to first token of each turn of a multi-turn chat, with the prefix cache on and off.

Starts `specula serve` (the main job's drafter) once per configuration, in the order given
(default on, off, on, off: each configuration twice, so that the machine's drift shows), and
plays the same greedy conversation against each: a system prompt and eight user turns, each
request carrying the whole history, as an OpenAI client sends it. Prints one JSON object: per
configuration and pass, each turn's prompt tokens, cached prompt tokens and time to the first
streamed token; and the mean of turns 2.. per configuration.

    build/venv/bin/python tools/compare/prefix_cache_turns.py [--specula build/specula] [--model M]
"""
import argparse
import json
import pathlib
import shlex
import socket
import subprocess
import time

import httpx

ROOT = pathlib.Path(__file__).resolve().parents[2]
SYSTEM = ("You are a patient tutor who explains everyday science to curious adults. Answer in a short "
          "paragraph, give one concrete example, and end with a question that invites the learner to think further.")
TURNS = ["Why is the sky blue?", "Then why are sunsets red?", "Does the same thing happen on Mars?",
         "What colour would the sky be on the Moon?", "Why do clouds look white but sometimes grey?",
         "How do rainbows form?", "Why can't I reach the end of a rainbow?", "Summarise what we talked about."]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def play(url, max_tokens):
    messages = [{"role": "system", "content": SYSTEM}]
    turns = []
    with httpx.Client(timeout=300) as c:
        for q in TURNS:
            messages.append({"role": "user", "content": q})
            body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}}
            t0 = time.perf_counter()
            ttft, text, usage = None, "", None
            with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for ch in chunk.get("choices", []):
                        if ch["delta"].get("content"):
                            ttft = ttft or time.perf_counter() - t0
                            text += ch["delta"]["content"]
            messages.append({"role": "assistant", "content": text})
            turns.append({"prompt_tokens": usage["prompt_tokens"],
                          "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                          "ttft_ms": round(ttft * 1000, 1), "text": text})
    return turns


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--specula", default=str(ROOT / "build" / "specula"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--order", default="on,off,on,off")
    ap.add_argument("--max-tokens", type=int, default=96)
    a = ap.parse_args()
    args = shlex.split((ROOT / "scripts" / "main_job.args").read_text())
    runs = []
    for config in a.order.split(","):
        port = free_port()
        cmd = [a.specula, "serve", "--port", str(port), "--prefix-cache", config, "--threads", "2", *args]
        if a.model:
            cmd += ["--model", a.model]
        srv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            runs.append({"prefix_cache": config, "turns": play(url, a.max_tokens)})
        finally:
            srv.terminate()
            srv.wait(timeout=60)
    texts = {tuple(t["text"] for t in r["turns"]) for r in runs}
    summary = {}
    for config in sorted({r["prefix_cache"] for r in runs}):
        later = [t for r in runs if r["prefix_cache"] == config for t in r["turns"][1:]]
        summary[config] = {"mean_ttft_ms_turns_2_on": round(sum(t["ttft_ms"] for t in later) / len(later), 1),
                           "mean_prompt_tokens": round(sum(t["prompt_tokens"] for t in later) / len(later), 1),
                           "mean_cached_tokens": round(sum(t["cached_tokens"] for t in later) / len(later), 1)}
    for r in runs:
        for t in r["turns"]:
            del t["text"]
    print(json.dumps({"same_text_in_every_run": len(texts) == 1, "summary": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
