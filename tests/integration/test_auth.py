"""API keys and WebSocket origins (docs/serving.md, "API keys and origins") against a real server:
the key is required as a bearer token on the API routes, /metrics and the WebSocket upgrade (or as
the chat page's subprotocol); /health and the page stay open; a cross-site WebSocket is refused;
the chat page asks for the key once and chats with it; pages of the origins --allowed-origins lists
may call the HTTP routes (CORS), in a real browser too, and other origins may not."""
import asyncio
import base64
import functools
import http.server
import json
import shutil
import signal
import subprocess
import threading

import httpx
import openai
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from conftest import SPECULA_BIN, Server, collect, wait_for

KEY = "sk-test-0123456789abcdef"


def key_protocol(key):
    return "specula.key." + base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    srv = Server(["--draft", "ngram", "--api-key", KEY], tmp_path_factory.mktemp("auth") / "serve.log")
    yield srv
    assert srv.stop() == 0, srv.output()


def chat_body():
    return {"model": "x", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}


def test_the_server_says_on_start_that_a_key_is_required(keyed):
    assert "an API key is required on /v1/* and /metrics" in keyed.output()


def test_api_routes_and_metrics_refuse_a_missing_or_wrong_key_with_401(keyed):
    for method, path, body in [("POST", "/v1/chat/completions", chat_body()), ("GET", "/v1/models", None),
                               ("GET", "/metrics", None), ("POST", "/tokenize", {"prompt": "hi"}),
                               ("POST", "/detokenize", {"tokens": [1]})]:
        r = httpx.request(method, keyed.url + path, json=body, timeout=30)
        assert r.status_code == 401, (path, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "missing_api_key"
        for wrong in ["Bearer sk-wrong", "Bearer " + KEY[:-1], "Basic " + KEY, "Bearer " + KEY + "x"]:
            r = httpx.request(method, keyed.url + path, json=body, headers={"Authorization": wrong}, timeout=30)
            assert r.status_code == 401, (path, wrong, r.text)
            assert r.json()["error"]["code"] in ("invalid_api_key",), r.text


def test_the_right_key_opens_the_api_and_metrics_and_health_and_the_page_stay_open(keyed):
    auth = {"Authorization": "Bearer " + KEY}
    r = httpx.post(keyed.url + "/v1/chat/completions", json=chat_body(), headers=auth, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] is not None
    assert httpx.get(keyed.url + "/metrics", headers=auth, timeout=30).status_code == 200
    assert httpx.post(keyed.url + "/tokenize", json={"prompt": "hi"}, headers=auth, timeout=30).status_code == 200
    assert httpx.get(keyed.url + "/health", timeout=30).status_code == 200
    assert httpx.get(keyed.url + "/", timeout=30).status_code == 200


def test_the_openai_client_library_works_with_the_key_and_fails_without(keyed):
    import openai
    ok = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY)
    out = ok.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert out.choices[0].finish_reason in ("stop", "length")
    bad = openai.OpenAI(base_url=keyed.url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)


def test_the_websocket_upgrade_needs_the_key_as_a_header_or_the_subprotocol(keyed):
    async def generate(ws):
        await ws.send(json.dumps({"type": "generate", "id": "a", "prompt": "Hello", "max_tokens": 3, "temperature": 0}))
        tokens, done = await collect(ws, "a")
        assert done["type"] == "done", done

    async def main():
        with pytest.raises(InvalidStatus) as no_key:
            async with connect(keyed.ws_url):
                pass
        assert no_key.value.response.status_code == 401
        with pytest.raises(InvalidStatus) as wrong:
            async with connect(keyed.ws_url, additional_headers={"Authorization": "Bearer nope"}):
                pass
        assert wrong.value.response.status_code == 401
        with pytest.raises(InvalidStatus) as wrong_protocol:
            async with connect(keyed.ws_url, subprotocols=["specula", key_protocol("nope")]):
                pass
        assert wrong_protocol.value.response.status_code == 401
        async with connect(keyed.ws_url, additional_headers={"Authorization": "Bearer " + KEY}) as ws:
            await generate(ws)
        async with connect(keyed.ws_url, subprotocols=["specula", key_protocol(KEY)]) as ws:
            assert ws.subprotocol == "specula"
            await generate(ws)
    asyncio.run(main())


