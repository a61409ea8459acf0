"""`specula serve` for the comparison scripts beside this file: started on a free loopback port,
waited for until /health answers, ended when the `with` block leaves."""
import contextlib
import socket
import subprocess
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
