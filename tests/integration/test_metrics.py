"""/metrics: Prometheus text that parses, with counters that move when requests run."""
import asyncio
import json

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
    assert after["specula_kv_blocks_used"] + after["specula_kv_blocks_free"] == after["specula_kv_blocks_total"]
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
