"""The chat page in headless Chromium (Debian's, driven by Playwright): a message gets a
streamed reply with statistics; the screenshot is kept in the build directory."""
import json
import os
import pathlib
import shutil

import pytest
from playwright.sync_api import sync_playwright

from conftest import BUILD_DIR


def test_the_chat_page_streams_a_reply_with_draft_highlighting_and_statistics(server):
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is missing: run scripts/setup.sh --tests"
    shot = pathlib.Path(os.environ.get("SPECULA_ARTIFACT_DIR", BUILD_DIR)) / "chat_page.png"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.goto(server.url + "/")
            page.wait_for_selector("#conn.ok", timeout=15000)
            page.fill("#max_tokens", "24")
            page.fill("#temperature", "0")
            # A fixed K, so that the load-adaptive policy cannot turn drafting off; this greedy
            # reply repeats the prompt, so n-gram drafts are accepted (9 of its 15 tokens).
            page.fill("#k", "4")
            page.select_option("#adaptive", "false")
            page.fill("#prompt", "one two three four five one two three four five one two three")
            page.click("#send")
            page.wait_for_selector(".msg.assistant .tok", timeout=30000)
            stats = page.wait_for_selector(".msg.assistant .stats", timeout=60000)
            text = stats.inner_text()
            assert "tok/s" in text and "acceptance" in text and "mean accepted length" in text, text
            reply = page.inner_text(".msg.assistant .body")
            assert reply.strip(), "the reply is empty"
            assert page.locator(".msg.assistant .tok").count() >= 2
            # Draft-accepted tokens and target tokens are both there and look different.
            drafts, targets = page.locator(".msg.assistant .tok.draft"), page.locator(".msg.assistant .tok.target")
            assert drafts.count() >= 1 and targets.count() >= 1, (drafts.count(), targets.count(), text)
            style = "e => getComputedStyle(e).backgroundColor + ' / ' + getComputedStyle(e).borderBottomStyle"
            assert drafts.first.evaluate(style) != targets.first.evaluate(style)
            # A second turn goes out with the history (multi-turn) and also completes.
            page.fill("#prompt", "And then?")
            page.click("#send")
            page.wait_for_function("document.querySelectorAll('.msg.assistant .stats').length == 2", timeout=60000)
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 1000


def test_the_stop_button_cancels_a_reply(server):
    chromium = shutil.which("chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(server.url + "/")
            page.wait_for_selector("#conn.ok", timeout=15000)
            # Greedy, and a prompt whose greedy reply runs to the 500-token limit (1.7 s or more on
            # these machines): a sampled reply to a shorter prompt could end on its own before the
            # click landed (seen once: 23 tokens, "finish stop").
            page.fill("#temperature", "0")
            page.fill("#max_tokens", "500")
            page.fill("#prompt", "Write a long essay about the history of the Roman Empire.")
            page.click("#send")
            page.wait_for_selector(".msg.assistant .tok", timeout=30000)
            page.click("#stop")
            stats = page.wait_for_selector(".msg.assistant .stats", timeout=30000)
            assert "cancelled" in stats.inner_text()
        finally:
            browser.close()


def test_a_reasoning_reply_shows_its_reasoning_folded_apart_and_only_the_answer_goes_back(fresh_server, tmp_path):
    """With the reasoning parser on, the page puts a reply's reasoning in a block of its own, folded
    once the answer starts, and the answer in the message; the next turn sends the answer alone as
    the assistant's message. (This small model does not close a reasoning block by itself: the test
    rewrites the page's first request on its way to the server into a prefilled reply nudged to
    close it, as the chat route's reasoning test asks, and reads the chat route's split of it.)"""
    import httpx
    from test_openai import REASONING_TEMPLATE
    template = tmp_path / "reasoning.jinja"
    template.write_text(REASONING_TEMPLATE, encoding="utf-8")
    srv = fresh_server("--draft", "ngram", "--chat-template", str(template))
    ask = "Is the sky blue?"
    for prefill, bias in (("<think>\nThe sky is blue.\n", 4), ("<think>\nThe sky is blue.\n", 5), ("<think>\nYes", 6)):
        nudge = {"messages": [{"role": "user", "content": ask}, {"role": "assistant", "content": prefill}],
                 "add_generation_prompt": False, "continue_final_message": True, "logit_bias": {"9617": bias}, "min_tokens": 6,
                 "max_tokens": 24, "temperature": 0}
        m = httpx.post(srv.url + "/v1/chat/completions", json={"model": "any", **nudge}, timeout=120).json()["choices"][0]["message"]
        if m.get("reasoning_content") and m.get("content"):
            break
    else:
        pytest.fail("no case reasoned and then answered")
    sent = []

    def route(ws):  # the page's socket, through to the real server
        server = ws.connect_to_server()

        def to_server(message):
            msg = json.loads(message)
            if msg.get("type") == "generate":
                sent.append(msg)
                if len(sent) == 1:
                    msg.update(nudge)
            server.send(json.dumps(msg))
        ws.on_message(to_server)
        server.on_message(lambda message: ws.send(message))

    chromium = shutil.which("chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.route_web_socket("**/v1/ws", route)
            page.goto(srv.url + "/")
            page.wait_for_selector("#conn.ok", timeout=15000)
            page.fill("#temperature", "0")
            page.fill("#max_tokens", "24")
            page.fill("#prompt", ask)
            page.click("#send")
            page.wait_for_selector(".msg.assistant .stats", timeout=60000)
            think = page.locator(".msg.assistant details.think")
            assert think.count() == 1
            assert think.evaluate("e => e.textContent") == "Reasoning" + m["reasoning_content"]
            assert think.evaluate("e => e.open") is False  # folded once the answer started
            assert page.locator(".msg.assistant .body").evaluate("e => e.textContent") == m["content"]
            page.fill("#prompt", "Why?")
            page.click("#send")
            page.wait_for_function("document.querySelectorAll('.msg.assistant .stats').length == 2", timeout=60000)
            page.click(".msg.assistant details.think summary")  # unfolded again for the picture
            page.screenshot(path=str(pathlib.Path(os.environ.get("SPECULA_ARTIFACT_DIR", BUILD_DIR)) / "chat_page_reasoning.png"),
                            full_page=True)
        finally:
            browser.close()
    assert sent[1]["messages"] == [{"role": "user", "content": ask}, {"role": "assistant", "content": m["content"]},
                                   {"role": "user", "content": "Why?"}]
