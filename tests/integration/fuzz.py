"""A message fuzzer for `specula serve` (issue 15; run by test_fuzz.py): valid WebSocket messages
and OpenAI request bodies, mutated at random with a fixed seed, sent to a real server on loopback.

Mutations: byte flips, inserts, deletes, truncation and repeats; invalid UTF-8 in text frames;
JSON structure (a value replaced by another type, a huge or non-finite number, a long string, deep
nesting; a key dropped, added or duplicated); oversized messages; messages split into WebSocket
fragments; and slow, partial HTTP requests.

The checks, per batch of WebSocket messages: the server answers every message with exactly one
terminal event (an error, or the done of the generation it started) or closes the socket cleanly
(1007 for invalid UTF-8, 1009 beyond the hard limit); HTTP bodies get a 2xx or 4xx (never 5xx) or
a clean close; a probe request after every batch is answered; the process is alive throughout.
The report names the first message after which the server died, if it did.
"""
from __future__ import annotations

import asyncio
import json
import random
import subprocess
import socket
import time
import urllib.parse
from dataclasses import dataclass, field

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

PROMPTS = ["Say hello.", "one two three four five", "Write a haiku about rain.", "Ünïcödé ✓ 日本語", ""]


def valid_ws_message(rng: random.Random, gen_id: str) -> dict:
    m = {"type": "generate", "id": gen_id, "max_tokens": rng.choice([1, 2]), "temperature": rng.choice([0, 0.8, 1.5])}
    if rng.random() < 0.5:
        m["messages"] = [{"role": "user", "content": rng.choice(PROMPTS) or "hi"}]
        if rng.random() < 0.3:
            m["messages"].insert(0, {"role": "system", "content": "Be brief."})
    else:
        m["prompt"] = rng.choice(PROMPTS) or "hi"
    if rng.random() < 0.3:
        m["stop"] = rng.choice(["\n", ["a", "b"], "."])
    if rng.random() < 0.3:
        m["seed"] = rng.randrange(1 << 40)
    if rng.random() < 0.3:
        m["speculation"] = {"k": rng.randint(1, 8), "adaptive": rng.random() < 0.5,
                            "mode": rng.choice(["exact", "block", "coupled"])}
    if rng.random() < 0.2:
        m["top_k"], m["top_p"] = rng.randint(0, 50), rng.choice([0.5, 0.9, 1.0])
    if rng.random() < 0.1:
        m["include_reasoning"] = rng.random() < 0.5
    return m


def valid_http_body(rng: random.Random, chat: bool) -> dict:
    b = {"model": "x", "max_tokens": rng.choice([1, 2]), "temperature": rng.choice([0, 0.7])}
    if chat:
        b["messages"] = [{"role": "user", "content": rng.choice(PROMPTS) or "hi"}]
    else:
        b["prompt"] = rng.choice(PROMPTS) or "hi"
    if rng.random() < 0.3:
        b["stream"] = True
        if rng.random() < 0.5:
            b["stream_options"] = {"include_usage": True}
    if rng.random() < 0.3:
        b["stop"] = ["\n"]
    if chat and rng.random() < 0.2:  # tools, each way of choosing, and a history with a call and its result
        b["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"$ref": "#/$defs/X"}}, "required": ["x"],
            "$defs": {"X": {"type": "string", "maxLength": 8}}}}}]
        b["tool_choice"] = rng.choice(["auto", "required", "none", {"type": "function", "function": {"name": "f"}}])
        if rng.random() < 0.5:
            b["messages"] += [{"role": "assistant", "content": None,
                               "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": "a"}'}}]},
                              {"role": "tool", "tool_call_id": "c", "content": "done"}]
    if not chat and rng.random() < 0.2:
        b["echo"] = True
        b["logprobs"] = rng.choice([0, 2])
        b["max_tokens"] = rng.choice([0, 1])
    if rng.random() < 0.1:
        b["truncate_prompt_tokens"] = rng.choice([1, 4, -1])
    return b


def random_value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if r < 0.12:
        return rng.choice([10**400, -(10**400), 2**64, -(2**63) - 1, 2**53 + 1, 1e308, -1e308, 5e-324])
    if r < 0.2:
        return rng.choice([0, -1, 1, 3, 17, 4096, 10**9])
    if r < 0.28:
        return rng.random() * rng.choice([1, 100, -100])
    if r < 0.36:
        return rng.choice([None, True, False])
    if r < 0.46:
        return "x" * rng.choice([0, 1, 300, 70_000])
    if r < 0.56:
        return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randint(1, 20)))
    if r < 0.66 and depth < 3:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if r < 0.76 and depth < 3:
        return {rng.choice(["type", "id", "x", "role", "content", "k"]): random_value(rng, depth + 1)
                for _ in range(rng.randint(0, 3))}
    return rng.choice(["generate", "cancel", "exact", "coupled", "user", "system", "assistant", ""])


