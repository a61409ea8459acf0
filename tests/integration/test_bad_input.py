"""Bad input on the WebSocket: each gets a JSON error with a code and a message, and the socket
and the server keep serving."""
import asyncio
import json
import random
import socket
import string
import time

import httpx
import pytest
from websockets.asyncio.client import connect

from conftest import KV_TOKENS, collect, wait_for

GOOD = {"type": "generate", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}


async def ask(ws, payload):
    """Sends one message and returns the next error event."""
    await ws.send(payload if isinstance(payload, (str, bytes)) else json.dumps(payload))
    async with asyncio.timeout(30):
        while True:
            ev = json.loads(await ws.recv())
            if ev["type"] == "error":
                return ev


async def still_serves(ws, gen_id="after"):
    await ws.send(json.dumps({**GOOD, "id": gen_id}))
    _, done = await collect(ws, gen_id)
    assert done["type"] == "done", done


def expect_error(server, payload, code, param=None, msg_id=None):
    async def main():
        async with connect(server.ws_url, max_size=None) as ws:
            ev = await ask(ws, payload)
            assert ev["code"] == code, ev
            assert ev["message"], ev
            assert ev["id"] == msg_id, ev
            if param is not None:
                assert ev.get("param") == param, ev
            await still_serves(ws)
    asyncio.run(main())


def test_invalid_json_gets_an_invalid_json_error(server):
    expect_error(server, '{"type": "generate", "id": 1,', "invalid_json")


def test_deeply_nested_json_gets_an_invalid_json_error_not_a_crash(server):
    deep = '{"type": "generate", "id": 1, "prompt": ' + "[" * 100000 + "]" * 100000 + "}"
    expect_error(server, deep, "invalid_json")


def test_a_json_value_that_is_not_an_object_gets_an_invalid_json_error(server):
    expect_error(server, "[1, 2, 3]", "invalid_json")


def test_a_binary_message_gets_an_invalid_json_error(server):
    expect_error(server, b"\x00\x01binary", "invalid_json")


def test_an_unknown_message_type_gets_unknown_type(server):
    expect_error(server, {"type": "summon", "id": "u"}, "unknown_type", msg_id="u")


def test_a_message_without_a_type_gets_unknown_type(server):
    expect_error(server, {"id": "u"}, "unknown_type", msg_id="u")


@pytest.mark.parametrize("field,value", [
    ("max_tokens", "12"), ("max_tokens", 1.5), ("temperature", "hot"), ("top_p", [0.5]), ("top_k", 2.5), ("min_p", "low"), ("min_p", 2),
    ("presence_penalty", 3), ("repetition_penalty", -1), ("logit_bias", {"x": 1}),
    ("seed", "x"), ("stop", 5), ("stop", ["ok", 3]), ("messages", "hello"), ("messages", [{"role": "user"}]),
    ("messages", [{"role": "wizard", "content": "x"}]), ("speculation", 4), ("speculation", {"k": "4"}),
    ("speculation", {"adaptive": "yes"}), ("speculation", {"mode": "fast"}),
])
def test_a_field_of_the_wrong_type_gets_invalid_request_naming_the_field(server, field, value):
    ev = {**GOOD, "id": "w", field: value}
    async def main():
        async with connect(server.ws_url) as ws:
            err = await ask(ws, ev)
            assert err["code"] == "invalid_request", err
            assert err["id"] == "w"
            assert err["param"].split("[")[0].split(".")[0] == field, err
            assert field in err["message"] or err["param"] in err["message"], err
            await still_serves(ws)
    asyncio.run(main())


def test_an_id_that_is_neither_string_nor_integer_is_refused(server):
    expect_error(server, {**GOOD, "id": {"a": 1}}, "invalid_request", param="id")


def test_both_prompt_and_messages_are_refused(server):
    expect_error(server, {**GOOD, "id": 3, "prompt": "Hi"}, "invalid_request", msg_id=3)


def test_an_oversized_message_gets_message_too_large_and_the_socket_stays_open(server):
    big = json.dumps({**GOOD, "id": "big", "prompt": "x" * (1 << 20)})
    expect_error(server, big, "message_too_large")


def test_a_prompt_longer_than_the_context_gets_context_length_exceeded(server):
    prompt = "hello " * (KV_TOKENS + 100)
    expect_error(server, {**GOOD, "id": "ctx", "messages": None, "prompt": prompt}, "context_length_exceeded",
                 msg_id="ctx")


