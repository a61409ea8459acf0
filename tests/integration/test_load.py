"""specula-load against a real `specula serve`: 32 WebSocket sessions and 128 requests with no
errors and report files that parse; the HTTP SSE mode; Poisson arrivals; server errors counted by
kind; and bad flags, a wrong URL or an unreachable server as one clear line and a non-zero exit."""
import html.parser
import json
import os
import pathlib
import subprocess

import pytest

from conftest import BUILD_DIR, SOURCE_DIR, Server, free_port

LOAD_BIN = pathlib.Path(os.environ.get("SPECULA_LOAD_BIN", BUILD_DIR / "specula-load"))
SHARED_DIR = pathlib.Path(os.environ.get("SPECULA_SHARED_DIR", SOURCE_DIR.parent / "shared"))
PROMPTS = SHARED_DIR / "data" / "prompts" / "chat.jsonl"


@pytest.fixture(scope="module")
def load_server(tmp_path_factory):
    """A server of this module's own, sized so 32 sessions queue rather than get `overloaded`."""
    srv = Server(["--draft", "ngram", "--max-batch", "16", "--max-queue", "64"],
                 tmp_path_factory.mktemp("load") / "serve.log")
    yield srv
    assert srv.stop() == 0, srv.output()


def run_load(*args, timeout=600):
    assert LOAD_BIN.exists(), f"build specula-load first: {LOAD_BIN} is missing"
    return subprocess.run([str(LOAD_BIN), *map(str, args)], capture_output=True, text=True, timeout=timeout)


