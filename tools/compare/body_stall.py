"""What large request bodies do to a request already streaming: the JSON parse of a body of more
than kInlineJsonBytes (net/generation.h) runs on the preparation thread since the seventy-sixth
session, so the I/O thread keeps writing other requests' tokens while a megabyte is read.

Starts `specula serve --draft none` once. Request A (a completion, greedy, `ignore_eos`, 700 tokens)
streams; after its twentieth chunk, BODIES requests of about a megabyte each (a completion of two
tokens whose ignored `metadata` field holds an array of small objects, the costly shape for a JSON
reader) are posted one after another. Reported: A's gaps between streamed chunks while the bodies
went in and before them (median, 99th percentile, largest, in ms), and the bodies' own times.
Prints one JSON object.

    build/venv/bin/python tools/compare/body_stall.py [--specula build/specula] [--bodies 20]
"""
import argparse
import json
import pathlib
import statistics
import threading
import time

import httpx

from specula_server import serving

ROOT = pathlib.Path(__file__).resolve().parents[2]


def big_body(target_bytes=1_000_000):
    items, size, i = [], 0, 0
    while size < target_bytes - 200:
        item = {"k": i, "v": "abc", "w": [1, 2.5, True]}
        size += len(json.dumps(item, separators=(",", ":"))) + 1
        items.append(item)
        i += 1
    return json.dumps({"prompt": "Hi", "max_tokens": 2, "temperature": 0, "metadata": {"items": items}},
                      separators=(",", ":")).encode()


def gaps_ms(stamps):
    return [(b - a) * 1000 for a, b in zip(stamps, stamps[1:])]


def summary(gaps):
    if not gaps:
        return {}
    s = sorted(gaps)
    return {"chunks": len(gaps), "median_ms": round(statistics.median(s), 2),
            "p99_ms": round(s[min(len(s) - 1, int(0.99 * len(s)))], 2), "max_ms": round(s[-1], 2)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--specula", default=str(ROOT / "build" / "specula"))
    ap.add_argument("--model", default=str(pathlib.Path.home() / ".cache/specula/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--bodies", type=int, default=20)
    args = ap.parse_args()
    body = big_body()
    stamps, window, body_s = [], {}, []
    started = threading.Event()
    with serving(args.specula, ["--draft", "none", "--max-batch", "4", "--kv-tokens", "4096"], args.model) as (url, _):
        def stream():
            req = {"prompt": "Count from one to one thousand:", "max_tokens": 700, "temperature": 0, "ignore_eos": True,
                   "stream": True}
            with httpx.Client(timeout=600) as c, c.stream("POST", url + "/v1/completions", json=req) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        stamps.append(time.perf_counter())
                        if len(stamps) == 20:
                            started.set()

        a = threading.Thread(target=stream)
        a.start()
        started.wait(120)
        window["start"] = time.perf_counter()
        with httpx.Client(timeout=120, headers={"Content-Type": "application/json"}) as c:
            for _ in range(args.bodies):
                t = time.perf_counter()
                r = c.post(url + "/v1/completions", content=body)
                assert r.status_code == 200, r.text[:300]
                body_s.append(time.perf_counter() - t)
        window["end"] = time.perf_counter()
        a.join()
    inside = [s for s in stamps if window["start"] <= s <= window["end"]]
    before = [s for s in stamps if s < window["start"]]
    print(json.dumps({"body_bytes": len(body), "bodies": args.bodies,
                      "body_ms": summary([x * 1000 for x in body_s]),
                      "stream_gaps_while_bodies": summary(gaps_ms(inside)),
                      "stream_gaps_before": summary(gaps_ms(before)),
                      "stream_chunks": len(stamps)}, indent=1))


if __name__ == "__main__":
    main()
