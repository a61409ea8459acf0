"""API keys and WebSocket origins (docs/serving.md, "API keys and origins") against a real server:
the key is required as a bearer token on the API routes, /metrics and the WebSocket upgrade (or as
the chat page's subprotocol); /health and the page stay open; a cross-site WebSocket is refused;
the chat page asks for the key once and chats with it."""
import asyncio
import base64
import json
import shutil

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from conftest import Server, collect

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