def test_a_cross_site_websocket_is_refused_and_the_served_origin_or_a_listed_one_is_not(keyed, fresh_server):
    auth = {"Authorization": "Bearer " + KEY}

    async def status(url, origin, headers):
        try:
            async with connect(url, origin=origin, additional_headers=headers):
                return 101
        except InvalidStatus as e:
            return e.response.status_code

    async def main():
        assert await status(keyed.ws_url, "http://evil.example", auth) == 403
        assert await status(keyed.ws_url, f"http://127.0.0.1:{keyed.port}", auth) == 101
        assert await status(keyed.ws_url, None, auth) == 101  # not a browser: no Origin
        listed = fresh_server("--draft", "none", "--allowed-origins", "https://chat.example.org")
        assert await status(listed.ws_url, "https://chat.example.org", {}) == 101
        assert await status(listed.ws_url, "http://evil.example", {}) == 403
    asyncio.run(main())


def test_without_a_key_the_server_says_it_listens_on_loopback_only(fresh_server):
    srv = fresh_server("--draft", "none")
    assert "no API key, so listening on loopback only" in srv.output()
    assert httpx.get(srv.url + "/v1/models", timeout=30).status_code == 200
    # A page of another site may still post a "simple" request (text/plain, no preflight) to a
    # server on the user's machine: the Origin it carries refuses it; the server's own page is not.
    body = json.dumps({"prompt": "Hi", "max_tokens": 2})
    for origin, status in [("http://evil.example", 403), (f"http://127.0.0.1:{srv.port}", 200)]:
        r = httpx.post(srv.url + "/v1/completions", content=body, headers={"Origin": origin, "Content-Type": "text/plain"},
                       timeout=30)
        assert r.status_code == status, (origin, r.text)
    assert r.json()["choices"][0]["text"] is not None


def test_the_chat_page_asks_for_the_key_once_and_chats_with_it(keyed):
    from playwright.sync_api import sync_playwright
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: run scripts/setup.sh --tests"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            asked = []

            def answer(dialog):
                asked.append(dialog.message)
                dialog.accept("wrong-key" if len(asked) == 1 else KEY)
            page.on("dialog", answer)
            page.goto(keyed.url + "/")
            page.wait_for_selector("#conn.ok", timeout=15000)
            assert len(asked) == 2 and "refused" in asked[1], asked
            page.fill("#max_tokens", "6")
            page.fill("#prompt", "Hello")
            page.click("#send")
            page.wait_for_selector(".msg.assistant .stats", timeout=60000)
            page.reload()  # the key is kept for the session: no question this time
            page.wait_for_selector("#conn.ok", timeout=15000)
            assert len(asked) == 2, asked
        finally:
            browser.close()


SITE = "https://chat.example.org"