@pytest.mark.parametrize("max_tokens", [0, -5, 10**9, 2**70])
def test_max_tokens_of_zero_or_less_or_beyond_the_context_is_refused(server, max_tokens):
    expect_error(server, {**GOOD, "id": "m", "max_tokens": max_tokens}, "invalid_request", param="max_tokens",
                 msg_id="m")


def test_a_negative_temperature_is_refused(server):
    expect_error(server, {**GOOD, "id": "t", "temperature": -0.5}, "invalid_request", param="temperature", msg_id="t")


@pytest.mark.parametrize("top_p", [0, -0.1, 1.5])
def test_top_p_outside_zero_to_one_is_refused(server, top_p):
    expect_error(server, {**GOOD, "id": "p", "top_p": top_p}, "invalid_request", param="top_p", msg_id="p")


@pytest.mark.parametrize("k", [0, 17])
def test_a_draft_length_outside_one_to_sixteen_is_refused(server, k):
    expect_error(server, {**GOOD, "id": "k", "speculation": {"k": k}}, "invalid_request", param="speculation.k",
                 msg_id="k")


def test_a_running_id_used_again_gets_duplicate_id(server):
    async def main():
        async with connect(server.ws_url) as ws:
            await ws.send(json.dumps({**GOOD, "id": "dup", "max_tokens": 200, "temperature": 0.8}))
            err = await ask(ws, {**GOOD, "id": "dup"})
            assert err["code"] == "duplicate_id" and err["id"] == "dup", err
            await ws.send(json.dumps({"type": "cancel", "id": "dup"}))
            _, done = await collect(ws, "dup")
            assert done["type"] == "done"
    asyncio.run(main())


def test_a_client_that_disconnects_mid_stream_returns_its_kv_blocks(server):
    total = server.metrics()["specula_kv_blocks_capacity"]
    async def main():
        ws = await connect(server.ws_url)
        for i in range(3):
            await ws.send(json.dumps({**GOOD, "id": i, "max_tokens": 300, "temperature": 0.9}))
        async with asyncio.timeout(60):
            while json.loads(await ws.recv())["type"] != "token":
                pass
        ws.transport.abort()  # drop the TCP connection without a close frame
    asyncio.run(main())
    assert wait_for(lambda: server.metrics()["specula_kv_blocks_free"] == total, timeout=30), server.metrics()
    m = server.metrics()
    assert m["specula_requests_running"] == 0 and m["specula_requests_waiting"] == 0


def test_a_thousand_malformed_messages_get_a_thousand_errors_while_another_client_is_served(server):
    bad = ["not json", "{}", '{"type": 5}', '{"type": "generate"}', '{"type": "generate", "id": 1, "top_p": 9}',
           "[]", '{"type": "cancel"}', '{"type": "generate", "id": "x", "prompt": "", "max_tokens": 1}']
    async def flood():
        async with connect(server.ws_url) as ws:
            async def reader():
                codes = []
                async with asyncio.timeout(120):
                    while len(codes) < 1000:
                        ev = json.loads(await ws.recv())
                        assert ev["type"] == "error" and ev["message"], ev
                        codes.append(ev["code"])
                return codes
            task = asyncio.create_task(reader())
            for i in range(1000):
                await ws.send(bad[i % len(bad)])
            codes = await task
            assert set(codes) <= {"invalid_json", "unknown_type", "invalid_request"}, set(codes)
            await still_serves(ws)
    async def other():
        async with connect(server.ws_url) as ws:
            for i in range(2):
                await ws.send(json.dumps({**GOOD, "id": f"o{i}", "max_tokens": 8}))
                _, done = await collect(ws, f"o{i}")
                assert done["type"] == "done", done
    async def main():
        await asyncio.gather(flood(), other())
    asyncio.run(main())