def paths(obj, prefix=()):
    """Every (container, key) in a JSON value."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append((obj, k))
            out.extend(paths(v, prefix + (k,)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.append((obj, i))
            out.extend(paths(v, prefix + (i,)))
    return out


def mutate_structure(rng: random.Random, obj) -> str:
    obj = json.loads(json.dumps(obj))
    for _ in range(rng.randint(1, 3)):
        places = paths(obj)
        if not places:
            break
        container, key = rng.choice(places)
        op = rng.random()
        if op < 0.55:
            container[key] = random_value(rng)
        elif op < 0.75 and isinstance(container, dict):
            del container[key]
        elif isinstance(container, dict):
            container[rng.choice(["zz", "model", "n", "logprobs", "echo", "suffix", "best_of", "tools", "tool_choice",
                                  "tool_calls", "parameters", "$ref", "truncate_prompt_tokens"])] = random_value(rng)
    text = json.dumps(obj, ensure_ascii=rng.random() < 0.5)
    r = rng.random()
    if r < 0.05:  # a duplicated key (JSON allows it; the parser keeps one)
        text = text[:-1] + ', "id": ' + json.dumps(random_value(rng)) + "}" if text.endswith("}") else text
    elif r < 0.10:  # deep nesting inside a field
        depth = rng.choice([100, 600, 10_000])
        text = text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}" if text.endswith("}") else text
    elif r < 0.12:  # numbers JSON forbids
        text = text.replace('"max_tokens": ', '"max_tokens": ' + rng.choice(["NaN", "Infinity", "-0", "1e99999", "0x10"]) + " + ", 1)
    return text


INVALID_UTF8 = [b"\xff", b"\xc3\x28", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82"]


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        if not b:
            b.extend(rng.randbytes(rng.randint(1, 8)))
        elif op < 0.3:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op < 0.5:
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.choice([rng.randbytes(rng.randint(1, 8)), b"{", b"}", b"[", b'"', b"\\", b"\x00", b","])
        elif op < 0.7:
            i = rng.randrange(len(b))
            del b[i:i + rng.randint(1, 16)]
        elif op < 0.85:
            del b[rng.randrange(len(b) + 1):]
        else:
            i, j = sorted(rng.randrange(len(b) + 1) for _ in range(2))
            b[j:j] = b[i:j] * rng.randint(1, 3)
    return bytes(b)


@dataclass
class Report:
    ws_messages: int = 0
    http_requests: int = 0
    slow_requests: int = 0
    kinds: dict = field(default_factory=dict)
    errors_by_code: dict = field(default_factory=dict)
    closes: dict = field(default_factory=dict)
    http_status: dict = field(default_factory=dict)
    crashed_after: str | None = None  # the message (repr, cut) after which the server was gone
    problems: list = field(default_factory=list)

    def count(self, table: dict, key) -> None:
        table[key] = table.get(key, 0) + 1

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


DYING_SECONDS = 10  # how long a server whose connection broke may take to exit


class ServerGone(Exception):
    pass


def ws_payload(rng: random.Random, i: int) -> tuple[str, bytes | str, bool]:
    """(kind, payload, fragmented) for WebSocket message i; str payloads go in text frames as they
    are, bytes in text frames unchecked (they may be invalid UTF-8)."""
    base = valid_ws_message(rng, f"f{i}")
    r = rng.random()
    if r < 0.08:
        return "valid", json.dumps(base), rng.random() < 0.3
    if r < 0.50:
        return "structure", mutate_structure(rng, base), rng.random() < 0.2
    if r < 0.89:  # as text: an invalid UTF-8 sequence is its own kind, sent on a socket of its own
        return "bytes", mutate_bytes(rng, json.dumps(base).encode()).decode("utf-8", errors="replace"), False
    if r < 0.93:
        text = json.dumps(base).encode()
        k = rng.randrange(len(text))
        return "invalid_utf8", text[:k] + rng.choice(INVALID_UTF8) + text[k:], False
    if r < 0.97:
        return "oversized", json.dumps({**base, "prompt": "y" * rng.choice([(1 << 20) + 1, 3 << 20])}), rng.random() < 0.5
    return "nonobject", rng.choice(["[]", "1", '"generate"', "null", "true", " ", "{}"]), False


def fragments(rng: random.Random, text: str) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 4)))) if len(text) > 1 else []
    parts, last = [], 0
    for c in cuts + [len(text)]:
        parts.append(text[last:c])
        last = c
    return parts


async def invalid_utf8_alone(url: str, payload: bytes, report: Report) -> None:
    """A text frame that is not UTF-8, on a socket of its own: the server must close it with 1007."""
    async with connect(url, max_size=None, open_timeout=30, ping_interval=None) as ws:
        await ws.send(payload, text=True)
        try:
            ev = await asyncio.wait_for(ws.recv(), 30)
            report.problems.append(f"invalid UTF-8 {payload[:80]!r} answered {ev[:200]!r} instead of a close")
        except ConnectionClosed as e:
            code = e.rcvd.code if e.rcvd else None
            report.count(report.closes, code)
            if code != 1007:
                report.problems.append(f"invalid UTF-8 {payload[:80]!r}: close {code}, not 1007")


async def fuzz_websocket(url: str, rng: random.Random, n: int, batch: int, alive, report: Report) -> None:
    sent = 0
    probe = 0
    last = None
    while sent < n:
        try:
            async with connect(url, max_size=None, open_timeout=30, ping_interval=None) as ws:
                # Per connection: every message sent gets at most one terminal event, and all but
                # the cancels one (a generation's may come in a later batch, so the counts are
                # cumulative).
                on_socket, cancels, terminal = 0, 0, 0
                while sent < n:
                    for _ in range(min(batch, n - sent)):
                        kind, payload, frag = ws_payload(rng, sent)
                        report.count(report.kinds, kind)
                        last = payload
                        if kind == "invalid_utf8":
                            sent += 1
                            report.ws_messages += 1
                            await invalid_utf8_alone(url, payload, report)
                            continue
                        if (payload if isinstance(payload, bytes) else payload.encode()).find(b"cancel") >= 0:
                            cancels += 1
                        sent += 1
                        on_socket += 1
                        report.ws_messages += 1
                        if frag:
                            await ws.send(fragments(rng, payload))
                        else:
                            await ws.send(payload)
                    probe += 1
                    pid = f"probe{probe}"
                    await ws.send(json.dumps({"type": "generate", "id": pid, "prompt": "hi", "max_tokens": 1,
                                              "temperature": 0}))
                    on_socket += 1
                    probe_seen = False
                    deadline = time.monotonic() + 180
                    while not probe_seen or terminal < on_socket - cancels:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            report.problems.append(f"after message {sent}: {terminal} of {on_socket} messages on "
                                                   f"this socket answered, none more within 180 s")
                            return
                        ev = json.loads(await asyncio.wait_for(ws.recv(), left))
                        if ev.get("type") in ("done", "error"):
                            terminal += 1
                            if ev["type"] == "error":
                                report.count(report.errors_by_code, ev.get("code"))
                                if ev.get("code") == "internal":
                                    report.problems.append(f"internal error: {ev}")
                            if ev.get("id") == pid:
                                probe_seen = True
                    if terminal > on_socket:
                        report.problems.append(f"after message {sent}: {terminal} terminal events for {on_socket} "
                                               f"messages on this socket")
                    if not alive():
                        report.crashed_after = repr(last)[:300]
                        raise ServerGone()
        except ConnectionClosed as e:
            code = e.rcvd.code if e.rcvd else None
            report.count(report.closes, code)
            # A close the protocol does not explain may be a server on its way down (an abort
            # writing its core on a loaded machine): give it a few seconds to be gone.
            if not alive(0 if code in (1007, 1009, 1000, 1001) else DYING_SECONDS):
                report.crashed_after = repr(last)[:300]
                raise ServerGone() from e
            if code not in (1007, 1009, 1000, 1001):
                report.problems.append(f"unexpected close {code} after message {sent}")
        except (OSError, asyncio.TimeoutError, InvalidHandshake) as e:  # InvalidHandshake: it died mid-upgrade
            if not alive(DYING_SECONDS):
                report.crashed_after = repr(last)[:300]
                raise ServerGone() from e
            report.problems.append(f"{type(e).__name__} after message {sent}: {e}")
            return


def fuzz_http(base_url: str, rng: random.Random, n: int, alive, report: Report) -> None:
    with httpx.Client(base_url=base_url, timeout=60) as client:
        for i in range(n):
            chat = rng.random() < 0.6
            body = valid_http_body(rng, chat)
            responses = chat and rng.random() < 0.3  # the same request in the Responses API's spelling
            if responses:
                body["input"] = body.pop("messages")
                if "max_tokens" in body:
                    body["max_output_tokens"] = body.pop("max_tokens")
                if rng.random() < 0.3:  # answered at once, run on, read back or cancelled below
                    body["background"] = True
                    body.pop("stream", None)
                if rng.random() < 0.3:
                    body["include"], body["top_logprobs"] = ["message.output_text.logprobs"], rng.randint(0, 20)
                if rng.random() < 0.2:
                    body["truncation"] = "auto"
            r = rng.random()
            if r < 0.1:
                data = json.dumps(body).encode()
            elif r < 0.55:
                data = mutate_structure(rng, body).encode()
            elif r < 0.9:
                data = mutate_bytes(rng, json.dumps(body).encode())
            else:
                data = json.dumps(body).encode()
                k = rng.randrange(len(data))
                data = data[:k] + rng.choice(INVALID_UTF8) + data[k:]
            path = "/v1/responses" if responses else "/v1/chat/completions" if chat else "/v1/completions"
            report.http_requests += 1
            try:
                res = client.post(path, content=data, headers={"Content-Type": "application/json"})
                report.count(report.http_status, res.status_code)
                if res.status_code >= 500:
                    report.problems.append(f"HTTP {res.status_code} for {data[:200]!r}: {res.text[:200]}")
                if responses and res.status_code == 200 and not res.headers.get("content-type", "").startswith("text/event-stream"):
                    try:
                        kept = res.json().get("id", "")
                    except ValueError:
                        report.problems.append(f"a 200 from {path} that is not JSON: {res.text[:200]}")
                        continue
                    # A kept response read, cancelled or deleted, under its id or a mutated one.
                    rid = kept if rng.random() < 0.7 else urllib.parse.quote(mutate_bytes(rng, kept.encode()), safe="")
                    method, suffix = rng.choice([("GET", ""), ("POST", "/cancel"), ("DELETE", ""), ("GET", "?stream=1")])
                    extra = client.request(method, "/v1/responses/" + rid + suffix)
                    report.count(report.http_status, extra.status_code)
                    if extra.status_code >= 500:
                        report.problems.append(f"HTTP {extra.status_code} for {method} {rid + suffix!r}: {extra.text[:200]}")
            except httpx.HTTPError as e:
                if not alive(DYING_SECONDS):
                    report.crashed_after = repr(data[:300])
                    raise ServerGone() from e
                report.count(report.http_status, type(e).__name__)


def slow_requests(host: str, port: int, rng: random.Random, n: int, alive, report: Report) -> None:
    """Requests sent in pieces with pauses, some abandoned half way: each gets a response or is
    dropped, and the server goes on."""
    body = json.dumps({"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
    full = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    for _ in range(n):
        report.slow_requests += 1
        with socket.create_connection((host, port), timeout=30) as s:
            cut = sorted(rng.sample(range(1, len(full)), 3))
            abandon = rng.random() < 0.4
            pieces = [full[:cut[0]], full[cut[0]:cut[1]], full[cut[1]:cut[2]], full[cut[2]:]]
            for j, piece in enumerate(pieces):
                if abandon and j == 2:
                    break
                s.sendall(piece)
                time.sleep(rng.choice([0.0, 0.05, 0.2]))
            if abandon:
                continue
            data = s.recv(4096)
            if not data.startswith(b"HTTP/1.1 200"):
                report.problems.append(f"slow request answered {data[:60]!r}")
        if not alive():
            report.crashed_after = "a slow request"
            raise ServerGone()


def run(server, seed: int, ws_messages: int, http_requests: int, slow: int, batch: int = 200) -> Report:
    rng = random.Random(seed)
    report = Report()
    def alive(grace: float = 0) -> bool:
        """Whether the server still runs, after waiting up to `grace` seconds for it to exit."""
        try:
            server.proc.wait(timeout=grace)
            return False
        except subprocess.TimeoutExpired:
            return True

    try:
        asyncio.run(fuzz_websocket(server.ws_url, rng, ws_messages, batch, alive, report))
        fuzz_http(server.url, rng, http_requests, alive, report)
        slow_requests("127.0.0.1", server.port, rng, slow, alive, report)
    except ServerGone:
        pass
    return report
