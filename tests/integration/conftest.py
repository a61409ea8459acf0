"""Fixtures of the integration suite: a real `specula serve` on a free loopback port with the
default model, and small clients for its WebSocket protocol and /metrics."""
import json
import os
import pathlib
import re
import shlex
import signal
import socket
import subprocess
import time

import httpx
import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("SPECULA_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2]))
BUILD_DIR = pathlib.Path(os.environ.get("SPECULA_BUILD_DIR", SOURCE_DIR / "build"))
CACHE_DIR = pathlib.Path(os.environ.get("SPECULA_CACHE", pathlib.Path.home() / ".cache" / "specula"))
SPECULA_BIN = pathlib.Path(os.environ.get("SPECULA_BIN", BUILD_DIR / "specula"))
DEFAULT_MODEL = CACHE_DIR / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# The main job's drafting flags, as scripts/run.sh passes them to `specula serve`.
MAIN_JOB_ARGS = shlex.split((SOURCE_DIR / "scripts" / "main_job.args").read_text())
# A small KV pool keeps the context short (prompt-too-long tests stay cheap) and the server light.
KV_TOKENS = 4096


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A running `specula serve` process."""

    def __init__(self, args, log_path, binary=SPECULA_BIN, port=None):
        assert binary.exists(), f"build the specula program first: {binary} is missing"
        assert DEFAULT_MODEL.exists(), f"run scripts/setup.sh to fetch the default model into {DEFAULT_MODEL}"
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/v1/ws"
        self.log_path = log_path
        self.log = open(log_path, "w")
        cmd = [str(binary), "serve", "--model", str(DEFAULT_MODEL), "--host", "127.0.0.1",
               "--port", str(self.port), "--kv-tokens", str(KV_TOKENS), *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, f"specula serve exited early:\n{self.output()}"
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"specula serve did not become healthy:\n{self.output()}"
            time.sleep(0.1)

    def output(self):
        self.log.flush()
        return pathlib.Path(self.log_path).read_text()

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def metrics(self):
        return parse_metrics(httpx.get(self.url + "/metrics", timeout=10).text)


def parse_metrics(text):
    """Prometheus text -> {'name{labels}': value}; checks every line has the format's shape."""
    out = {}
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?) (\S+)$')  # label values may hold braces
    for line in text.splitlines():
        if not line or line.startswith("#"):
            assert line == "" or line.startswith("# HELP ") or line.startswith("# TYPE "), line
            continue
        m = sample.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        out[m.group(1)] = float(m.group(3))
    return out


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    srv = Server(["--draft", "ngram", "--max-batch", "8", "--max-queue", "32"],
                 tmp_path_factory.mktemp("serve") / "serve.log")
    yield srv
    assert srv.stop() == 0, srv.output()


@pytest.fixture
def fresh_server(tmp_path):
    """A server of its own, for tests that end it."""
    servers = []

    def start(*args):
        srv = Server(list(args), tmp_path / f"serve{len(servers)}.log")
        servers.append(srv)
        return srv
    yield start
    for srv in servers:
        srv.stop(signal.SIGKILL)


def wait_for(predicate, timeout=20.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


async def collect(ws, gen_id, timeout=60):
    """Reads until the generation `gen_id` ends; returns (token events, the terminal event)."""
    import asyncio
    tokens = []
    async with asyncio.timeout(timeout):
        while True:
            ev = json.loads(await ws.recv())
            if ev.get("id") != gen_id:
                continue
            if ev["type"] == "token":
                tokens.append(ev)
            else:
                return tokens, ev


async def collect_all(ws, ids, timeout=60):
    """Reads until every generation in `ids` ends; returns ({id: text}, {id: terminal event})."""
    import asyncio
    texts, ends = {i: "" for i in ids}, {}
    async with asyncio.timeout(timeout):
        while len(ends) < len(ids):
            ev = json.loads(await ws.recv())
            if ev.get("id") not in texts:
                continue
            if ev["type"] == "token":
                texts[ev["id"]] += ev["text"]
            else:
                ends[ev["id"]] = ev
    return texts, ends
