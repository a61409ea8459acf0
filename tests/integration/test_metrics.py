"""/metrics: Prometheus text that parses (and passes promtool's lint), with counters that move when
requests run, HTTP requests counted by route, method and status."""
import asyncio
import json
import shutil
import subprocess

import httpx
import pytest
from websockets.asyncio.client import connect

from conftest import MAIN_JOB_ARGS, collect, wait_for


def test_metrics_parse_and_count_requests_tokens_and_latencies(server):
    before = server.metrics()
    for name in ("specula_prompt_tokens_total", "specula_generation_tokens_total", "specula_requests_running",
                 "specula_requests_waiting", "specula_kv_blocks_used", "specula_kv_blocks_free",
                 'specula_requests_total{outcome="length"}', 'specula_accepted_length_bucket{le="+Inf"}',
                 "specula_time_to_first_token_seconds_count", "specula_inter_token_latency_seconds_count",
                 "specula_request_acceptance_rate_count", "specula_request_confidence_threshold_count",
                 "specula_websocket_connections"):
        assert name in before, name
    r = httpx.post(server.url + "/v1/completions", timeout=60,
                   json={"prompt": "one two three four one two three four one two", "max_tokens": 10,
                         "temperature": 0})
    assert r.status_code == 200
    httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 0})
    assert wait_for(lambda: server.metrics()["specula_requests_running"] == 0)
    after = server.metrics()
    finished = sum(after[k] - before[k] for k in after if k.startswith("specula_requests_total{")
                   and 'rejected' not in k)
    assert finished >= 1
    assert after['specula_requests_total{outcome="rejected"}'] >= before['specula_requests_total{outcome="rejected"}'] + 1
    assert after["specula_generation_tokens_total"] - before["specula_generation_tokens_total"] >= 10 or \
        r.json()["choices"][0]["finish_reason"] == "stop"
    assert after["specula_prompt_tokens_total"] > before["specula_prompt_tokens_total"]
    assert after["specula_time_to_first_token_seconds_count"] == before["specula_time_to_first_token_seconds_count"] + 1
    assert after["specula_inter_token_latency_seconds_count"] > before["specula_inter_token_latency_seconds_count"]
    assert after['specula_accepted_length_bucket{le="+Inf"}'] > before['specula_accepted_length_bucket{le="+Inf"}']
    assert after["specula_kv_blocks_used"] + after["specula_kv_blocks_free"] == after["specula_kv_blocks_capacity"]
    # Prompt lookup alone: no request drafted under the confidence rule.
    assert after["specula_request_confidence_threshold_count"] == before["specula_request_confidence_threshold_count"]


def test_the_main_jobs_server_reports_each_requests_confidence_threshold_in_done_the_openai_reply_and_metrics(
        fresh_server):
    # scripts/run.sh's settings: the head behind prompt lookup, K adaptive, the threshold set per
    # round from the request's own measurements (--draft-confidence auto, greedy starting at 0.5).
    srv = fresh_server(*MAIN_JOB_ARGS)
    assert "auto" in MAIN_JOB_ARGS, MAIN_JOB_ARGS
    before = srv.metrics()
    ask = "Explain in a few sentences why the sky is blue."

    async def ws_done():
        async with connect(srv.ws_url) as ws:
            await ws.send(json.dumps({"type": "generate", "id": "t", "messages": [{"role": "user", "content": ask}],
                                      "max_tokens": 64, "temperature": 0}))
            return (await collect(ws, "t", timeout=120))[1]
    done = asyncio.run(ws_done())
    assert done["type"] == "done", done
    stats = done["stats"]
    assert stats["drafted"] > 0, stats
    # The rule's bounds (DraftLength::confidence_threshold holds it to [0.05, 0.95]).
    assert 0.05 <= stats["mean_confidence_threshold"] <= 0.95, stats

    r = httpx.post(srv.url + "/v1/chat/completions", timeout=120,
                   json={"messages": [{"role": "user", "content": ask}], "max_tokens": 64, "temperature": 0})
    assert r.status_code == 200, r.text
    spec = r.json()["speculation"]
    assert spec["drafted"] > 0 and 0.05 <= spec["mean_confidence_threshold"] <= 0.95, spec

    assert wait_for(lambda: srv.metrics()["specula_requests_running"] == 0)
    after = srv.metrics()
    name = "specula_request_confidence_threshold"
    assert after[name + "_count"] == before[name + "_count"] + 2
    mean = (after[name + "_sum"] - before[name + "_sum"]) / 2
    assert mean == pytest.approx((stats["mean_confidence_threshold"] + spec["mean_confidence_threshold"]) / 2, abs=1e-4)
    assert after[name + '_bucket{le="0.95"}'] == after[name + "_count"]