class SvgCounter(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = {}

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1


def parse_html(path):
    p = SvgCounter()
    p.feed(pathlib.Path(path).read_text(encoding="utf-8"))
    p.close()
    return p.tags


def test_32_websocket_sessions_and_128_requests_finish_without_errors(load_server, tmp_path):
    out, report = tmp_path / "result.json", tmp_path / "report.html"
    r = run_load("--url", load_server.ws_url, "--prompts", PROMPTS, "--concurrency", 32, "--requests", 128,
                 "--max-tokens", 16, "--json", "--out", out, "--report", report)
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    result = json.loads(r.stdout)
    assert json.loads(out.read_text()) == result
    s = result["summary"]
    assert (s["requests"], s["succeeded"], s["failed"], s["errors_by_kind"]) == (128, 128, 0, {}), s["errors_by_kind"]
    assert result["config"]["concurrency"] == 32 and result["config"]["protocol"] == "websocket"
    assert len(result["requests"]) == 128 and all(q["ok"] for q in result["requests"])
    assert {q["session"] for q in result["requests"]} == set(range(32))
    assert all(1 <= q["output_tokens"] <= 16 for q in result["requests"])
    assert s["output_tokens"] == sum(q["output_tokens"] for q in result["requests"])
    for metric in ("ttft_ms", "itl_ms", "e2e_ms"):
        d = s[metric]
        assert d["n"] > 0 and 0 < d["p50"] <= d["p90"] <= d["p99"] <= d["max"], (metric, d)
    assert s["ttft_ms"]["p50"] < s["e2e_ms"]["p50"]
    assert s["total_tokens_per_s"] > 0 and s["session_tokens_per_s"]["n"] == 32
    # Every request reported its speculation counters (the server drafts with ngram).
    acc = s["acceptance"]
    assert acc["requests_with_stats"] == 128 and acc["accepted"] <= acc["drafted"]
    # The sessions really ran side by side.
    assert max(result["timeseries"]["in_flight"]) >= 16
    tags = parse_html(report)
    assert tags.get("svg", 0) >= 4 and tags.get("table", 0) >= 3, tags
    assert "<script" not in report.read_text()  # self-contained: no scripts, no fetches
    assert r.stderr == ""  # no progress line when stderr is not a terminal


def test_http_sse_mode_streams_chat_completions(load_server, tmp_path):
    report = tmp_path / "sse.html"
    r = run_load("--url", load_server.url + "/v1/chat/completions", "--prompts", PROMPTS, "--concurrency", 4,
                 "--requests", 8, "--max-tokens", 12, "--temperature", 0.7, "--json", "--report", report)
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    s = json.loads(r.stdout)["summary"]
    assert (s["succeeded"], s["failed"]) == (8, 0), s["errors_by_kind"]
    assert s["output_tokens"] > 0 and s["ttft_ms"]["n"] == 8 and s["itl_ms"]["n"] > 0
    assert s["acceptance"]["requests_with_stats"] == 8  # from the last chunk's "speculation"
    assert parse_html(report).get("svg", 0) >= 4


def test_the_responses_api_is_driven_as_the_chat_route_is(load_server, tmp_path):
    r = run_load("--url", load_server.url + "/v1/responses", "--prompts", PROMPTS, "--concurrency", 4,
                 "--requests", 8, "--max-tokens", 12, "--temperature", 0.7, "--json")
    assert r.returncode == 0, r.stderr + r.stdout[-2000:]
    result = json.loads(r.stdout)
    s = result["summary"]
    assert (s["succeeded"], s["failed"]) == (8, 0), s["errors_by_kind"]
    assert s["output_tokens"] > 0 and s["ttft_ms"]["n"] == 8 and s["itl_ms"]["n"] > 0
    assert s["acceptance"]["requests_with_stats"] == 8  # from response.completed's "speculation"
    assert all(q["finish_reason"] in ("stop", "length") for q in result["requests"])


def test_poisson_arrivals_record_their_schedule(load_server):
    r = run_load("--url", load_server.ws_url, "--prompts", PROMPTS, "--concurrency", 2, "--requests", 6,
                 "--max-tokens", 4, "--rate", 5, "--seed", 3, "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    scheduled = [q["scheduled_ms"] for q in result["requests"]]
    assert scheduled == sorted(scheduled) and scheduled[0] > 0
    assert all(q["start_ms"] >= q["scheduled_ms"] - 1 for q in result["requests"])
    assert result["summary"]["queue_ms"]["n"] == 6


def test_server_errors_are_counted_by_code_and_exit_3(load_server):
    # max_tokens beyond the context: the server refuses each request with invalid_request.
    r = run_load("--url", load_server.ws_url, "--prompts", PROMPTS, "--concurrency", 2, "--requests", 4,
                 "--max-tokens", 1000000, "--json")
    assert r.returncode == 3, r.stderr
    s = json.loads(r.stdout)["summary"]
    assert s["failed"] == 4 and s["errors_by_kind"]["server:invalid_request"]["count"] == 4, s["errors_by_kind"]
    assert "max_tokens" in s["errors_by_kind"]["server:invalid_request"]["example"]


def test_a_wrong_path_is_one_line_naming_the_http_status(load_server):
    r = run_load("--url", f"ws://127.0.0.1:{load_server.port}/no/such/path", "--prompts", PROMPTS)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "declined: HTTP 404" in r.stderr, r.stderr


@pytest.mark.parametrize("args, code, fragment", [
    (["--url", "ftp://127.0.0.1:1/", "--prompts", PROMPTS], 2, "unsupported scheme"),
    (["--url", "ws://127.0.0.1:99999/v1/ws", "--prompts", PROMPTS], 2, "bad port"),
    (["--url", "not a url", "--prompts", PROMPTS], 2, "is not a URL"),
    (["--url", "ws://127.0.0.1:{port}/v1/ws", "--prompts", PROMPTS], 1, "Connection refused"),
    (["--url", "ws://127.0.0.1:1/v1/ws", "--prompts", "/no/such/prompts.jsonl"], 2, "cannot open prompts file"),
    (["--url", "ws://127.0.0.1:1/v1/ws", "--prompts", PROMPTS, "--concurrency", "0"], 2, "--concurrency"),
    (["--url", "ws://127.0.0.1:1/v1/ws", "--prompts", PROMPTS, "--requests", "many"], 2, "expects an integer"),
    (["--url", "ws://127.0.0.1:1/v1/ws", "--prompts", PROMPTS, "--rate", "-2"], 2, "--rate"),
    (["--url", "ws://127.0.0.1:1/v1/ws", "--prompts", PROMPTS, "--warp-speed"], 2, "unknown option --warp-speed"),
    (["--prompts", PROMPTS], 2, "--url is required"),
    (["--url", "ws://127.0.0.1:1/v1/ws", "--prompts", PROMPTS, "--report", "/no/such/dir/r.html"], 2, "does not exist"),
])
def test_bad_input_is_one_clear_line_and_a_nonzero_exit(args, code, fragment):
    args = [a.format(port=free_port()) if isinstance(a, str) else a for a in args]
    r = run_load(*args, timeout=60)
    assert r.returncode == code, (r.returncode, r.stderr)
    assert r.stderr.startswith("specula-load: ") and r.stderr.count("\n") == 1, r.stderr
    assert fragment in r.stderr, r.stderr
    assert r.stdout == ""


def test_bad_prompt_lines_name_the_file_and_line(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "fine"}\n{"messages": "not a list"}\n')
    r = run_load("--url", "ws://127.0.0.1:1/v1/ws", "--prompts", prompts, timeout=60)
    assert r.returncode == 2 and f"{prompts}:2" in r.stderr and r.stderr.count("\n") == 1, r.stderr
