"""/metrics: Prometheus text that parses, with counters that move when requests run."""
import httpx

from conftest import wait_for


def test_metrics_parse_and_count_requests_tokens_and_latencies(server):
    before = server.metrics()
    for name in ("specula_prompt_tokens_total", "specula_generation_tokens_total", "specula_requests_running",
                 "specula_requests_waiting", "specula_kv_blocks_used", "specula_kv_blocks_free",
                 'specula_requests_total{outcome="length"}', 'specula_accepted_length_bucket{le="+Inf"}',
                 "specula_time_to_first_token_seconds_count", "specula_inter_token_latency_seconds_count",
                 "specula_request_acceptance_rate_count", "specula_websocket_connections"):
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