def test_http_requests_are_counted_by_route_method_and_status_and_timed(server):
    before = server.metrics()
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert c.get("/health").status_code == 200
        assert c.head("/v1/models").status_code == 200
        assert c.get("/no/such/path").status_code == 404
        assert c.get("/v1/models/another-model").status_code == 404
        assert c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3}).status_code == 200
        with c.stream("POST", "/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "stream": True}) as r:
            assert r.status_code == 200 and "[DONE]" in "".join(r.iter_text())
        assert c.post("/v1/completions", content=b"{not json").status_code == 400
        assert c.get("/v1/completions").status_code == 405
        assert c.request("PUT", "/v1/chat/completions").status_code == 405
        # HEAD answers carry no body, so the keep-alive connection reads the next answer right.
        r = c.head("/no/such/path")
        assert r.status_code == 404 and r.content == b"" and int(r.headers["content-length"]) > 0
        # An upgrade Beast refuses (no Sec-WebSocket-Key) is counted as its 400, not as 101.
        r = httpx.get(server.url + "/v1/ws", headers={"Connection": "Upgrade", "Upgrade": "websocket",
                                                      "Sec-WebSocket-Version": "13"}, timeout=30)
        assert r.status_code == 400, r.text
        assert c.get("/health").status_code == 200
    # A client that leaves before its answer (nginx logs these as 499).
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json={"prompt": "Count to a thousand:", "max_tokens": 2000, "ignore_eos": True,
                                                         "temperature": 0}, timeout=httpx.Timeout(30, read=0.3))

    async def ws():
        async with connect(server.ws_url):
            pass
    asyncio.run(ws())

    expected = {("/health", "GET", 200): 2, ("/v1/models", "HEAD", 200): 1, ("other", "GET", 404): 1,
                ("other", "HEAD", 404): 1, ("/v1/ws", "GET", 400): 1,
                ("/v1/models/{model}", "GET", 404): 1, ("/v1/completions", "POST", 200): 2,
                ("/v1/completions", "POST", 400): 1, ("/v1/completions", "GET", 405): 1,
                ("/v1/chat/completions", "other", 405): 1, ("/v1/ws", "GET", 101): 1, ("/v1/completions", "POST", 499): 1}

    def key(route, method, status):
        return f'specula_http_requests_total{{route="{route}",method="{method}",status="{status}"}}'

    def delta(m, k):
        return m.get(k, 0) - before.get(k, 0)
    assert wait_for(lambda: delta(server.metrics(), key("/v1/completions", "POST", 499)) == 1)
    after = server.metrics()
    assert {k: delta(after, key(*k)) for k in expected} == expected
    assert not any("no/such" in k for k in after), "a made-up path became a series"
    count = 'specula_http_request_duration_seconds_count{route="/v1/completions"}'
    assert delta(after, count) == 5  # 200 twice, 400, 405, 499
    assert delta(after, 'specula_http_request_duration_seconds_bucket{route="/v1/completions",le="+Inf"}') == 5
    assert delta(after, 'specula_http_request_duration_seconds_sum{route="/v1/completions"}') > 0.3  # the 499 alone


def test_the_metrics_page_passes_promtools_lint(server):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run scripts/setup.sh --tests (Debian's prometheus)"
    httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
    text = httpx.get(server.url + "/metrics", timeout=10).text
    run = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and not run.stdout.strip() and not run.stderr.strip(), run.stdout + run.stderr
