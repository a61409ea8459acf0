"""Limits and shutdown on servers of their own: the admission limit, SIGTERM and SIGINT draining."""
import asyncio
import json
import signal
import socket
import time

import httpx
import pytest
from websockets.asyncio.client import connect

from conftest import collect, collect_all

GEN = {"type": "generate", "messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 0.8}


def test_requests_beyond_max_batch_plus_max_queue_get_overloaded_and_429(fresh_server):
    srv = fresh_server("--draft", "ngram", "--max-batch", "1", "--max-queue", "1")
    async def main():
        async with connect(srv.ws_url) as ws:
            await ws.send(json.dumps({**GEN, "id": "a", "max_tokens": 300}))
            await ws.send(json.dumps({**GEN, "id": "b", "max_tokens": 300}))
            await ws.send(json.dumps({**GEN, "id": "c", "max_tokens": 4}))
            _, err = await collect(ws, "c")
            assert err["type"] == "error" and err["code"] == "overloaded", err
            r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=30)
            assert r.status_code == 429 and r.json()["error"]["code"] == "overloaded"
            assert r.headers["retry-after"] == "1"
            # More choices than the limit could ever hold is the client's error, not a retry.
            r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "n": 3}, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
            for gen_id in ("a", "b"):
                await ws.send(json.dumps({"type": "cancel", "id": gen_id}))
            _, ends = await collect_all(ws, ["a", "b"])
            assert ends["a"]["type"] == ends["b"]["type"] == "done", ends
            await ws.send(json.dumps({**GEN, "id": "d", "max_tokens": 2}))
            _, done = await collect(ws, "d")
            assert done["type"] == "done", done
    asyncio.run(main())
    assert srv.metrics()['specula_requests_total{outcome="rejected"}'] >= 2


def refuses_connections(port, within=5.0):
    """Whether a new TCP connection to the port is refused (the listener closed) within `within` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_lets_running_generations_finish_refuses_new_work_and_connections_and_exits_zero(fresh_server, sig):
    srv = fresh_server("--draft", "ngram", "--shutdown-timeout", "20")
    async def main():
        async with connect(srv.ws_url) as ws:
            # Long enough to be still running when the late request comes (0.2 s and a connection
            # check after the signal): this greedy story runs past 1,000 tokens, and 40 of them took
            # ~0.1 s once the int8 kernels got faster, so the run ended first and the idle server
            # closed the session before "late" could be refused.
            await ws.send(json.dumps({**GEN, "id": "run", "max_tokens": 400, "temperature": 0}))
            async with asyncio.timeout(30):
                while json.loads(await ws.recv())["type"] != "token":
                    pass
            srv.proc.send_signal(sig)
            await asyncio.sleep(0.2)
            assert await asyncio.to_thread(refuses_connections, srv.port), "the server still accepts connections"
            await ws.send(json.dumps({**GEN, "id": "late", "max_tokens": 4}))
            _, events = await collect_all(ws, ["run", "late"])
            assert events["late"]["type"] == "error" and events["late"]["code"] == "shutting_down", events
            assert events["run"]["type"] == "done" and events["run"]["finish_reason"] in ("length", "stop"), events
    asyncio.run(main())
    assert srv.proc.wait(30) == 0, srv.output()


def test_sigterm_cancels_what_is_still_running_at_the_deadline_and_exits_zero(fresh_server):
    srv = fresh_server("--draft", "ngram", "--shutdown-timeout", "0.5")
    async def main():
        async with connect(srv.ws_url) as ws:
            # Greedy, so that it is still running at the deadline: this story runs past 1,000 tokens
            # (over 3 s), where a sampled one (a random seed) sometimes ended within the 0.5 s once
            # decoding reached ~300 tokens/s.
            await ws.send(json.dumps({**GEN, "id": "long", "max_tokens": 3000, "temperature": 0}))
            async with asyncio.timeout(30):
                while json.loads(await ws.recv())["type"] != "token":
                    pass
            start = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            _, done = await collect(ws, "long")
            assert done["type"] == "done" and done["finish_reason"] == "cancelled", done
            assert time.monotonic() - start < 10
    asyncio.run(main())
    assert srv.proc.wait(30) == 0, srv.output()