def test_an_object_with_more_than_4096_members_gets_invalid_json_on_both_paths(server):
    """An order-keeping reader of a schema's request reads an object's keys in quadratic time: 90,000
    keys beside a schema held the I/O thread for 15 s. Such an object is refused before any reading."""
    junk = "{" + ",".join(f'"k{i}":0' for i in range(90000)) + "}"
    expect_error(server, '{"type": "generate", "id": 1, "prompt": "x", "junk": ' + junk + "}", "invalid_json")
    body = ('{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,'
            '"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"string"}}},"junk":' + junk + "}")
    r = httpx.post(server.url + "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400 and "more than 4096 members" in r.json()["error"]["message"], r.text
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_a_content_part_of_the_wrong_shape_is_a_400_not_a_dropped_connection(server):
    for part in ({"type": 5}, {"type": None, "text": "x"}, 7):
        r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                       json={"messages": [{"role": "user", "content": [part]}], "max_tokens": 1})
        assert r.status_code == 400, r.text
        assert "text parts" in r.json()["error"]["message"], r.text


def test_an_unknown_message_type_is_echoed_shortened(server):
    async def main():
        async with connect(server.ws_url, max_size=None) as ws:
            ev = await ask(ws, {"type": "x" * 100000, "id": "u"})
            assert ev["code"] == "unknown_type" and len(ev["message"]) < 200, ev["message"][:300]
            await still_serves(ws)
    asyncio.run(main())


def test_detokenize_takes_at_most_a_contexts_tokens(server):
    ctx = httpx.post(server.url + "/tokenize", json={"prompt": "hi"}, timeout=10).json()["max_model_len"]
    r = httpx.post(server.url + "/detokenize", json={"tokens": [28] * (ctx + 1)}, timeout=30)
    assert r.status_code == 400 and "(the context)" in r.json()["error"]["message"], r.text
    r = httpx.post(server.url + "/detokenize", json={"tokens": [28] * 3}, timeout=30)
    assert r.status_code == 200, r.text


def test_past_max_connections_a_new_connection_gets_a_503_and_the_server_recovers(fresh_server):
    srv = fresh_server("--draft", "none", "--max-connections", "4")
    idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(4)]
    try:
        assert wait_for(lambda: b"503" in _raw_health(srv), timeout=10), "a fifth connection was served"
        assert b"too many open connections" in _raw_health(srv)
    finally:
        for s in idle:
            s.close()
    assert wait_for(lambda: b"200 OK" in _raw_health(srv), timeout=10)


def _raw_health(srv):
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        try:
            while chunk := s.recv(4096):
                data += chunk
        except (ConnectionResetError, TimeoutError):
            pass
        return data


# Long prompts are templated and tokenized on the server's preparation thread (docs/serving.md,
# "Long prompts"): the I/O thread goes on serving every other connection meanwhile.
LONG = " responsibility" * 1134  # 17 KB of text (past the 16 KB tokenized inline), 1,134 tokens


def health_while_refused(server, message):
    """Sends `message` (refused after long work) on a WebSocket and, 50 ms later, GET /health on
    another connection; returns (the health check's seconds, the refusal's seconds, the refusal)."""
    async def main():
        async with connect(server.ws_url, max_size=None) as ws, httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            assert (await http.get("/health")).status_code == 200  # the connection is open before the clock starts
            start = time.monotonic()
            await ws.send(json.dumps(message))
            await asyncio.sleep(0.05)  # the server has read the message: its work runs
            asked = time.monotonic()
            assert (await http.get("/health")).status_code == 200
            health = time.monotonic() - asked
            async with asyncio.timeout(60):
                ev = json.loads(await ws.recv())
            refused = time.monotonic() - start
            await still_serves(ws)
            return health, refused, ev
    return asyncio.run(main())


def test_a_megabyte_prompt_is_tokenized_while_the_server_answers_other_connections(server):
    rng = random.Random(7)
    big = "".join(rng.choices(string.ascii_lowercase, k=900_000))  # one word: the tokenizer's slowest text
    health, refused, ev = health_while_refused(server, {"type": "generate", "id": "big", "prompt": big, "max_tokens": 1})
    assert ev["type"] == "error" and ev["code"] == "context_length_exceeded", ev
    # On the I/O thread the tokenization held the health check until it ended (0.82 of `refused`
    # when measured); beside it, the check takes milliseconds of a ~0.3 s tokenization.
    assert health < 0.5 * refused, f"/health took {health:.3f} s while the prompt's refusal took {refused:.3f} s"


def test_a_schema_slow_to_compile_is_compiled_while_the_server_answers_other_connections(server):
    props = {f"p{i}": {"type": "integer", "minimum": -123456789, "maximum": 987654321} for i in range(2000)}
    schema = {"type": "object", "properties": props, "required": list(props)}
    health, refused, ev = health_while_refused(server, {**GOOD, "id": "s", "json_schema": schema})
    assert ev["type"] == "error" and ev["code"] == "invalid_request" and "repetitions" in ev["message"], ev
    assert health < 0.5 * refused, f"/health took {health:.3f} s while the schema's refusal took {refused:.3f} s"


