"""The message fuzzer (fuzz.py) against a real `specula serve` on loopback: at least 20,000 mutated
WebSocket messages and HTTP bodies per run (SPECULA_FUZZ_MESSAGES for more), with a fixed seed
(SPECULA_FUZZ_SEED to change it). Every message gets an error, a reply or a clean close; the server
never crashes; its resident memory stays within a bound; a valid request afterwards still works.
The control runs the same fuzzer against a build with a planted crash and must find it."""
import json
import os
import pathlib

import httpx
import pytest

import fuzz
from conftest import BUILD_DIR, Server

MESSAGES = int(os.environ.get("SPECULA_FUZZ_MESSAGES", "20000"))
SEED = int(os.environ.get("SPECULA_FUZZ_SEED", "20261125"))
# Requests that set no max_tokens stop after 2; a small pool keeps a mutated large max_tokens short.
ARGS = ["--draft", "ngram", "--max-tokens", "2", "--max-batch", "8", "--max-queue", "64"]
RSS_GROWTH_LIMIT_MB = 64  # after the run, beyond what warming up took


def rss_mb(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def valid_request_works(srv):
    r = httpx.post(srv.url + "/v1/chat/completions", timeout=60,
                   json={"model": "x", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})
    return r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_mutated_messages_each_get_an_error_or_a_reply_and_the_server_survives(tmp_path):
    srv = Server(ARGS, tmp_path / "serve.log")
    try:
        # Warm up (the allocator's arenas, the engine's scratch, and the vocabulary's trie, ~70 MB
        # made once by the first grammar: tools and schemas) before the memory baseline. The
        # forward's scratch grows to the longest prefill it has run (a whole prompt is one forward:
        # 210-310 MB more resident at this server's context of 4,079 tokens, which
        # truncate_prompt_tokens -1 lets a mutated 70 KB prompt reach), so one prompt that fills the
        # context is part of the warm-up.
        fuzz.run(srv, SEED + 1, ws_messages=400, http_requests=100, slow=0)
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=60,
                       json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "guided_json": {"type": "object"}})
        assert r.status_code == 200, r.text
        r = httpx.post(srv.url + "/v1/completions", timeout=120,
                       json={"prompt": "x" * 70_000, "max_tokens": 1, "truncate_prompt_tokens": -1})
        context = httpx.get(srv.url + "/v1/models", timeout=30).json()["data"][0]["max_model_len"]
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == context - 1, r.text
        before = rss_mb(srv.proc.pid)
        http = MESSAGES // 5
        report = fuzz.run(srv, SEED, ws_messages=MESSAGES - http, http_requests=http, slow=20)
        summary = json.dumps(report.as_dict(), indent=1, default=str)
        (pathlib.Path(os.environ.get("SPECULA_ARTIFACT_DIR", BUILD_DIR)) / "fuzz_report.json").write_text(summary)
        assert report.crashed_after is None, f"the server died after {report.crashed_after}\n{srv.output()[-3000:]}"
        assert srv.proc.poll() is None, srv.output()[-3000:]
        assert not report.problems, summary
        assert report.ws_messages + report.http_requests >= MESSAGES
        # Each kind of mutation happened, and the server answered with several kinds of error.
        assert set(report.kinds) >= {"valid", "structure", "bytes", "invalid_utf8", "oversized", "nonobject"}, summary
        assert {"invalid_json", "invalid_request", "message_too_large"} <= set(report.errors_by_code), summary
        assert 1007 in report.closes, summary  # invalid UTF-8 in a text frame closes the socket cleanly
        assert 200 in report.http_status and 400 in report.http_status, summary
        after = rss_mb(srv.proc.pid)
        assert after - before <= RSS_GROWTH_LIMIT_MB, f"resident memory {before:.0f} -> {after:.0f} MB\n{summary}"
        assert valid_request_works(srv)
    finally:
        code = srv.stop()
    assert code == 0, srv.output()[-3000:]


def test_the_fuzzer_finds_a_planted_crash(tmp_path):
    planted = BUILD_DIR / "specula-planted-crash"
    assert planted.exists(), f"{planted} is built with the project (CMakeLists.txt, the fuzzer's control)"
    srv = Server(ARGS, tmp_path / "serve.log", binary=planted)
    try:
        report = fuzz.run(srv, SEED, ws_messages=3000, http_requests=0, slow=0)
        assert report.crashed_after is not None, json.dumps(report.as_dict(), default=str)
        assert srv.proc.poll() is not None
    finally:
        srv.stop()