def test_a_listed_origin_gets_cors_headers_and_its_preflight_and_another_origin_does_not(keyed, fresh_server):
    srv = fresh_server("--draft", "none", "--api-key", KEY, "--allowed-origins", SITE)
    auth = {"Authorization": "Bearer " + KEY}
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.options("/v1/chat/completions", headers={"Origin": SITE, **preflight})
        assert r.status_code == 204, r.text
        assert r.headers["access-control-allow-origin"] == SITE and r.headers["vary"] == "Origin"
        assert "POST" in r.headers["access-control-allow-methods"]
        assert r.headers["access-control-allow-headers"] == "authorization,content-type"
        assert r.headers["access-control-max-age"] == "600"
        r = c.options("/v1/chat/completions", headers={"Origin": "http://evil.example", **preflight})
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_origin", r.text
        assert "access-control-allow-origin" not in r.headers
        r = c.options("/v1/models")  # not a browser: what the route takes
        assert r.status_code == 204 and "POST" in r.headers["allow"] and "access-control-allow-origin" not in r.headers
        # The listed origin reads every answer, a 401 included; another origin is refused, without a grant.
        for headers, status in [({"Origin": SITE, **auth}, 200), ({"Origin": SITE}, 401), ({"Origin": "http://evil.example", **auth}, 403)]:
            r = c.get("/v1/models", headers=headers)
            assert r.status_code == status, r.text
            assert r.headers.get("access-control-allow-origin") == (SITE if headers["Origin"] == SITE else None), headers
            assert r.headers.get("vary") == "Origin", headers  # granted or not: caches keep one copy an Origin
        r = c.get("/v1/models", headers=auth)  # no Origin: no grant, but the answer still varies by it
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers and r.headers["vary"] == "Origin"
        r = c.post("/v1/completions", headers={"Origin": SITE, **auth}, json={"prompt": "Hi", "max_tokens": 3})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == SITE
        with c.stream("POST", "/v1/completions", headers={"Origin": SITE, **auth},
                      json={"prompt": "Hi", "max_tokens": 3, "stream": True}) as r:
            assert r.status_code == 200 and r.headers["access-control-allow-origin"] == SITE
            assert "[DONE]" in "".join(r.iter_text())
    # A body past the limit is refused before it is read, with the grant, so the page reads why.
    r = httpx.post(srv.url + "/v1/completions", headers={"Origin": SITE, **auth, "Content-Type": "application/json"},
                   content=b"{" + b" " * (2 << 20) + b"}", timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "message_too_large", r.text
    assert r.headers["access-control-allow-origin"] == SITE
    # A server that lists no origin grants none, and its answers do not vary by Origin.
    r = httpx.options(keyed.url + "/v1/chat/completions", headers={"Origin": SITE, **preflight}, timeout=30)
    assert r.status_code == 403 and "--allowed-origins" in r.text, r.text
    assert "vary" not in r.headers
    r = httpx.get(keyed.url + "/v1/models", headers={"Authorization": "Bearer " + KEY, "Origin": SITE}, timeout=30)
    assert "vary" not in r.headers and "access-control-allow-origin" not in r.headers


@pytest.fixture
def other_site(tmp_path):
    """A page served from another origin (a plain HTTP server on a port of its own)."""
    (tmp_path / "index.html").write_text("<!doctype html><title>another site</title><p>elsewhere</p>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{site.server_address[1]}"
    site.shutdown()


FETCH = """async ([url, key]) => {
  try {
    const r = await fetch(url + "/v1/completions", {method: "POST",
      headers: {"Authorization": "Bearer " + key, "Content-Type": "application/json"},
      body: JSON.stringify({prompt: "Once upon a time", max_tokens: 4, temperature: 0, stream: true})});
    return {status: r.status, body: await r.text()};
  } catch (e) {
    return {error: String(e)};
  }
}"""


def test_a_page_of_a_listed_origin_streams_a_completion_in_a_browser_and_another_origins_page_cannot(
        keyed, fresh_server, other_site):
    from playwright.sync_api import sync_playwright
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: run scripts/setup.sh --tests"
    srv = fresh_server("--draft", "none", "--api-key", KEY, "--allowed-origins", other_site)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(other_site + "/")
            got = page.evaluate(FETCH, [srv.url, KEY])
            assert got.get("status") == 200, got
            assert got["body"].count("data: ") >= 3 and got["body"].rstrip().endswith("data: [DONE]"), got
            # The same page against a server that does not list its origin: the preflight is
            # refused and the browser keeps the answer from the page.
            refused = page.evaluate(FETCH, [keyed.url, KEY])
            assert "error" in refused and "Failed to fetch" in refused["error"], refused
        finally:
            browser.close()


def test_every_key_of_an_api_key_file_opens_the_api_and_another_does_not(fresh_server, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# team a\nsk-team-a-1111\n\n  sk-team-b-2222  \n#sk-commented-out\n")
    srv = fresh_server("--draft", "none", "--api-key", KEY, "--api-key-file", str(keys))
    assert "(3 keys accepted; SIGHUP reads --api-key-file again)" in srv.output()
    for key, status in [(KEY, 200), ("sk-team-a-1111", 200), ("sk-team-b-2222", 200), ("sk-commented-out", 401),
                        ("sk-team-a-111", 401), ("# team a", 401)]:
        r = httpx.get(srv.url + "/v1/models", headers={"Authorization": "Bearer " + key}, timeout=30)
        assert r.status_code == status, (key, r.text)

    async def main():  # the chat page's way: the key as a subprotocol
        async with connect(srv.ws_url, subprotocols=["specula", key_protocol("sk-team-b-2222")]) as ws:
            assert ws.subprotocol == "specula"
    asyncio.run(main())


def test_a_kept_response_is_the_keys_that_made_it_and_to_another_key_is_not_there(fresh_server, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("sk-team-b-2222\n")
    srv = fresh_server("--draft", "none", "--api-key", KEY, "--api-key-file", str(keys))
    a, b = (openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=60) for key in (KEY, "sk-team-b-2222"))
    made = a.responses.create(model="x", input="My name is Ada.", max_output_tokens=8, temperature=0)
    assert a.responses.retrieve(made.id).id == made.id
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):  # and it is still the first key's
        b.responses.delete(made.id)
    running = a.responses.create(model="x", input="Write a long essay about Rome.", max_output_tokens=400, background=True)
    with pytest.raises(openai.NotFoundError):
        b.responses.cancel(running.id)
    assert a.responses.cancel(running.id).status in ("cancelled", "completed", "incomplete")
    with pytest.raises(openai.BadRequestError) as refused:
        b.responses.create(model="x", input="What is my name?", previous_response_id=made.id, max_output_tokens=8)
    assert refused.value.body["param"] == "previous_response_id" and "not found" in refused.value.body["message"]
    follow = a.responses.create(model="x", input="What is my name?", previous_response_id=made.id, max_output_tokens=8, temperature=0)
    # b's own responses are its own, and a's stay a's after the keys are read again.
    theirs = b.responses.create(model="x", input="Hello.", max_output_tokens=4, temperature=0)
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(theirs.id)
    keys.write_text("sk-team-b-2222\nsk-team-c-3333\n")
    srv.proc.send_signal(signal.SIGHUP)
    assert wait_for(lambda: "keys read again, 3 accepted now" in srv.output()), srv.output()
    assert a.responses.retrieve(follow.id).id == follow.id and b.responses.retrieve(theirs.id).id == theirs.id
    a.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(made.id)


def test_a_bad_api_key_file_stops_the_server_with_one_line_naming_it(tmp_path):
    empty, spaced = tmp_path / "empty", tmp_path / "spaced"
    empty.write_text("# no keys yet\n\n")
    spaced.write_text("sk-good\nsk bad\n")
    for path, says in [(tmp_path / "missing", "cannot read"), (empty, "holds no key"), (spaced, "line 2")]:
        run = subprocess.run([SPECULA_BIN, "serve", "--draft", "none", "--port", "0", "--api-key-file", str(path)],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode != 0 and says in run.stderr and str(path) in run.stderr, (path, run.returncode, run.stderr)
        assert "loading" not in run.stderr, "the model was loaded before the flags were checked"


def test_sighup_reads_the_api_key_file_again_and_a_bad_file_leaves_the_keys_in_use(fresh_server, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("sk-old-1111\n")
    srv = fresh_server("--draft", "none", "--api-key", KEY, "--api-key-file", str(keys))
    assert "SIGHUP reads --api-key-file again" in srv.output()

    def status(key):
        return httpx.get(srv.url + "/v1/models", headers={"Authorization": "Bearer " + key}, timeout=30).status_code

    def reloads():
        return httpx.get(srv.url + "/metrics", headers={"Authorization": "Bearer " + KEY}, timeout=30).text

    def kept_lines():  # the server's lines about a read that failed
        return [line for line in srv.output().splitlines() if "the 2 key(s) in use stay" in line]

    # A keep-alive connection opened with the old key: its next request is checked against the new list.
    with httpx.Client(base_url=srv.url, headers={"Authorization": "Bearer sk-old-1111"}, timeout=30) as old:
        assert old.get("/v1/models").status_code == 200 and status("sk-new-2222") == 401
        keys.write_text("# rotated\nsk-new-2222\n")
        srv.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: "keys read again, 2 accepted now" in srv.output()), srv.output()
        assert old.get("/v1/models").status_code == 401
    assert status("sk-new-2222") == 200 and status(KEY) == 200 and status("sk-old-1111") == 401
    assert 'specula_api_key_reloads_total{result="ok"} 1' in reloads()
    # A file that holds no key, has a bad line or is gone: one line on stderr, and the keys stay.
    for n, (content, says) in enumerate([("# all keys withdrawn\n", "holds no key"), ("sk-good\nsk bad\n", "line 2"),
                                         (None, "cannot read")], start=1):
        if content is None:
            keys.unlink()
        else:
            keys.write_text(content)
        srv.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: len(kept_lines()) == n and says in kept_lines()[-1]), srv.output()
        assert status("sk-new-2222") == 200 and status("sk-good") == 401
    assert srv.proc.poll() is None
    assert 'specula_api_key_reloads_total{result="error"} 3' in reloads()