def test_a_cancel_or_a_duplicate_id_sent_while_a_long_prompt_is_admitted_is_honoured(server):
    async def main():
        async with connect(server.ws_url) as ws:
            long = {k: v for k, v in GOOD.items() if k != "messages"}
            await ws.send(json.dumps({**long, "id": "long", "prompt": LONG, "max_tokens": 200}))
            await ws.send(json.dumps({**GOOD, "id": "long"}))
            await ws.send(json.dumps({"type": "cancel", "id": "long"}))
            events = []
            async with asyncio.timeout(60):
                while not events or events[-1]["type"] not in ("done",):
                    events.append(json.loads(await ws.recv()))
            errors = [e for e in events if e["type"] == "error"]
            assert [e["code"] for e in errors] == ["duplicate_id"] and errors[0]["id"] == "long", events
            done = events[-1]
            assert done["id"] == "long" and done["finish_reason"] == "cancelled", done
            assert done["stats"]["prompt_tokens"] > 1100, done
            await still_serves(ws)
    asyncio.run(main())


def test_a_long_prompt_counts_the_same_tokens_in_tokenize_and_in_a_completion(server):
    count = httpx.post(server.url + "/tokenize", json={"prompt": LONG}, timeout=60).json()["count"]
    assert count > 1100
    r = httpx.post(server.url + "/v1/completions", json={"prompt": LONG, "max_tokens": 1, "temperature": 0}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == count
    n = httpx.post(server.url + "/v1/completions", json={"prompt": LONG, "max_tokens": 1, "temperature": 0, "n": 3},
                   timeout=120)
    assert n.status_code == 200 and len(n.json()["choices"]) == 3, n.text


def test_a_priority_on_a_server_that_serves_first_come_first_served_is_refused_naming_it(server):
    expect_error(server, {**GOOD, "id": "p", "priority": 2}, "invalid_request", param="priority", msg_id="p")
    expect_error(server, {**GOOD, "id": "q", "priority": "urgent"}, "invalid_request", param="priority", msg_id="q")


def test_long_messages_and_bodies_parsed_off_the_io_thread_are_served_or_refused_as_short_ones(server):
    # Past 16 KB (net/generation.h, kInlineJsonBytes) the JSON is read on the preparation thread.
    filler = {"metadata": {"items": [{"k": i, "v": "abc"} for i in range(8000)]}}
    assert len(json.dumps(filler)) > 64 * 1024
    broken = json.dumps({**GOOD, **filler})[:-2]
    expect_error(server, broken, "invalid_json")
    expect_error(server, json.dumps([GOOD] * 800), "invalid_json")  # not an object

    async def main():  # a long valid message on a socket is answered, and read before the next
        async with connect(server.ws_url, max_size=None) as ws:
            await ws.send(json.dumps({**GOOD, "id": "long", "max_tokens": 2000, "ignore_eos": True, **filler}))
            # Read in order, this cancel finds "long" being admitted or running; read first, it
            # would find nothing to cancel and "long" would run its 2,000 tokens.
            await ws.send(json.dumps({"type": "cancel", "id": "long"}))
            await ws.send(json.dumps({**GOOD, "id": "short"}))
            ends = {}
            async with asyncio.timeout(60):
                while len(ends) < 2:
                    ev = json.loads(await ws.recv())
                    if ev["type"] in ("done", "error"):
                        ends[ev["id"]] = ev
            assert ends["long"]["type"] == "done" and ends["long"]["finish_reason"] == "cancelled", ends["long"]
            assert ends["short"]["type"] == "done" and ends["short"]["finish_reason"] in ("stop", "length"), ends["short"]
    asyncio.run(main())
    body = {"prompt": "Hi", "max_tokens": 2, "temperature": 0, **filler}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] is not None, r.text[:300]
    r = httpx.post(server.url + "/v1/completions", content=json.dumps(body)[:-1], timeout=60,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text[:300]
    r = httpx.post(server.url + "/tokenize", content=json.dumps({"prompt": "x" * 100_000}), timeout=60)
    assert r.status_code == 200 and r.json()["count"] > 0, r.text[:300]
