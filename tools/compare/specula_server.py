"""`specula serve` for the comparison scripts beside this file: started on a free loopback port,
waited for until /health answers, ended when the `with` block leaves."""
import contextlib
import json
import pathlib
import socket
import subprocess
import threading
import time

import httpx


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(specula, args, model=None):
    """Yields (url, the server's pid) for `specula serve ARGS` (and --model MODEL when given)."""
    port = free_port()
    cmd = [specula, "serve", "--port", str(port), *args]
    if model:
        cmd += ["--model", model]
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
        yield url, srv.pid
    finally:
        srv.terminate()
        srv.wait(timeout=60)


def metric(url, name):
    """The unlabelled sample `name` on the server's /metrics page, as an int."""
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[1]))
    raise RuntimeError(f"no {name} on {url}/metrics")


def describe(xs):
    """n, mean, p50 and p90 of `xs` (milliseconds), rounded to 0.1."""
    xs = sorted(xs)
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "mean": round(sum(xs) / len(xs), 1), "p50": round(xs[len(xs) // 2], 1),
            "p90": round(xs[min(len(xs) - 1, int(0.9 * len(xs)))], 1)}


def add_load_args(ap, root, requests, max_tokens):
    """The options of a script that drives `specula serve` with `specula-load`: the two binaries
    (under `root`/build), the prompt set, sessions, requests and max_tokens."""
    ap.add_argument("--specula", default=str(root / "build" / "specula"))
    ap.add_argument("--load", default=str(root / "build" / "specula-load"))
    ap.add_argument("--prompts", default=str(root.parent / "shared" / "data" / "prompts" / "chat.jsonl"))
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=requests)
    ap.add_argument("--max-tokens", type=int, default=max_tokens)


def load_run(args, serve_args, tmp, prompts=None, specula=None):
    """One closed-loop load from `specula-load` (args.load; args.concurrency sessions, args.requests
    requests of args.max_tokens, greedy) against `SPECULA serve SERVE_ARGS` (default args.specula),
    over the chat endpoint with `prompts` (default args.prompts). Returns tokens/s in all, output tokens, failed
    requests, the server's preemptions, the finish reasons, the most requests running at once
    (/metrics' gauge, sampled every 50 ms), and time to first token and end to end (describe)."""
    with serving(specula or args.specula, serve_args) as (url, _):
        out = pathlib.Path(tmp) / "load.json"
        most = [0]
        done = threading.Event()

        def watch():  # the running gauge's largest value during the load
            while not done.is_set():
                most[0] = max(most[0], metric(url, "specula_requests_running"))
                done.wait(0.05)
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            subprocess.run([args.load, "--url", url + "/v1/chat/completions", "--prompts", str(prompts or args.prompts),
                            "--concurrency", str(args.concurrency), "--requests", str(args.requests),
                            "--max-tokens", str(args.max_tokens), "--temperature", "0", "--quiet", "--out", str(out)],
                           check=True, stdout=subprocess.DEVNULL)
        finally:
            done.set()
            watcher.join()
        run = json.loads(out.read_text())
        ok = [r for r in run["requests"] if r["ok"]]
        return {"tokens_per_s": round(run["summary"]["total_tokens_per_s"], 1),
                "output_tokens": sum(r["output_tokens"] for r in ok),
                "failed": len(run["requests"]) - len(ok),
                "preemptions": metric(url, "specula_preemptions_total"),
                "finish_reasons": {k: sum(1 for r in ok if r["finish_reason"] == k) for k in {r["finish_reason"] for r in ok}},
                "most_running": most[0],
                "ttft_ms": describe([r["ttft_ms"] for r in ok]), "e2e_ms": describe([r["e2e_ms"] for r in ok])}
