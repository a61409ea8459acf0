"""What a long prompt's prefill does to a request already streaming, by --ubatch-size.

Starts `specula serve` (the main job's drafter, scripts/main_job.args) once per configuration, in
the order given (default 512, 8192, 512, 8192: each twice, so that the machine's drift shows;
8192 is more than any prompt here, so its prefill is one forward, as before prefill in pieces).
In each, request A (a short chat prompt, greedy, 200 tokens) streams; after A's tenth streamed
chunk request B arrives, a prompt of about 3,600 tokens (greedy, 16 tokens). Reported per run:
A's longest gap between two streamed chunks while B's prompt went in (from B's send to B's first
token) and A's chunks in that window, B's time to its first token, A's whole time, the server's
resident memory after both (VmRSS: the forward's scratch is kept at the widest forward run), and
whether A's and B's texts equal those of every other run. Prints one JSON object.

    build/venv/bin/python tools/compare/prefill_stall.py [--specula build/specula] [--order 512,8192,512,8192]
"""
import argparse
import json
import pathlib
import shlex
import threading
import time

import httpx

from specula_server import serving

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHORT = "Explain in a few paragraphs how a mechanical clock keeps time, from the spring to the hands."
ROOMS = ["the east hall", "the tower room", "the library", "the long gallery", "the workshop", "the chapel"]
MAKERS = ["Harrison", "Breguet", "Tompion", "Knibb", "Graham", "Mudge", "Arnold", "Earnshaw"]


def long_prompt(notes):
    lines = [f"Note {i}: the clock in {ROOMS[i % len(ROOMS)]} by {MAKERS[i * 5 % len(MAKERS)]} was made in "
             f"{1650 + (i * 37) % 250} and was last repaired in {1900 + (i * 13) % 120}; it runs {i % 7 + 1} days "
             f"on one winding." for i in range(notes)]
    return "Here are the museum's notes on its clocks.\n" + "\n".join(lines) + \
        "\nWhich clock is the oldest, and who made it? Answer in one sentence."


def stream(url, body, stamps, texts, key, started=None):
    """Streams a chat completion on a connection of its own, appending each content chunk's
    arrival time to stamps[key] and its text to texts[key]; sets `started` once the tenth chunk came."""
    with httpx.Client(timeout=600) as client, client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                texts[key + "_usage"] = chunk["usage"]
            for ch in chunk.get("choices", []):
                if ch["delta"].get("content"):
                    stamps[key].append(time.perf_counter())
                    texts[key] = texts.get(key, "") + ch["delta"]["content"]
                    if started is not None and len(stamps[key]) == 10:
                        started.set()


def rss_mb(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def run(url, pid, notes):
    stamps, texts = {"a": [], "b": []}, {}
    opts = {"temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    # Warm-up: the first request of a server pays for first touches.
    httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
               timeout=600)
    started = threading.Event()
    a = threading.Thread(target=stream, args=(url, {"messages": [{"role": "user", "content": SHORT}], "max_tokens": 200,
                                                    **opts}, stamps, texts, "a", started))
    t_a = time.perf_counter()
    a.start()
    started.wait(600)
    t_b = time.perf_counter()
    stream(url, {"messages": [{"role": "user", "content": long_prompt(notes)}], "max_tokens": 16, **opts}, stamps, texts, "b")
    a.join()
    b_first = stamps["b"][0]
    window = [t for t in stamps["a"] if t_b <= t <= b_first]
    before = [t for t in stamps["a"] if t < t_b][-1:]
    after = [t for t in stamps["a"] if t > b_first][:1]
    edges = before + window + after  # A's chunks around and inside B's prefill
    gaps = [y - x for x, y in zip(edges, edges[1:])]
    return {"b_prompt_tokens": texts["b_usage"]["prompt_tokens"],
            "b_ttft_ms": round((b_first - t_b) * 1000, 1),
            "a_chunks_during_b_prefill": len(window),
            "a_longest_gap_ms": round(max(gaps) * 1000, 1) if gaps else None,
            "a_total_ms": round((stamps["a"][-1] - t_a) * 1000, 1),
            "rss_mb_after": rss_mb(pid),
            "texts": [texts["a"], texts["b"]]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--specula", default=str(ROOT / "build" / "specula"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--order", default="512,8192,512,8192")
    ap.add_argument("--notes", type=int, default=100, help="lines of the long prompt (~36 tokens each)")
    a = ap.parse_args()
    args = shlex.split((ROOT / "scripts" / "main_job.args").read_text())
    runs = []
    for ubatch in a.order.split(","):
        with serving(a.specula, ["--threads", "2", "--ubatch-size", ubatch, *args], a.model) as (url, pid):
            runs.append({"ubatch_size": int(ubatch), **run(url, pid, a.notes)})
    texts = {json.dumps(r.pop("texts")) for r in runs}
    summary = {}
    for u in sorted({r["ubatch_size"] for r in runs}):
        rs = [r for r in runs if r["ubatch_size"] == u]
        summary[u] = {k: round(sum(r[k] for r in rs) / len(rs), 1)
                      for k in ("a_longest_gap_ms", "a_chunks_during_b_prefill", "b_ttft_ms", "a_total_ms", "rss_mb_after")}
    print(json.dumps({"same_text_in_every_run": len(texts) == 1, "summary": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
