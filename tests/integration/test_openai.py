"""The OpenAI-compatible routes through the real `openai` client, and their error shapes."""
import asyncio
import json
import math
import re
import subprocess

import httpx
import jsonschema
import openai
import pytest

from conftest import DEFAULT_MODEL, MAIN_JOB_ARGS, SOURCE_DIR, SPECULA_BIN


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model_id(client):
    return client.models.list().data[0].id


def test_models_lists_the_served_model_with_its_context(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == ["SmolLM2-135M-Instruct.Q4_1"]
    raw = httpx.get(server.url + "/v1/models").json()
    assert raw["object"] == "list" and raw["data"][0]["max_model_len"] > 0


def test_a_chat_completion_returns_a_message_and_usage(client, model_id):
    r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Say hello."}],
                                       max_tokens=8, temperature=0)
    assert r.object == "chat.completion" and r.model == model_id
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_a_streamed_chat_completion_equals_the_unstreamed_one_and_reports_usage(client, model_id):
    args = dict(model=model_id, messages=[{"role": "system", "content": "You are terse."},
                                          {"role": "user", "content": "Name three fruits."}],
                max_tokens=12, temperature=0)
    whole = client.chat.completions.create(**args).choices[0].message.content
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["stop"], ["length"])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_continuous_usage_stats_put_the_counts_so_far_in_every_chunk(client, model_id):
    """vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk's usage is the
    choice's prompt and the tokens generated so far, growing to the final usage; without it, the
    chunks' usage is null (OpenAI's)."""
    args = dict(model=model_id, messages=[{"role": "user", "content": "Name three fruits."}], max_tokens=20, temperature=0,
                stream=True)
    chunks = list(client.chat.completions.create(**args, stream_options={"include_usage": True, "continuous_usage_stats": True}))
    final = chunks[-1].usage
    assert chunks[-1].choices == [] and final.completion_tokens > 0
    counts = [c.usage.completion_tokens for c in chunks[:-1]]
    assert all(c.usage.prompt_tokens == final.prompt_tokens and c.usage.total_tokens == final.prompt_tokens + c.usage.completion_tokens
               for c in chunks[:-1])
    assert counts[0] == 0 and counts == sorted(counts) and counts[-1] == final.completion_tokens and len(set(counts)) > 2, counts
    # Each chunk counts exactly the tokens sent up to it (with logprobs, one entry a token; the
    # last chunk's count has the end token too, which is counted, as OpenAI counts it, and not shown).
    sent = 0
    for c in client.chat.completions.create(**args, logprobs=True, stream_options={"include_usage": True, "continuous_usage_stats": True}):
        if c.choices and not c.choices[0].finish_reason:
            sent += len(c.choices[0].logprobs.content) if c.choices[0].logprobs else 0
            assert c.usage.completion_tokens == sent, (c, sent)
        elif c.choices:
            assert c.usage.completion_tokens in (sent, sent + 1), (c, sent)
    plain = list(client.chat.completions.create(**args, stream_options={"include_usage": True}))
    assert all(c.usage is None for c in plain[:-1]) and plain[-1].usage.completion_tokens == final.completion_tokens
    alone = list(client.completions.create(model=model_id, prompt="Fruits:", max_tokens=5, temperature=0, stream=True,
                                           stream_options={"continuous_usage_stats": True}))  # (needs include_usage)
    assert all(c.usage is None for c in alone)


def test_a_completion_continues_a_prompt_streamed_and_not(client, model_id):
    r = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=6, temperature=0,
                                  seed=3)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.usage.completion_tokens <= 6
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model_id, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True) if c.choices)
    assert streamed == r.choices[0].text


def test_a_stop_string_ends_a_chat_completion_with_finish_reason_stop(client, model_id):
    args = dict(model=model_id, messages=[{"role": "user", "content": "Write a sentence about cats."}],
                max_tokens=16, temperature=0)
    text = client.chat.completions.create(**args).choices[0].message.content
    word = text.split()[len(text.split()) // 2]
    r = client.chat.completions.create(**args, stop=[word])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text[:text.index(word)]


POEM = [{"role": "user", "content": "Write a short poem about the sea."}]


def test_n_choices_are_each_the_single_request_with_the_seed_plus_its_index(client, model_id):
    args = dict(model=model_id, messages=POEM, max_tokens=16, temperature=1.0)
    r = client.chat.completions.create(**args, n=3, seed=11)
    assert [c.index for c in r.choices] == [0, 1, 2]
    singles = [client.chat.completions.create(**args, seed=11 + i) for i in range(3)]
    assert [c.message.content for c in r.choices] == [s.choices[0].message.content for s in singles]
    assert [c.finish_reason for c in r.choices] == [s.choices[0].finish_reason for s in singles]
    # Seeds of their own: three samples of 16 tokens at T 1 are not all one text.
    assert len({c.message.content for c in r.choices}) > 1
    assert r.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert r.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    spec = r.model_extra["speculation"]
    assert spec["rounds"] == sum(s.model_extra["speculation"]["rounds"] for s in singles)
    # Greedy choices are one text.
    g = client.chat.completions.create(**{**args, "temperature": 0}, n=2)
    assert g.choices[0].message.content == g.choices[1].message.content


def test_n_streamed_choices_interleave_by_index_and_equal_the_unstreamed_ones(client, model_id):
    args = dict(model=model_id, prompt="Once upon a time", max_tokens=12, temperature=1.0, seed=5, n=3, logprobs=1)
    whole = client.completions.create(**args)
    texts, offsets, finishes = ["", "", ""], [[], [], []], [[], [], []]
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.text
            if choice.logprobs:
                offsets[choice.index] += choice.logprobs.text_offset
            if choice.finish_reason:
                finishes[choice.index].append(choice.finish_reason)
    assert texts == [c.text for c in whole.choices]
    assert finishes == [[c.finish_reason] for c in whole.choices]
    assert offsets == [c.logprobs.text_offset for c in whole.choices]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # Chat opens every choice with its role.
    chat = list(client.chat.completions.create(model=model_id, messages=POEM, max_tokens=4, n=2, stream=True))
    roles = [(c.choices[0].index, c.choices[0].delta.role) for c in chat if c.choices and c.choices[0].delta.role]
    assert roles == [(0, "assistant"), (1, "assistant")]


def test_several_prompts_are_each_the_single_request_with_their_n_choices_in_order(client, model_id, server):
    # vLLM's batched completions: choice p * n + j is prompt p's choice j, i.e. prompt p sent alone
    # with the seed + j.
    prompts = ["The sea is", "My favourite fruit is", "Once upon a time"]
    args = dict(model=model_id, max_tokens=8, temperature=1.0, seed=3)
    r = client.completions.create(prompt=prompts, n=2, **args)
    assert [c.index for c in r.choices] == list(range(6))
    singles = [client.completions.create(prompt=p, **{**args, "seed": 3 + j}) for p in prompts for j in range(2)]
    assert [c.text for c in r.choices] == [s.choices[0].text for s in singles]
    assert r.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles[::2])
    assert r.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    # Token-id prompts, streamed: every choice's text arrives under its own index.
    ids = [httpx.post(server.url + "/tokenize", json={"prompt": p}, timeout=30).json()["tokens"] for p in prompts[:2]]
    whole = client.completions.create(prompt=ids, **args)
    texts = ["", ""]
    for chunk in client.completions.create(prompt=ids, stream=True, **args):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in whole.choices] == [s.choices[0].text for s in singles[0:4:2]]


def test_several_prompts_are_refused_together_naming_the_prompt_at_fault(server):
    def post(prompt, **extra):
        return httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2, **extra}, timeout=60)
    r = post(["a"] * 65)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt" and "at most 64" in r.text, r.text
    r = post(["a", 5])
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    r = post(["a", []])
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    r = post(["a", "word " * 9000])
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert r.json()["error"]["message"].startswith("prompt 1: "), r.text
    r = post(["a"] * 20, n=16)  # 320 choices against the fixture's 8 + 32 places
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt" and "20 prompts x n = 16" in r.text, r.text
    assert post(["a", "b"]).status_code == 200


def test_n_outside_one_to_sixteen_and_best_of_above_n_are_400s_naming_the_field(server):
    post = lambda body: httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, **body},
                                   timeout=30)
    for body, param in [({"n": 0}, "n"), ({"n": 17}, "n"), ({"n": "2"}, "n"), ({"n": 1.5}, "n"),
                        ({"best_of": 2}, "best_of"), ({"n": 2, "best_of": 3}, "best_of")]:
        r = post(body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param and r.json()["error"]["code"] == "invalid_request", r.text
    r = post({"n": 2, "best_of": 2})
    assert r.status_code == 200 and len(r.json()["choices"]) == 2


def test_bad_requests_get_openai_errors_with_status_type_code_and_param(server):
    post = lambda path, body: httpx.post(server.url + path, content=body,
                                          headers={"content-type": "application/json"}, timeout=30)
    r = post("/v1/chat/completions", "{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = post("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": -1}))
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "invalid_request_error" and err["param"] == "temperature"
    r = post("/v1/completions", json.dumps({"prompt": "x", "top_p": 2}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_p"
    # Penalties and logit bias out of their ranges (OpenAI's; repetition_penalty is vLLM's): a 400
    # naming the field; their neutral values (what many clients send by default) are accepted.
    msgs = [{"role": "user", "content": "x"}]
    for field, value in [("presence_penalty", 2.5), ("frequency_penalty", -3), ("repetition_penalty", 0),
                         ("repetition_penalty", 2.5), ("presence_penalty", "0"), ("logit_bias", {"abc": 1}),
                         ("logit_bias", {"999999": -100}), ("logit_bias", {"5": 101}), ("logit_bias", {"5": "1"}),
                         ("logit_bias", [5]), ("logit_bias", {str(i): 1 for i in range(301)}), ("min_tokens", -1),
                         ("min_tokens", 2.5), ("ignore_eos", "yes"), ("allowed_token_ids", []),
                         ("allowed_token_ids", [999999]), ("allowed_token_ids", "5"), ("allowed_token_ids", [1.5]),
                         ("bad_words", "x"), ("bad_words", [5]), ("bad_words", [" \t"]), ("bad_words", ["w"] * 129)]:
        r = post("/v1/chat/completions", json.dumps({"messages": msgs, "max_tokens": 1, field: value}))
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, value, r.text)
    r = post("/v1/chat/completions", json.dumps({"messages": msgs, "max_tokens": 1, "presence_penalty": 0,
                                                 "frequency_penalty": 0.0, "repetition_penalty": 1, "logit_bias": {}}))
    assert r.status_code == 200, r.text
    r = post("/v1/chat/completions", json.dumps({"messages": msgs, "max_tokens": 4, "min_tokens": 5}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens", r.text
    for min_p in (-0.1, 1.5, "0.1"):
        r = post("/v1/completions", json.dumps({"prompt": "x", "min_p": min_p}))
        assert r.status_code == 400 and r.json()["error"]["param"] == "min_p", (min_p, r.text)
    r = post("/v1/completions", json.dumps({"prompt": "hello " * 5000}))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = post("/v1/completions", json.dumps({"prompt": "x" * (2 << 20)}))
    assert r.status_code == 413 and r.json()["error"]["code"] == "message_too_large"
    r = httpx.get(server.url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(server.url + "/v1/chat/completions")
    assert r.status_code == 405
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_an_http_client_that_leaves_mid_request_cancels_it_and_frees_its_kv(server):
    import socket
    from conftest import wait_for
    total = server.metrics()["specula_kv_blocks_capacity"]
    cancelled = server.metrics()['specula_requests_total{outcome="cancelled"}']
    # A streaming request dropped after its first event.
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={"prompt": "Once upon a time", "max_tokens": 400, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break
    # A non-streaming request whose client closes its socket while it runs.
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert wait_for(lambda: server.metrics()["specula_requests_running"] > 0, timeout=30)
    # Three choices streamed, dropped after the first event: all three are cancelled.
    with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                      json={"prompt": "Once upon a time", "max_tokens": 400, "stream": True, "n": 3}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break
    assert wait_for(lambda: server.metrics()['specula_requests_total{outcome="cancelled"}'] >= cancelled + 5,
                    timeout=30), server.metrics()
    assert wait_for(lambda: server.metrics()["specula_kv_blocks_free"] == total, timeout=30)


def _chat_logprobs(client, model_id, **extra):
    return client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "Name three colors, one per line."}],
        max_tokens=24, temperature=0, logprobs=True, top_logprobs=3, **extra)


def test_chat_logprobs_give_every_token_of_the_message_with_its_alternatives_streamed_and_not(client, model_id):
    r = _chat_logprobs(client, model_id)
    choice = r.choices[0]
    content = choice.logprobs.content
    assert "".join(t.token for t in content) == choice.message.content
    # A request that ends on its stop token scores one token more than its text shows.
    assert len(content) == r.usage.completion_tokens - (1 if choice.finish_reason == "stop" else 0)
    for t in content:
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token and t.logprob <= 0
        assert len(t.top_logprobs) == 3
        lps = [a.logprob for a in t.top_logprobs]
        assert lps == sorted(lps, reverse=True) and sum(math.exp(x) for x in lps) <= 1 + 1e-6
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob  # greedy
    streamed, text = [], ""
    for chunk in _chat_logprobs(client, model_id, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert text == choice.message.content
    assert [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in streamed] == \
        [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in content]
    # Without the ask there are none.
    plain = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert plain.choices[0].logprobs is None


def test_greedy_logprobs_are_the_same_numbers_with_the_main_jobs_speculation_as_without(fresh_server):
    # The verify rows of a speculative round are the bits of one-token decode steps (docs/kernels.md),
    # so a client reads the same log-probabilities from a server that drafts as from one that does not.
    results = []
    for args in (["--draft", "none"], MAIN_JOB_ARGS):
        srv = fresh_server(*args)
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        # Twice on each: the main job's confidence rule and load-adaptive policy decide from measured
        # costs whether a round drafts, so one short request may happen to keep no draft.
        results.append([c.chat.completions.create(
            model="any", messages=[{"role": "user", "content": "Explain what a rainbow is in two sentences."}],
            max_tokens=48, temperature=0, logprobs=True, top_logprobs=2) for _ in range(2)])
    off, on = results
    assert max(r.model_extra["speculation"]["accepted"] for r in on) > 0, "the main job's server drafted nothing that was kept"
    numbers = [[(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in r.choices[0].logprobs.content]
               for r in off + on]
    assert all(r.choices[0].message.content == off[0].choices[0].message.content for r in on)
    assert numbers == [numbers[0]] * 4


def test_allowed_token_ids_and_bad_words_hold_the_text_as_vllms_do_with_the_main_jobs_speculation_as_without(
        fresh_server):
    """vLLM's allowed_token_ids: every token of the reply is one of them. Its bad_words: a word is
    banned as itself and after a space, so the greedy reply with "Paris" banned is the reply with
    both tokens biased by -100; a two-word phrase of the plain reply is cut at its second token
    only where its first came just before. The same text with the main job's speculation as
    without (each verify row is masked after the round's drafts before it). A reply that reaches a
    point where the lists leave no token ends with an error after its text so far."""
    prompt = dict(model="any", prompt="The capital of France is", max_tokens=24, temperature=0, logprobs=0)
    results = []
    for args in (["--draft", "none"], MAIN_JOB_ARGS):
        srv = fresh_server(*args)
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        tokenize = lambda text: httpx.post(srv.url + "/tokenize", json={"prompt": text}, timeout=30).json()["tokens"]
        plain = c.completions.create(**prompt).choices[0]
        tokens = plain.logprobs.tokens
        assert "Paris" in plain.text, plain.text
        paris = tokenize("Paris") + tokenize(" Paris")
        assert len(paris) == 2, paris
        banned = c.completions.create(**prompt, extra_body={"bad_words": ["Paris"]}).choices[0]
        biased = c.completions.create(**prompt, logit_bias={str(t): -100 for t in paris}).choices[0]
        # The first two words in a row of the plain reply (after its first token), as one phrase.
        j = next(i for i in range(2, len(tokens)) if re.fullmatch(r" [a-z]+", tokens[i - 1]) and re.fullmatch(r" [a-z]+", tokens[i]))
        phrase = tokens[j - 1] + tokens[j]
        cut = c.completions.create(**prompt, extra_body={"bad_words": [phrase]}).choices[0]
        yes_no = [tokenize(w)[0] for w in (" yes", " no", " Yes", " No", ".")]
        chat = dict(model="any", messages=[{"role": "user", "content": "Is the sky blue?"}], max_tokens=8, temperature=0,
                    logprobs=True)
        held = c.chat.completions.create(**chat, extra_body={"allowed_token_ids": yes_no}).choices[0]
        streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            **{**chat, "logprobs": False}, stream=True, extra_body={"allowed_token_ids": yes_no}) if ch.choices)
        world = tokenize(" world")
        dead = dict(prompt="Hello", max_tokens=10, temperature=0, allowed_token_ids=world, bad_words=["world world"])
        r = httpx.post(srv.url + "/v1/completions", json=dead, timeout=60)
        assert r.status_code == 400 and "leave no token" in r.json()["error"]["message"], r.text
        chunks = [json.loads(line[6:]) for line in httpx.post(srv.url + "/v1/completions", json={**dead, "stream": True},
                                                               timeout=60).text.splitlines() if line.startswith("data: {")]
        assert chunks[0]["choices"][0]["text"] == " world" and "leave no token" in chunks[-1]["error"]["message"], chunks
        assert "Paris" not in banned.text and banned.text == biased.text != plain.text, (banned.text, biased.text)
        got = cut.logprobs.tokens
        assert got[:j] == tokens[:j] and got[j] != tokens[j], (got, tokens, j)
        assert not any(got[i - 1] == tokens[j - 1] and got[i] == tokens[j] for i in range(1, len(got))), got
        words = [t.token for t in held.logprobs.content]
        assert words and set(words) <= {" yes", " no", " Yes", " No", "."} and held.finish_reason == "length", words
        assert streamed == held.message.content
        results.append((plain.text, banned.text, cut.text, held.message.content))
    assert results[0] == results[1]


def test_penalties_and_logit_bias_change_the_text_and_give_the_same_text_with_the_main_jobs_speculation_as_without(
        fresh_server):
    # Each verify row is adjusted by the output before it, the round's own drafts included
    # (docs/speculative.md, "Penalties"), so greedy text with penalties is target-only greedy text
    # with them; it differs from the text without them. A logit bias of +100 on one token makes
    # greedy decoding repeat it.
    messages = [{"role": "user", "content": "List five colours, then five animals, then five fruits."}]
    penalties = dict(frequency_penalty=0.7, presence_penalty=0.4, extra_body={"repetition_penalty": 1.1})
    results = []
    for args in (["--draft", "none"], MAIN_JOB_ARGS):
        srv = fresh_server(*args)
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        plain = c.chat.completions.create(model="any", messages=messages, max_tokens=64, temperature=0)
        # Three times: the main job's confidence rule and load-adaptive policy decide from measured
        # costs whether a round drafts, so one short request may happen to keep no draft.
        penalized = [c.chat.completions.create(model="any", messages=messages, max_tokens=64, temperature=0, **penalties)
                     for _ in range(3)]
        streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model="any", messages=messages, max_tokens=64, temperature=0, stream=True, **penalties) if ch.choices)
        biased = c.completions.create(model="any", prompt="Once upon a time", max_tokens=5, temperature=0,
                                      logit_bias={"28": 100}, logprobs=0)
        results.append((plain, penalized, streamed, biased))
    (off_plain, off_pen, off_streamed, off_biased), (on_plain, on_pen, on_streamed, on_biased) = results
    text = off_pen[0].choices[0].message.content
    assert text != off_plain.choices[0].message.content, "the penalties changed nothing"
    assert max(r.model_extra["speculation"]["accepted"] for r in on_pen) > 0, "the main job's server kept no draft with penalties"
    assert [r.choices[0].message.content for r in off_pen + on_pen] == [text] * 6
    assert on_streamed == off_streamed == text
    tokens = off_biased.choices[0].logprobs.tokens
    assert len(tokens) == 5 and len(set(tokens)) == 1, tokens
    assert on_biased.choices[0].text == off_biased.choices[0].text


def test_min_tokens_and_ignore_eos_keep_a_short_answer_going(client, model_id):
    # vLLM's extensions: a reply that ends after a few tokens runs to min_tokens with min_tokens,
    # and to max_tokens with ignore_eos; its first tokens are the short reply's (greedy).
    args = dict(model=model_id, messages=[{"role": "user", "content": "Say hi."}], max_tokens=64, temperature=0)
    short = client.chat.completions.create(**args)
    n = short.usage.completion_tokens
    assert short.choices[0].finish_reason == "stop" and n < 48, short.usage
    longer = client.chat.completions.create(**args, extra_body={"min_tokens": n + 10})
    assert longer.usage.completion_tokens >= n + 10, longer.usage
    endless = client.chat.completions.create(**args, extra_body={"ignore_eos": True})
    assert endless.usage.completion_tokens == 64 and endless.choices[0].finish_reason == "length"
    assert endless.choices[0].message.content.startswith(short.choices[0].message.content)


def test_stop_token_ids_include_stop_str_in_output_and_skip_special_tokens_do_what_vllm_does(server, client, model_id):
    # stop_token_ids: the text ends before the token (left out, as the end tokens are), finish "stop";
    # include_stop_str_in_output keeps it, and a stop string too; skip_special_tokens false shows the
    # special tokens a reply runs past with ignore_eos.
    args = dict(model=model_id, prompt="Write three short sentences about cats.\n", max_tokens=80, temperature=0)
    whole = client.completions.create(**args, extra_body={"ignore_eos": True}).choices[0].text
    period = httpx.post(server.url + "/tokenize", json={"prompt": "."}, timeout=30).json()["tokens"]
    assert len(period) == 1
    cut = client.completions.create(**args, extra_body={"ignore_eos": True, "stop_token_ids": period}).choices[0]
    kept = client.completions.create(**args, extra_body={"ignore_eos": True, "stop_token_ids": period,
                                                         "include_stop_str_in_output": True}).choices[0]
    assert cut.finish_reason == "stop" and kept.finish_reason == "stop"
    assert len(cut.text) < len(whole) and whole.startswith(cut.text)
    assert kept.text == cut.text + "." and whole.startswith(kept.text)
    word = whole.split()[3]
    by_string = client.completions.create(**args, stop=["no such words", word],
                                          extra_body={"ignore_eos": True, "include_stop_str_in_output": True}).choices[0]
    assert by_string.finish_reason == "stop" and by_string.text == whole[:whole.index(word) + len(word)]
    # vLLM's stop_reason: the stop token's id or the stop string that ended it, else null; streamed
    # on the choice's last chunk.
    assert cut.model_extra["stop_reason"] == period[0] and kept.model_extra["stop_reason"] == period[0]
    assert by_string.model_extra["stop_reason"] == word
    lengthy = client.completions.create(**args, extra_body={"ignore_eos": True}).choices[0]
    assert lengthy.finish_reason == "length" and lengthy.model_extra["stop_reason"] is None
    last = [c for c in client.completions.create(**args, stop=[word], stream=True, extra_body={"ignore_eos": True})
            if c.choices][-1].choices[0]
    assert last.finish_reason == "stop" and last.model_extra["stop_reason"] == word
    chat = dict(model=model_id, messages=[{"role": "user", "content": "Say hi."}], max_tokens=64, temperature=0)
    plain = client.chat.completions.create(**chat, extra_body={"ignore_eos": True}).choices[0].message.content
    raw = client.chat.completions.create(**chat, extra_body={"ignore_eos": True, "skip_special_tokens": False})
    shown = raw.choices[0].message.content
    assert "<|im_end|>" in shown and "<|im_end|>" not in plain
    assert shown.replace("<|im_end|>", "").replace("<|im_start|>", "") == plain
    # The default end token ends it and stays out of the text with skip_special_tokens false too.
    ended = client.chat.completions.create(**chat, extra_body={"skip_special_tokens": False}).choices[0]
    assert ended.finish_reason == "stop" and "<|im_end|>" not in ended.message.content
    assert ended.model_extra["stop_reason"] is None  # the model's own end token


def test_stop_token_ids_and_the_stop_flags_refuse_bad_values_naming_the_field(server):
    post = lambda body: httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, **body},
                                   timeout=30)
    for body, param in [({"stop_token_ids": 5}, "stop_token_ids"), ({"stop_token_ids": [-1]}, "stop_token_ids"),
                        ({"stop_token_ids": [10**9]}, "stop_token_ids"), ({"stop_token_ids": ["a"]}, "stop_token_ids"),
                        ({"stop_token_ids": list(range(65))}, "stop_token_ids"),
                        ({"include_stop_str_in_output": "yes"}, "include_stop_str_in_output"),
                        ({"skip_special_tokens": 0}, "skip_special_tokens")]:
        r = post(body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    assert post({"stop_token_ids": [], "include_stop_str_in_output": None, "skip_special_tokens": True}).status_code == 200


def test_completion_logprobs_have_the_legacy_shape(client, model_id):
    r = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=8, temperature=0,
                                  logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.text_offset == [sum(len(t.encode()) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 2 and max(top.values()) == value and top[tok] == value  # greedy
    streamed = []
    for chunk in client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=8,
                                           temperature=0, logprobs=2, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += list(zip(chunk.choices[0].logprobs.tokens, chunk.choices[0].logprobs.token_logprobs,
                                 chunk.choices[0].logprobs.text_offset))
    assert streamed == list(zip(lp.tokens, lp.token_logprobs, lp.text_offset))


def test_an_unstreamed_body_with_n_choices_and_logprobs_is_the_document_the_streamed_chunks_make(server, model_id):
    # The unstreamed body is written as text with each choice's log-probabilities spliced in
    # (net/openai_routes.cpp, LogprobsJson's compact form): it must parse as the OpenAI shape, keys
    # and all, and carry the same numbers as the streamed chunks of the same seeded request.
    for route, extra in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a fruit."}],
                                                   "logprobs": True, "top_logprobs": 2}),
                         ("/v1/completions", {"prompt": "Fruits: apple,", "logprobs": 2})):
        body = {"model": model_id, "max_tokens": 6, "n": 3, "seed": 11, "temperature": 1.0, **extra}
        r = httpx.post(server.url + route, json=body, timeout=60)
        assert r.status_code == 200, r.text
        doc = r.json()
        assert set(doc) >= {"id", "object", "created", "model", "choices", "usage", "speculation"}, doc.keys()
        assert [c["index"] for c in doc["choices"]] == [0, 1, 2]
        streamed = {i: [] for i in range(3)}
        with httpx.stream("POST", server.url + route, json={**body, "stream": True}, timeout=60) as s:
            for line in s.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                for c in json.loads(line[6:])["choices"]:
                    if c.get("logprobs"):
                        lp = c["logprobs"]
                        streamed[c["index"]] += lp["content"] if "content" in lp else list(
                            zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], lp["text_offset"]))
        for c in doc["choices"]:
            lp = c["logprobs"]
            if "content" in lp:
                assert set(c) == {"index", "message", "logprobs", "finish_reason", "stop_reason"} and lp["refusal"] is None, c
                assert "".join(t["token"] for t in lp["content"]) == c["message"]["content"]
                assert lp["content"] == streamed[c["index"]]
            else:
                assert set(c) == {"index", "text", "logprobs", "finish_reason", "stop_reason"}, c
                assert list(zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], lp["text_offset"])) == \
                    [tuple(x) for x in streamed[c["index"]]]
                assert "".join(lp["tokens"]) == c["text"]


def test_min_p_keeps_every_sampled_token_within_min_p_of_the_most_probable(client, model_id):
    # min_p (vLLM's extension) keeps the tokens whose tempered probability is at least min_p times
    # the most probable one's: (logprob - top logprob) / T >= log(min_p), read off the model's own
    # log-probabilities. At T 1.5 without min_p the same requests sample tokens below that line, so
    # a server that ignored the field would fail here.
    temperature, min_p = 1.5, 0.3

    def ratios(extra):
        out = []
        for seed in range(4):
            r = client.chat.completions.create(
                model=model_id, messages=[{"role": "user", "content": "Write a short poem about the sea."}],
                max_tokens=40, temperature=temperature, top_p=1.0, seed=seed, logprobs=True, top_logprobs=1,
                extra_body={"top_k": 0, **extra})
            out += [(t.logprob - t.top_logprobs[0].logprob) / temperature for t in r.choices[0].logprobs.content]
        return out

    kept = ratios({"min_p": min_p})
    assert kept and min(kept) >= math.log(min_p) - 1e-4, min(kept)
    assert min(ratios({})) < math.log(min_p)


def test_bad_logprobs_fields_are_400s_naming_the_field(server):
    post = lambda path, body: httpx.post(server.url + path, json=body, timeout=30)
    msgs = [{"role": "user", "content": "x"}]
    for body, param in [({"messages": msgs, "top_logprobs": 2}, "top_logprobs"),
                        ({"messages": msgs, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                        ({"messages": msgs, "logprobs": "yes"}, "logprobs"),
                        ({"messages": msgs, "logprobs": True, "top_logprobs": 1.5}, "top_logprobs")]:
        r = post("/v1/chat/completions", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    for value in (6, -1, True, "2"):
        r = post("/v1/completions", {"prompt": "x", "logprobs": value})
        assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs", (value, r.text)


SYSTEM = ("You are a careful assistant for a small bakery. You answer questions about bread, pastry and opening "
          "hours in two sentences or fewer, and you never invent prices. The bakery opens at seven and closes at six.")


def test_a_second_request_sharing_a_long_prefix_reports_cached_tokens_and_gives_the_text_of_a_server_without_the_cache(
        server, client, model_id, fresh_server):
    ask = lambda c, q: c.chat.completions.create(
        model=model_id, messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
        max_tokens=16, temperature=0)
    before = server.metrics()
    first = ask(client, "When do you open?")
    second = ask(client, "Do you sell rye bread?")
    after = server.metrics()
    cached = second.usage.prompt_tokens_details.cached_tokens
    # The system prompt's full 16-token blocks, up to where the two user messages differ.
    assert cached >= 48 and cached % 16 == 0 and cached < second.usage.prompt_tokens, second.usage
    assert after["specula_prefix_cache_hits_total"] - before["specula_prefix_cache_hits_total"] >= cached
    assert after["specula_prefix_cache_queries_total"] - before["specula_prefix_cache_queries_total"] >= \
        first.usage.prompt_tokens + second.usage.prompt_tokens - 2
    off = fresh_server("--draft", "ngram", "--prefix-cache", "off")
    plain = openai.OpenAI(base_url=off.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    ask(plain, "When do you open?")
    again = ask(plain, "Do you sell rye bread?")
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    assert again.choices[0].message.content == second.choices[0].message.content
    assert off.metrics()["specula_prefix_cache_hits_total"] == 0


def test_tokenize_counts_what_a_request_reports_and_detokenize_gives_the_text_back(server, client, model_id):
    """vLLM's /tokenize and /detokenize: a chat's messages are templated as /v1/chat/completions
    templates them, so the count is that request's prompt_tokens; a prompt is taken as
    /v1/completions takes it; the ids decode back to the text."""
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]
    t = httpx.post(server.url + "/tokenize", json={"messages": messages}, timeout=30).json()
    r = client.chat.completions.create(model=model_id, messages=messages, max_tokens=2, temperature=0)
    assert t["count"] == len(t["tokens"]) == r.usage.prompt_tokens
    assert t["max_model_len"] == httpx.get(server.url + "/v1/models").json()["data"][0]["max_model_len"]
    templated = httpx.post(server.url + "/detokenize", json={"tokens": t["tokens"]}, timeout=30).json()["prompt"]
    assert templated.startswith("<|im_start|>system\nYou are terse.<|im_end|>") and "Name a colour." in templated

    text = "The capital of France is"
    p = httpx.post(server.url + "/tokenize", json={"prompt": text}, timeout=30).json()
    assert httpx.post(server.url + "/detokenize", json={"tokens": p["tokens"]}, timeout=30).json() == {"prompt": text}
    by_text = client.completions.create(model=model_id, prompt=text, max_tokens=4, temperature=0)
    by_ids = client.completions.create(model=model_id, prompt=p["tokens"], max_tokens=4, temperature=0)
    assert by_text.usage.prompt_tokens == p["count"] and by_ids.choices[0].text == by_text.choices[0].text


@pytest.mark.parametrize("path,body,param", [
    ("/tokenize", {}, "messages"),
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "messages"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "b"}]}, "messages[0].role"),
    ("/detokenize", {"tokens": "12"}, "tokens"),
    ("/detokenize", {"tokens": [1, 10 ** 9]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
])
def test_bad_token_route_bodies_are_400s_naming_the_field(server, path, body, param):
    r = httpx.post(server.url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_the_token_routes_take_only_posted_json(server):
    assert httpx.get(server.url + "/tokenize", timeout=30).status_code == 405
    r = httpx.post(server.url + "/detokenize", content="{not json", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.text


def test_json_mode_answers_are_json_objects_greedy_and_sampled_streamed_or_not(client, model_id):
    """response_format {"type": "json_object"} (spec/json_mode.h): an answer a stop token ended is
    one JSON object, one cut by max_tokens the start of one; the streamed text equals the whole."""
    closed = 0
    for prompt in ["Describe a cat as JSON with its name and age.", "List three primary colours.", "What is 2 + 2?"]:
        for args in (dict(temperature=0), dict(temperature=0.8, seed=5)):
            call = dict(model=model_id, messages=[{"role": "user", "content": prompt}], max_tokens=160,
                        response_format={"type": "json_object"}, **args)
            r = client.chat.completions.create(**call)
            text, finish = r.choices[0].message.content, r.choices[0].finish_reason
            if finish == "stop":
                assert isinstance(json.loads(text), dict), text
                closed += 1
            else:
                assert finish == "length" and text.lstrip().startswith("{"), (finish, text)
            streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**call, stream=True)
                               if c.choices)
            assert streamed == text
    assert closed >= 1, closed  # the small model often rambles past max_tokens inside its object


PERSON = {"type": "object", "additionalProperties": False, "required": ["zeta", "alpha", "pets"],
          "properties": {"zeta": {"type": "string", "maxLength": 20}, "alpha": {"type": "integer"},
                         "pets": {"type": "array", "items": {"enum": ["cat", "dog", "fish"]}, "maxItems": 3},
                         "note": {"type": ["string", "null"], "maxLength": 30}}}


def test_json_schema_answers_keep_the_schema_and_its_member_order_greedy_and_sampled_streamed_or_not(client, model_id):
    """response_format {"type": "json_schema"} (spec/json_schema.h): an answer a stop token ended
    is JSON the schema accepts (jsonschema, the reference validator, checks it), its members in the
    schema's order (zeta before alpha); one cut by max_tokens is a prefix; streamed equals whole."""
    whole = 0
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for prompt in ["Describe a person as JSON.", "Who are you?", "List your pets."]:
        for args in (dict(temperature=0), dict(temperature=0.8, seed=3)):
            call = dict(model=model_id, messages=[{"role": "user", "content": prompt}], max_tokens=120,
                        response_format=fmt, **args)
            r = client.chat.completions.create(**call)
            text, finish = r.choices[0].message.content, r.choices[0].finish_reason
            if finish == "stop":
                value = json.loads(text)
                jsonschema.validate(value, PERSON)
                assert list(value)[:2] == ["zeta", "alpha"], text
                whole += 1
            else:
                assert finish == "length" and text.lstrip().startswith('{'), (finish, text)
            streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**call, stream=True)
                               if c.choices)
            assert streamed == text
    assert whole >= 2, whole


def test_the_openai_clients_parse_helper_gets_a_pydantic_object_back(client, model_id):
    """The client library's own structured-output path: a pydantic model sent as a strict schema
    (titles, additionalProperties false), the reply parsed back into the model by the client."""
    import pydantic

    class Answer(pydantic.BaseModel):
        verdict: bool
        reason: str = pydantic.Field(max_length=40)

    r = client.chat.completions.parse(model=model_id, messages=[{"role": "user", "content": "Is the sky blue?"}],
                                      response_format=Answer, max_tokens=80, temperature=0)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Answer) and isinstance(parsed.verdict, bool), r.choices[0].message.content


def test_a_pydantic_model_with_bounds_dates_uuids_and_addresses_is_parsed_back_by_the_client(client, model_id):
    """pydantic writes minimum / exclusiveMaximum for Field(ge=, lt=), multipleOf for Field(multiple_of=) and format for datetime, date,
    UUID and IPv4Address: the reply keeps them (pydantic's own validation in the client's parse, and
    jsonschema checks the bounds), greedy and sampled."""
    import datetime
    import ipaddress
    import uuid

    import pydantic

    class Booking(pydantic.BaseModel):
        guests: int = pydantic.Field(ge=1, le=12)
        score: float = pydantic.Field(gt=0, lt=1)
        balance: float = pydantic.Field(ge=-99.5, le=-0.25)
        party: int = pydantic.Field(ge=0, le=100, multiple_of=5)
        hours: float = pydantic.Field(multiple_of=0.25)
        day: datetime.date
        starts: datetime.datetime
        ref: uuid.UUID
        host: ipaddress.IPv4Address

    schema = Booking.model_json_schema()
    for args in (dict(temperature=0), dict(temperature=0.8, seed=5)):
        r = client.chat.completions.parse(model=model_id, messages=[{"role": "user", "content": "Book a table for two tonight."}],
                                          response_format=Booking, max_tokens=400, **args)
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        parsed = r.choices[0].message.parsed
        assert isinstance(parsed, Booking), r.choices[0].message.content
        assert 1 <= parsed.guests <= 12 and 0 < parsed.score < 1 and -99.5 <= parsed.balance <= -0.25, parsed
        assert parsed.party % 5 == 0 and 0 <= parsed.party <= 100 and (parsed.hours * 4).is_integer(), parsed
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_guided_choice_a_regex_and_a_gbnf_grammar_constrain_the_answer(client, model_id):
    """vLLM's guided_choice and guided_regex and llama.cpp's grammar (GBNF), through the client's
    extra_body."""
    choices = ["positive", "negative", "neutral"]
    for seed in range(3):
        r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "I love this film!"}],
                                           max_tokens=10, temperature=1.0, seed=seed, extra_body={"guided_choice": choices})
        assert r.choices[0].message.content in choices and r.choices[0].finish_reason == "stop", r.choices[0]
    r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Give me a phone number."}],
                                       max_tokens=20, temperature=0, extra_body={"guided_regex": r"\(\d{3}\) \d{3}-\d{4}"})
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", r.choices[0].message.content), r.choices[0].message.content
    gbnf = 'root ::= "The answer is " [0-9]{1,3} "."\n'
    r = client.completions.create(model=model_id, prompt="Two plus two:", max_tokens=16, temperature=0,
                                  extra_body={"grammar": gbnf})
    text = r.choices[0].text
    assert re.fullmatch(r"The answer is [0-9]{1,3}\.", text), text
    assert r.choices[0].finish_reason == "stop"


def test_vllms_structured_outputs_constrain_as_the_fields_it_replaced(client, model_id):
    """vLLM's structured_outputs (its only spelling since v0.12, which removed guided_*): json,
    regex, choice, grammar and json_object give the reply their older fields give, greedy, on both
    routes."""
    ask = [{"role": "user", "content": "Describe a cat in JSON."}]
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}
    pairs = [({"json": schema}, {"guided_json": schema}), ({"regex": r"[A-Z][a-z]{2,8}"}, {"guided_regex": r"[A-Z][a-z]{2,8}"}),
             ({"choice": ["cat", "dog"]}, {"guided_choice": ["cat", "dog"]}),
             ({"grammar": 'root ::= "A " [a-z]+ "."\n'}, {"grammar": 'root ::= "A " [a-z]+ "."\n'}),
             ({"json_object": True}, {"response_format": {"type": "json_object"}})]
    for new, old in pairs:
        replies = [client.chat.completions.create(model=model_id, messages=ask, max_tokens=40, temperature=0,
                                                  extra_body=extra).choices[0] for extra in ({"structured_outputs": new}, old)]
        assert (replies[0].message.content, replies[0].finish_reason) == (replies[1].message.content, replies[1].finish_reason), (new, replies)
        if "json" in new:
            jsonschema.validate(json.loads(replies[0].message.content), schema)
    r = client.completions.create(model=model_id, prompt="My pet is a", max_tokens=4, temperature=0,
                                  extra_body={"structured_outputs": {"choice": [" cat", " dog"]}})
    assert r.choices[0].text in (" cat", " dog"), r.choices[0]


def test_with_ignore_eos_a_grammars_end_still_ends_the_reply(client, model_id):
    """vLLM's ignore_eos takes the end tokens away, but a grammar that has ended lets nothing else
    follow: the reply is the grammar's sentence, finish_reason stop (before, the rows after the end
    were left unmasked and the reply ran on to max_tokens past the grammar)."""
    gbnf = 'root ::= "The answer is " [0-9]{1,3} "."\n'
    r = client.completions.create(model=model_id, prompt="Two plus two:", max_tokens=40, temperature=0,
                                  extra_body={"grammar": gbnf, "ignore_eos": True})
    assert re.fullmatch(r"The answer is [0-9]{1,3}\.", r.choices[0].text), r.choices[0].text
    assert r.choices[0].finish_reason == "stop"


def test_a_grammar_past_the_matchers_limits_ends_the_request_with_a_400_and_the_server_goes_on(client, model_id, server):
    """A run of a's cut into a thousand parts of one to ten has more parses at once than a matcher
    holds: the answer is an error that says so (the request's fault, so a 400), streamed or not,
    after the text the grammar allowed; the next request is served."""
    gbnf = 'root ::= ("a"{1,10}){1000}\n'
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_id, prompt="x", max_tokens=300, temperature=0, extra_body={"grammar": gbnf})
    assert "the grammar needs more parse states" in str(e.value), e.value
    text = ""
    with pytest.raises(openai.APIError) as e:
        for chunk in client.completions.create(model=model_id, prompt="x", max_tokens=300, temperature=0, stream=True,
                                               extra_body={"grammar": gbnf}):
            text += chunk.choices[0].text
    assert "the grammar needs more parse states" in str(e.value), e.value
    assert text and set(text) == {"a"}, text
    r = client.completions.create(model=model_id, prompt="Two plus two:", max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("extra, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a(?=b)"}}}},
     "response_format", "/pattern: regex: lookahead is not supported"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "needs"),
    ({"guided_json": {"type": "object", "properties": {"n": {"type": "array", "uniqueItems": True}}}}, "guided_json",
     "/properties/n: uniqueItems is not supported"),
    ({"guided_json": {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 5, "minimum": 3}}}}, "guided_json",
     "/properties/n: multipleOf with a single bound other than 0 is not supported (give both bounds)"),
    ({"guided_json": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 4}}}}, "guided_json",
     "/properties/n: no integer lies between the minimum and the maximum"),
    ({"guided_json": "{not json"}, "guided_json", "not JSON"),
    ({"grammar": "root ::= item\n"}, "grammar", "rule 'item' is used but not defined"),
    ({"grammar": 'root ::= "a" |\n  root "b"\n'}, "grammar", "left-recursive"),
    ({"guided_grammar": 7}, "guided_grammar", "must be a string"),
    ({"guided_regex": "(a)\\1"}, "guided_regex", "regex: '\\1' is not supported at byte 4"),
    ({"guided_choice": []}, "guided_choice", "at least one choice"),
    ({"guided_choice": ["a"], "grammar": 'root ::= "a"\n'}, "grammar", "cannot both"),
    ({"response_format": {"type": "json_object"}, "guided_json": {}}, "guided_json", "cannot both"),
    # Nesting that a recursive reader would follow off its thread's stack: refused, the server lives.
    ({"grammar": "root ::= " + "(" * 100000 + '"a"' + ")" * 100000 + "\n"}, "grammar", "groups nested deeper than 256 levels"),
    ({"guided_regex": "(" * 100000 + "a" + ")" * 100000}, "guided_regex", "groups nested deeper than 256 levels"),
    ({"guided_json": '{"items":' * 50000 + "{}" + "}" * 50000}, "guided_json", "the schema nests deeper than 128 levels"),
    # vLLM's structured_outputs: one kind of constraint, and what it cannot keep refused by name.
    ({"structured_outputs": {}}, "structured_outputs", "needs exactly one of json, regex, choice, grammar or json_object, got none"),
    ({"structured_outputs": {"json_object": False}}, "structured_outputs", "got none"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "got regex and choice"),
    ({"structured_outputs": ["a"]}, "structured_outputs", "must be an object"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs", "structural_tag is not supported"),
    ({"structured_outputs": {"regex": "a", "whitespace_pattern": " *"}}, "structured_outputs", "whitespace_pattern is not supported"),
    ({"structured_outputs": {"json_object": True, "disable_any_whitespace": True}}, "structured_outputs",
     "disable_any_whitespace is not supported"),
    ({"structured_outputs": {"json_object": "yes"}}, "structured_outputs", "json_object must be true or false"),
    ({"structured_outputs": {"choice": "yes"}}, "structured_outputs.choice", "must be an array of strings"),
    ({"structured_outputs": {"regex": "(a)\\1"}}, "structured_outputs.regex", "regex: '\\1' is not supported at byte 4"),
    ({"structured_outputs": {"json": {"type": "array", "uniqueItems": True}}}, "structured_outputs.json", "uniqueItems is not supported"),
    ({"structured_outputs": {"grammar": "root ::= item\n"}}, "structured_outputs.grammar", "rule 'item' is used but not defined"),
    ({"structured_outputs": {"regex": "a", "disable_fallback": "no"}}, "structured_outputs", "disable_fallback must be true or false"),
    ({"structured_outputs": {"choice": ["a"]}, "guided_regex": "a"}, "structured_outputs", "cannot both"),
])
def test_a_constraint_the_server_cannot_keep_is_a_400_naming_the_field_and_the_fault(server, extra, param, words):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert words in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("value", [{"type": 5}, "json_object", {"type": "yaml"}])
def test_a_response_format_other_than_text_or_json_object_is_a_400_naming_it(server, value):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "response_format": value})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "response_format", r.text


def _echo(client, model_id, prompt, **extra):
    return client.completions.create(model=model_id, prompt=prompt, temperature=0, echo=True, **extra)


def test_echo_with_logprobs_scores_a_prompt_as_lm_evaluation_harness_reads_it(server, client, model_id):
    """lm-evaluation-harness's loglikelihood through an OpenAI completions server: the context and
    the continuation as one token-id prompt, max_tokens 1, logprobs 1, echo; it sums
    token_logprobs[ctxlen:-1] and checks each against the largest of top_logprobs. The continuation's
    entries must be the numbers the server gave when it generated that continuation itself."""
    context = "The capital of France is"
    gen = client.completions.create(model=model_id, prompt=context, max_tokens=6, temperature=0, logprobs=2,
                                    stop=[".", "\n"])
    gen_lp = gen.choices[0].logprobs
    tokenize = lambda text: httpx.post(server.url + "/tokenize", json={"prompt": text}, timeout=30).json()["tokens"]
    ctx_ids, cont_ids = tokenize(context), tokenize(gen.choices[0].text)
    pieces = [httpx.post(server.url + "/detokenize", json={"tokens": [t]}, timeout=30).json()["prompt"] for t in cont_ids]
    assert pieces == gen_lp.tokens[:len(cont_ids)], "the continuation tokenizes otherwise alone"
    ids = ctx_ids + cont_ids
    r = _echo(client, model_id, [ids], max_tokens=1, logprobs=2)
    choice, lp = r.choices[0], r.choices[0].logprobs
    text = httpx.post(server.url + "/detokenize", json={"tokens": ids}, timeout=30).json()["prompt"]
    assert choice.text.startswith(text) and text == context + gen.choices[0].text
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 1
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == len(ids) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and lp.text_offset[0] == 0
    assert lp.text_offset[len(ids)] == len(text.encode())
    ctxlen = len(ctx_ids)
    assert lp.token_logprobs[ctxlen:-1] == gen_lp.token_logprobs[:len(cont_ids)]
    assert lp.top_logprobs[ctxlen:-1] == gen_lp.top_logprobs[:len(cont_ids)]
    assert all(v == max(top.values()) for v, top in zip(lp.token_logprobs[ctxlen:-1], lp.top_logprobs[ctxlen:-1])), \
        "a greedy continuation is not greedy by its own entries"
    # Every prompt token after the first has its entry, at most 0, with its alternatives.
    assert all(v <= 0 and len(top) in (2, 3) for v, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:]))
    # The same numbers again, now that the prefix cache holds the prompt's blocks.
    again = _echo(client, model_id, [ids], max_tokens=1, logprobs=2).choices[0].logprobs
    assert again.token_logprobs == lp.token_logprobs and again.top_logprobs == lp.top_logprobs


def test_echo_streamed_gives_what_the_whole_response_gives_for_several_prompts(client, model_id):
    prompts = ["Once upon a time", "def add(a, b):"]
    whole = _echo(client, model_id, prompts, max_tokens=5, logprobs=1, n=2, seed=4)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    texts, lists = ["" for _ in range(4)], [{"tokens": [], "token_logprobs": [], "text_offset": []} for _ in range(4)]
    for chunk in _echo(client, model_id, prompts, max_tokens=5, logprobs=1, n=2, seed=4, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.logprobs:
                for key in lists[c.index]:
                    lists[c.index][key] += getattr(c.logprobs, key)
    for i, c in enumerate(whole.choices):
        assert c.text.startswith(prompts[i // 2]) and len(c.text) > len(prompts[i // 2])
        assert texts[i] == c.text
        assert lists[i] == {key: getattr(c.logprobs, key) for key in lists[i]}
        assert c.logprobs.token_logprobs[0] is None
    # Without logprobs the text alone is echoed; echo false is as if left out.
    plain = _echo(client, model_id, "Once upon a time", max_tokens=5)
    assert plain.choices[0].logprobs is None and plain.choices[0].text == whole.choices[0].text
    off = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=5, temperature=0, echo=False)
    assert "Once upon a time" + off.choices[0].text == plain.choices[0].text


def test_echo_outside_completions_or_not_a_boolean_is_a_400_naming_it(server):
    post = lambda path, body: httpx.post(server.url + path, json=body, timeout=30)
    r = post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "echo": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo" and "/v1/completions" in r.text, r.text
    for value in ("yes", 1, []):
        r = post("/v1/completions", {"prompt": "x", "echo": value})
        assert r.status_code == 400 and r.json()["error"]["param"] == "echo", (value, r.text)
    r = post("/v1/completions", {"prompt": "x", "echo": None, "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_prompt_logprobs_give_vllms_entries_the_numbers_echo_gives(server, client, model_id):
    """vLLM's prompt_logprobs: per prompt token (the first null) its id -> logprob, rank and decoded
    text, with that many alternatives ranked 1..k; the numbers are echo's for the same prompt."""
    prompt = "The sky is blue because the air scatters"
    echo = _echo(client, model_id, prompt, max_tokens=1, logprobs=3)
    lp = echo.choices[0].logprobs
    n_prompt = echo.usage.prompt_tokens
    r = client.completions.create(model=model_id, prompt=prompt, max_tokens=1, temperature=0,
                                  extra_body={"prompt_logprobs": 2})
    entries = r.choices[0].model_extra["prompt_logprobs"]
    assert len(entries) == n_prompt and entries[0] is None
    ids = httpx.post(server.url + "/tokenize", json={"prompt": prompt}, timeout=30).json()["tokens"]
    assert len(ids) == n_prompt
    ranked_first = 0
    for k in range(1, n_prompt):
        e = entries[k]
        mine = e[str(ids[k])]
        assert mine["decoded_token"] == lp.tokens[k]
        assert mine["logprob"] == pytest.approx(lp.token_logprobs[k], abs=1e-6)
        assert 2 <= len(e) <= 3, e  # the token and two alternatives, once if it is one of them
        ranks = sorted(v["rank"] for key, v in e.items() if key != str(ids[k]))
        assert ranks in ([1, 2], [1], [2]), e
        top = lp.top_logprobs[k]  # echo's three alternatives: text -> logprob
        best = max(top.values())
        rank1 = [v for v in e.values() if v["rank"] == 1]
        assert rank1 and rank1[0]["logprob"] == pytest.approx(best, abs=1e-6)
        # rank: 1 + the tokens more probable than it, so 1 exactly when it is the likeliest
        assert (mine["rank"] == 1) == (mine["logprob"] >= best - 1e-6)
        assert mine["rank"] >= 1 + sum(1 for v in top.values() if v > mine["logprob"] + 1e-6)
        ranked_first += mine["rank"] == 1
    assert 0 < ranked_first < n_prompt - 1, "every or no prompt token the likeliest: the ranks say nothing"
    # Both at once: one prefill scores both; echo keeps its own count of alternatives.
    both = _echo(client, model_id, prompt, max_tokens=1, logprobs=1, extra_body={"prompt_logprobs": 3})
    assert [len(t) for t in both.choices[0].logprobs.top_logprobs[1:n_prompt]] == [1] * (n_prompt - 1)
    assert both.choices[0].logprobs.token_logprobs[:n_prompt] == lp.token_logprobs[:n_prompt]
    for k, e in enumerate(both.choices[0].model_extra["prompt_logprobs"][1:], start=1):
        assert len(e) == 3 + (e[str(ids[k])]["rank"] > 3), e  # three alternatives, and the token if not one
    # Chat: one list for the response, over the templated prompt; 0 alternatives: the token alone.
    c = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                       n=2, extra_body={"prompt_logprobs": 0})
    chat_entries = c.model_extra["prompt_logprobs"]
    assert len(chat_entries) == c.usage.prompt_tokens and chat_entries[0] is None
    assert all(len(e) == 1 and next(iter(e.values()))["rank"] >= 1 for e in chat_entries[1:])
    assert "prompt_logprobs" not in c.choices[0].model_extra
    # Without the ask there are none.
    plain = client.completions.create(model=model_id, prompt=prompt, max_tokens=1)
    assert "prompt_logprobs" not in (plain.choices[0].model_extra or {})


def test_prompt_logprobs_streamed_or_out_of_range_is_a_400_naming_it(server):
    post = lambda path, body: httpx.post(server.url + path, json=body, timeout=30)
    for path, body in [("/v1/completions", {"prompt": "x"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})]:
        r = post(path, {**body, "prompt_logprobs": 1, "stream": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs" and "stream" in r.text, r.text
        for value in (21, -1, "2", 1.5):
            r = post(path, {**body, "prompt_logprobs": value})
            assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs", (value, r.text)
        assert post(path, {**body, "prompt_logprobs": None, "max_tokens": 1}).status_code == 200


def test_echo_with_max_tokens_zero_gives_the_prompt_alone_scored_streamed_and_not(server, client, model_id):
    """The old OpenAI way to score a text: max_tokens 0, echo, logprobs 0."""
    prompt = "The sky is blue because"
    r = _echo(client, model_id, prompt, max_tokens=0, logprobs=0)
    c = r.choices[0]
    assert c.text == prompt and c.finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.total_tokens == r.usage.prompt_tokens
    assert len(c.logprobs.tokens) == r.usage.prompt_tokens and "".join(c.logprobs.tokens) == prompt
    assert c.logprobs.token_logprobs[0] is None and all(v < 0 for v in c.logprobs.token_logprobs[1:])
    one = _echo(client, model_id, prompt, max_tokens=1, logprobs=0).choices[0].logprobs
    assert one.token_logprobs[:-1] == c.logprobs.token_logprobs
    chunks = [ch for ch in _echo(client, model_id, prompt, max_tokens=0, logprobs=0, stream=True) if ch.choices]
    assert "".join(ch.choices[0].text for ch in chunks) == prompt
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices[0].finish_reason] == ["length"]
    for body in ({"prompt": prompt, "max_tokens": 0}, {"prompt": prompt, "max_tokens": 0, "echo": False}):
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens" and "echo" in r.text, r.text
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
                   timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 30}},
                                       "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_a_named_tool_choice_returns_a_call_whose_arguments_keep_the_schema_streamed_and_not(client, model_id):
    args = dict(model=model_id, messages=ASK, tools=[WEATHER, TIME], max_tokens=60, temperature=0,
                tool_choice={"type": "function", "function": {"name": "get_weather"}})
    r = client.chat.completions.create(**args)
    message = r.choices[0].message
    assert message.content is None and len(message.tool_calls) == 1, message
    call = message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    # The arguments are what the same schema gives as guided decoding's content.
    guided = client.chat.completions.create(model=model_id, messages=ASK, max_tokens=60, temperature=0,
                                            extra_body={"guided_json": WEATHER["function"]["parameters"]})
    assert call.function.arguments == guided.choices[0].message.content
    streamed, finishes = {}, []
    for chunk in client.chat.completions.create(**args, stream=True):
        delta = chunk.choices[0].delta
        assert not delta.content, delta
        for tc in delta.tool_calls or []:
            got = streamed.setdefault(tc.index, {"name": "", "arguments": ""})
            got["name"] += tc.function.name or ""
            got["arguments"] += tc.function.arguments or ""
        if chunk.choices[0].finish_reason:
            finishes.append(chunk.choices[0].finish_reason)
    assert streamed == {0: {"name": "get_weather", "arguments": call.function.arguments}} and finishes == ["stop"]


# A pydantic-style schema: its parts under $defs, referred to from #/$defs (and itself from "#").
TRIP = {"type": "function", "function": {"name": "plan_trip", "parameters": {
    "type": "object", "properties": {"to": {"$ref": "#/$defs/Place"}, "via": {"type": "array", "maxItems": 1,
                                                                             "items": {"$ref": "#/$defs/Place"}}},
    "required": ["to", "via"],
    "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}}}


def test_tool_choice_required_returns_calls_of_the_listed_tools_and_one_without_parallel_calls(client, model_id):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME, TRIP)}
    for parallel in (True, False):
        r = client.chat.completions.create(model=model_id, messages=ASK, tools=[WEATHER, TIME, TRIP], tool_choice="required",
                                           parallel_tool_calls=parallel, max_tokens=120, temperature=0)
        calls = r.choices[0].message.tool_calls
        assert calls and (parallel or len(calls) == 1), r.choices[0].message
        assert len({c.id for c in calls}) == len(calls)
        for c in calls:
            jsonschema.validate(json.loads(c.function.arguments), schemas[c.function.name])
    # Each tool's $refs point into its own schema wherever the list puts it.
    r = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Plan a trip to Rome."}],
                                       tools=[WEATHER, TRIP], tool_choice="required", max_tokens=120, temperature=0)
    assert "plan_trip" in [c.function.name for c in r.choices[0].message.tool_calls]
    for c in r.choices[0].message.tool_calls:
        jsonschema.validate(json.loads(c.function.arguments), schemas[c.function.name])
    named = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Plan a trip to Rome."}],
                                           tools=[TRIP], tool_choice={"type": "function", "function": {"name": "plan_trip"}},
                                           max_tokens=120, temperature=0)
    args = json.loads(named.choices[0].message.tool_calls[0].function.arguments)
    jsonschema.validate(args, TRIP["function"]["parameters"])
    assert list(args) == ["to", "via"]


def test_a_conversation_with_earlier_tool_calls_and_their_results_is_answered(client, model_id):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                               "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18, "sky": "clear"}'}]
    r = client.chat.completions.create(model=model_id, messages=history, tools=[WEATHER], tool_choice="none",
                                       max_tokens=16, temperature=0)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    plain = client.chat.completions.create(model=model_id, messages=history, max_tokens=16, temperature=0)
    assert plain.choices[0].message.content == r.choices[0].message.content  # "none": as if no tools were sent
    assert r.usage.prompt_tokens > client.chat.completions.create(
        model=model_id, messages=ASK, max_tokens=1, temperature=0).usage.prompt_tokens + 20


def streamed_tool_reply(client, args, pieces=None):
    """A streamed chat reply put together as the openai client's accumulation does: its content,
    its calls by index (name, arguments: a call's first piece carries its id, type and name, later
    ones more of its arguments), its finish reasons; `pieces` collects the content and argument
    pieces as they came."""
    content, calls, finishes = "", {}, []
    for chunk in client.chat.completions.create(**args, stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        if pieces is not None and delta.content:
            pieces.append(delta.content)
        for tc in delta.tool_calls or []:
            if tc.index not in calls:
                assert tc.id and tc.type == "function" and tc.function.name, tc
                calls[tc.index] = (tc.function.name, "")
            else:
                assert tc.id is None and not tc.function.name, tc
            name, arguments = calls[tc.index]
            calls[tc.index] = (name, arguments + (tc.function.arguments or ""))
            if pieces is not None and tc.function.arguments:
                pieces.append(tc.function.arguments)
        if chunk.choices[0].finish_reason:
            finishes.append(chunk.choices[0].finish_reason)
    return content, calls, finishes


JOKE = [{"role": "system", "content": "Answer in words; call a tool only for the weather."},
        {"role": "user", "content": "Tell me a joke."}]


def test_tool_choice_auto_replies_with_calls_or_text_the_same_streamed_and_not(client, model_id):
    """llama.cpp's generic format: the tools described in a system message and the reply held to
    {"tool_calls": [...]} or {"response": "..."}, returned as calls (finish "tool_calls") or text,
    streamed as they are generated (a call's arguments and the response's text in pieces)."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    kinds, prompt_tokens = set(), []
    for messages in (ASK, JOKE):
        args = dict(model=model_id, messages=messages, tools=[WEATHER], max_tokens=200, temperature=0)
        r = client.chat.completions.create(**args)  # tool_choice left out: "auto" is the default with tools
        prompt_tokens.append(r.usage.prompt_tokens)
        choice = r.choices[0]
        if choice.message.tool_calls:
            kinds.add("calls")
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
            for c in choice.message.tool_calls:
                jsonschema.validate(json.loads(c.function.arguments), schemas[c.function.name])
        else:
            kinds.add("text")
            assert choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str)
            assert not choice.message.content.lstrip().startswith('{"response"'), "the wrapper was not taken off"
        pieces = []
        content, calls, finishes = streamed_tool_reply(client, args, pieces)
        assert finishes == [choice.finish_reason]
        assert content == (choice.message.content or "")
        assert calls == {k: (c.function.name, c.function.arguments) for k, c in enumerate(choice.message.tool_calls or [])}
        assert len(pieces) > 3, pieces  # streamed as generated, not at the end in one piece
    # The tools are described to the model: the prompt is longer than without them.
    plain = client.chat.completions.create(model=model_id, messages=ASK, max_tokens=1, temperature=0)
    assert prompt_tokens[0] > plain.usage.prompt_tokens + 50, (prompt_tokens, plain.usage)
    # Greedy on the default model: the weather question is calls and the joke (told to answer in words) is text.
    assert kinds == {"calls", "text"}, kinds


def test_a_reply_cut_by_max_tokens_keeps_the_calls_begun_and_the_response_so_far_as_openai_does(client, model_id):
    """Cut by max_tokens, a call is returned with its arguments so far (not JSON yet) and finish
    "length", as OpenAI returns one; a response is its text so far; streamed the same."""
    args = dict(model=model_id, messages=ASK, tools=[WEATHER], max_tokens=30, temperature=0)  # (inside the first call)
    whole = client.chat.completions.create(**{**args, "max_tokens": 200}).choices[0].message.tool_calls
    r = client.chat.completions.create(**args)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None, choice
    calls = choice.message.tool_calls
    assert calls and len(calls) <= len(whole)
    for cut, full in zip(calls, whole):
        assert cut.function.name == full.function.name and full.function.arguments.startswith(cut.function.arguments)
    with pytest.raises(json.JSONDecodeError):
        json.loads(calls[-1].function.arguments)
    assert streamed_tool_reply(client, args) == ("", {k: (c.function.name, c.function.arguments) for k, c in enumerate(calls)},
                                                 ["length"])
    # A named function's reply cut: its call, the arguments so far.
    named = client.chat.completions.create(**{**args, "max_tokens": 4, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    assert named.choices[0].finish_reason == "length" and named.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert named.choices[0].message.tool_calls[0].function.arguments.lstrip().startswith("{")
    # The response cut: its text so far, without the wrapper.
    text = client.chat.completions.create(**{**args, "messages": JOKE, "max_tokens": 200}).choices[0].message.content
    cut = client.chat.completions.create(**{**args, "messages": JOKE, "max_tokens": 10}).choices[0]
    assert cut.finish_reason == "length" and cut.message.content and text.startswith(cut.message.content), (cut, text)
    assert streamed_tool_reply(client, {**args, "messages": JOKE, "max_tokens": 10}) == (cut.message.content, {}, ["length"])


def test_bad_tools_and_tool_choices_are_400s_naming_the_field(server):
    post = lambda path, body: httpx.post(server.url + path, json=body, timeout=30)
    base = {"messages": ASK, "max_tokens": 4}
    named = {"type": "function", "function": {"name": "get_weather"}}
    for body, param, says in [
            ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
            ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "sometimes"),
            ({"tool_choice": "required"}, "tool_choice", "needs tools"),
            ({"tools": [{"type": "function", "function": {"name": "bad name"}}], "tool_choice": "required"}, "tools", "name"),
            ({"tools": [WEATHER, WEATHER], "tool_choice": "required"}, "tools", "two tools"),
            ({"tools": [{"type": "retrieval"}], "tool_choice": "required"}, "tools", "function"),
            ({"tools": [WEATHER], "tool_choice": named, "response_format": {"type": "json_object"}}, "tool_choice", "cannot both"),
            ({"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": "yes"}, "parallel_tool_calls", "true or false"),
            ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
                "n": {"type": "array", "uniqueItems": True}}}}}], "tool_choice": "required"}, "tools", "uniqueItems"),
            ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]}, "messages[0].tool_calls",
             "JSON"),
            ({"messages": ASK + [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[" * 300000 + "]" * 300000}}]}]},
             "messages[1].tool_calls", "deeper")]:
        r = post("/v1/chat/completions", {**base, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param and says in r.json()["error"]["message"], (body, r.text)
    r = post("/v1/completions", {"prompt": "x", "tools": [WEATHER]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools" and "chat" in r.text, r.text


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens_as_vllm_does(server, client, model_id):
    prompt = "The history of the city begins with a small village on the river, where fishermen traded salt and"
    ids = httpx.post(server.url + "/tokenize", json={"prompt": prompt}, timeout=30).json()["tokens"]
    k = 8
    cut = client.completions.create(model=model_id, prompt=prompt, max_tokens=6, temperature=0,
                                    extra_body={"truncate_prompt_tokens": k})
    tail = client.completions.create(model=model_id, prompt=ids[-k:], max_tokens=6, temperature=0)
    assert cut.usage.prompt_tokens == k and cut.choices[0].text == tail.choices[0].text
    echoed = client.completions.create(model=model_id, prompt=prompt, max_tokens=1, temperature=0, echo=True,
                                       extra_body={"truncate_prompt_tokens": k})
    text = httpx.post(server.url + "/detokenize", json={"tokens": ids[-k:]}, timeout=30).json()["prompt"]
    assert echoed.choices[0].text.startswith(text) and not echoed.choices[0].text.startswith(prompt)
    whole = client.completions.create(model=model_id, prompt=prompt, max_tokens=2, temperature=0,
                                      extra_body={"truncate_prompt_tokens": len(ids) + 5})
    assert whole.usage.prompt_tokens == len(ids)  # shorter than k: left as it is
    chat = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": prompt}], max_tokens=2,
                                          temperature=0, extra_body={"truncate_prompt_tokens": 12})
    assert chat.usage.prompt_tokens == 12
    for value in (0, -2, 10 ** 9, "8"):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "truncate_prompt_tokens": value}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens", (value, r.text)


def test_a_priority_is_refused_unless_the_server_schedules_by_priority(server, client, model_id):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "priority": 3}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text
    assert "--scheduling-policy priority" in r.json()["error"]["message"]
    for bad in ("high", 1.5, 2 ** 40):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "priority": bad}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "priority", (bad, r.text)
    # 0 is every request's priority first come first served; the client library passes it as vLLM's extra field.
    c = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                       extra_body={"priority": 0})
    assert c.choices[0].finish_reason in ("stop", "length")


async def gauges_while(url, task, names, every=0.01):
    """The gauges `names` as the server's /metrics shows them, a tuple a sample, until `task` is done."""
    seen = []
    async with httpx.AsyncClient() as c:
        while not task.done():
            page = (await c.get(url + "/metrics")).text
            seen.append(tuple(int(re.search(rf"\n{name} (\d+)\n", page).group(1)) for name in names))
            await asyncio.sleep(every)
    return seen


def test_with_the_priority_policy_a_lower_value_goes_first_and_preempts_a_running_higher_one(fresh_server):
    # The main job's drafter (the trained head reads the target's rows, which a resumed request's
    # prefill hands it again), one request at a time.
    srv = fresh_server(*MAIN_JOB_ARGS, "--max-batch", "1", "--scheduling-policy", "priority")
    openai_client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    finished = []

    async def ask(name, priority, max_tokens, prompt="Count: one, two,"):
        r = await openai_client.completions.create(model="x", prompt=prompt, max_tokens=max_tokens,
                                                   temperature=0, extra_body={"priority": priority, "ignore_eos": True})
        finished.append(name)
        return r

    async def gauge(name, n):  # waits until /metrics shows the gauge at n
        async with httpx.AsyncClient() as c:
            for _ in range(500):
                if f"\n{name} {n}\n" in (await c.get(srv.url + "/metrics")).text:
                    return True
                await asyncio.sleep(0.02)
        return False

    story = "Once upon a time, in a quiet village by the sea,"
    before = srv.metrics()["specula_preemptions_total"]

    async def main():
        running = asyncio.create_task(ask("running", 0, 1000, story))
        assert await gauge("specula_requests_running", 1), "the first request did not start"
        later = asyncio.create_task(ask("later", 5, 128))
        assert await gauge("specula_requests_waiting", 1), "the waiting request was not queued"
        sooner = asyncio.create_task(ask("sooner", -5, 128))
        seen = asyncio.create_task(gauges_while(srv.url, sooner, ("specula_requests_running", "specula_requests_waiting")))
        done = await asyncio.gather(running, later, sooner)
        return *done, await seen, await ask("alone", 0, 1000, story)

    running, later, sooner, seen, alone = asyncio.run(main())
    # One runs at a time (--max-batch 1): the preempted one, waiting to resume, is shown as waiting
    # beside the later one while the sooner one runs (shown as running beside the sooner one, it
    # would make 2 running all along). The engine's count and the server's are read apart, so for a
    # moment as the sooner one ends and the preempted one resumes both may show as running.
    assert sum(1 for s in seen if s == (1, 2)) >= 5, seen
    assert sum(1 for r, _ in seen if r > 1) <= 2, seen
    # The later one (5) waited; the sooner one (-5) preempted the running one (0), which then went on
    # before the later one and ended with the text it has alone.
    assert finished == ["sooner", "running", "later", "alone"], finished
    assert running.model_extra["speculation"]["preemptions"] == 1
    assert later.model_extra["speculation"]["preemptions"] == 0
    assert sooner.model_extra["speculation"]["preemptions"] == 0
    assert srv.metrics()["specula_preemptions_total"] - before == 1
    assert later.choices[0].text == sooner.choices[0].text  # the same prompt and settings: the same greedy text
    assert running.choices[0].text == alone.choices[0].text
    assert running.usage.completion_tokens == 1000
    assert alone.model_extra["speculation"]["preemptions"] == 0


def test_reserving_kv_as_requests_grow_runs_more_at_once_and_a_preempted_one_keeps_its_text(fresh_server):
    # 48 blocks of 16 positions: each request's prompt + 300 tokens needs ~21, so reserving
    # max_tokens at admission runs two at a time; reserving as they grow (the default) starts all
    # four, and when the pool runs out the latest admitted is preempted and later resumes. (One
    # draft a round: a request commits one or two tokens a round, so when the first has its 300 the
    # others have 150 or more, 21 + 3 x 12 blocks: the pool must run out. With the main job's K a
    # request whose drafts keep being accepted could end before the others grew.)
    prompts = ["Once upon a time, in a quiet village by the sea,", "The three laws of motion say",
               "A recipe for bread: first,", "Dear diary, today I"]

    def run(*reserve):
        srv = fresh_server(*MAIN_JOB_ARGS, "--kv-tokens", "768", "--prefix-cache", "off", *reserve)
        openai_client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)

        async def ask(prompt):
            return await openai_client.completions.create(model="x", prompt=prompt, max_tokens=300, temperature=0,
                                                          extra_body={"ignore_eos": True,
                                                                      "speculation": {"k": 1, "adaptive": False}})

        async def main():
            task = asyncio.gather(*(ask(p) for p in prompts))
            most = max((r for r, in await gauges_while(srv.url, task, ("specula_requests_running",), 0.02)), default=0)
            got = await task
            preempted = srv.metrics()["specula_preemptions_total"]
            return got, most, preempted, [await ask(p) for p in prompts]

        return asyncio.run(main())

    got, most, preempted, alone = run()
    assert most == 4, f"at most {most} of the 4 requests ran at once"
    assert preempted >= 1
    assert sum(r.model_extra["speculation"]["preemptions"] for r in got) == preempted
    assert all(a.model_extra["speculation"]["preemptions"] == 0 for a in alone)
    for prompt, r, alone in zip(prompts, got, alone):
        assert r.usage.completion_tokens == 300
        assert r.choices[0].text == alone.choices[0].text, prompt
    got, most, preempted, _ = run("--kv-reserve", "max-tokens")
    assert most == 2 and preempted == 0, (most, preempted)
    assert all(r.usage.completion_tokens == 300 for r in got)


def test_a_kv_reservation_other_than_as_needed_or_max_tokens_stops_the_server_at_start_naming_it():
    import subprocess
    from conftest import SPECULA_BIN
    r = subprocess.run([str(SPECULA_BIN), "serve", "--kv-reserve", "whole"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--kv-reserve must be as-needed or max-tokens, got 'whole'" in r.stderr, (r.returncode, r.stderr)


def test_a_chat_template_given_at_start_renders_messages_and_its_refusal_is_a_400_naming_it(fresh_server, tmp_path):
    # `serve --chat-template FILE` runs that Jinja template instead of the model's own (docs/serving.md,
    # "Chat template"): a chat request then prompts exactly what /v1/completions gets from the
    # rendered text, and a conversation the template refuses (raise_exception) is a 400 with its message.
    template = SOURCE_DIR / "tests" / "fixtures" / "chat_templates" / "mistral-instruct.jinja"
    srv = fresh_server("--draft", "ngram", "--chat-template", str(template))
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Name a colour."}]
    rendered = subprocess.run([str(SPECULA_BIN), "chat-template", "--model", str(DEFAULT_MODEL), "--chat-template",
                               str(template), "--messages", json.dumps(messages)],
                              capture_output=True, text=True, check=True).stdout
    assert rendered == "<|im_start|>[INST] Name a colour. [/INST]"  # SmolLM2's BOS text, then Mistral's format
    chat = c.chat.completions.create(model="any", messages=messages, max_tokens=12, temperature=0)
    plain = c.completions.create(model="any", prompt=rendered, max_tokens=12, temperature=0)
    assert chat.usage.prompt_tokens == plain.usage.prompt_tokens
    assert chat.choices[0].message.content == plain.choices[0].text
    # The control: the model's own template (ChatML with its default system line) prompts otherwise.
    own = openai.OpenAI(base_url=fresh_server("--draft", "ngram").url + "/v1", api_key="unused", max_retries=0, timeout=60)
    assert own.chat.completions.create(model="any", messages=messages, max_tokens=1).usage.prompt_tokens != chat.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="any", max_tokens=4, messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    assert "Conversation roles must alternate user/assistant/user/assistant/..." in str(e.value)
    after = c.chat.completions.create(model="any", messages=messages, max_tokens=2)  # the server serves on
    assert after.usage.prompt_tokens == chat.usage.prompt_tokens and after.choices[0].finish_reason in ("length", "stop")


def test_a_chat_template_that_cannot_be_used_stops_the_server_at_start_naming_it(tmp_path):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }}", encoding="utf-8")
    for spec, words in ((str(bad), "line 1"), ("vicuna", "'vicuna' is neither a built-in name")):
        proc = subprocess.run([str(SPECULA_BIN), "serve", "--model", str(DEFAULT_MODEL), "--port", "0",
                               "--chat-template", spec], capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0
        assert words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def weather_turn(city, i):
    """A turn in which the assistant called the weather tool: after a few, greedy, the model does it again."""
    return [{"role": "user", "content": f"What is the weather in {city}?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call{i}", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]},
            {"role": "tool", "tool_call_id": f"call{i}", "content": "Sunny."},
            {"role": "assistant", "content": f"It is sunny in {city}."}]


WEATHER_TURNS = weather_turn("Paris", 1) + weather_turn("Berlin", 2) + weather_turn("Madrid", 3)


def test_tool_choice_auto_with_a_template_that_writes_tools_reads_calls_in_the_models_own_syntax(fresh_server):
    # A template that writes tools and calls (Qwen2.5's: Hermes' <tool_call> blocks) is handed the
    # request's tools and earlier calls, the reply is not constrained, and <tool_call> blocks in it
    # come back as calls (vLLM's hermes parser, llama.cpp's --jinja); other replies are text.
    template = SOURCE_DIR / "tests" / "fixtures" / "chat_templates" / "qwen2.5.jinja"
    srv = fresh_server("--draft", "ngram", "--chat-template", str(template))
    assert "tool calls in the model's own hermes syntax" in srv.output()
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    weather = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

    ask = WEATHER_TURNS + [{"role": "user", "content": "What is the weather in Rome?"}]
    args = dict(model="any", messages=ask, tools=[weather], max_tokens=60, temperature=0)
    r = c.chat.completions.create(**args)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    assert [(t.function.name, json.loads(t.function.arguments)) for t in choice.message.tool_calls] == [("get_weather", {"city": "Rome"})]
    content, calls, finishes = streamed_tool_reply(c, args)
    assert finishes == ["tool_calls"] and content == "" and calls == {0: ("get_weather", choice.message.tool_calls[0].function.arguments)}
    # The control: with tool_choice "none" the same reply is the model's raw text, its call syntax and all.
    raw = c.chat.completions.create(**{**args, "tool_choice": "none"}).choices[0]
    assert raw.message.tool_calls is None and "<tool_call>" in raw.message.content, raw
    # A request the model answers in words is text, and its prompt is the template's with the tools
    # (what `specula chat-template --tools` prints), not the generic format's system message.
    joke = [{"role": "user", "content": "Tell me a joke."}]
    r = c.chat.completions.create(model="any", messages=joke, tools=[weather], max_tokens=12, temperature=0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content and r.choices[0].finish_reason == "length"
    # Streamed, such a reply goes out as it is generated (it cannot become a call), not at its end.
    pieces = [ch.choices[0].delta.content for ch in c.chat.completions.create(
        model="any", messages=joke, tools=[weather], max_tokens=12, temperature=0, stream=True)
        if ch.choices and ch.choices[0].delta.content]
    assert len(pieces) > 2 and "".join(pieces) == r.choices[0].message.content, pieces
    rendered = subprocess.run([str(SPECULA_BIN), "chat-template", "--model", str(DEFAULT_MODEL), "--chat-template", str(template),
                               "--messages", json.dumps(joke), "--tools", json.dumps([weather])],
                              capture_output=True, text=True, check=True)
    assert "call syntax hermes" in rendered.stderr and "<tools>\n" + json.dumps(weather) + "\n</tools>" in rendered.stdout
    plain = c.completions.create(model="any", prompt=rendered.stdout, max_tokens=12, temperature=0)
    assert r.usage.prompt_tokens == plain.usage.prompt_tokens and r.choices[0].message.content == plain.choices[0].text
    # /tokenize counts the same prompt when given the tools (vLLM's field), and another without them.
    counted = httpx.post(srv.url + "/tokenize", json={"messages": joke, "tools": [weather]}, timeout=30).json()["count"]
    alone = httpx.post(srv.url + "/tokenize", json={"messages": joke}, timeout=30).json()["count"]
    assert counted == r.usage.prompt_tokens and alone < counted, (counted, alone, r.usage.prompt_tokens)
    # A conversation long enough to be templated on the preparation thread keeps its tools too.
    long = [{"role": "user", "content": "=" * 20_000 + " Tell me a joke."}]
    counted = httpx.post(srv.url + "/tokenize", json={"messages": long, "tools": [weather]}, timeout=60).json()["count"]
    alone = httpx.post(srv.url + "/tokenize", json={"messages": long}, timeout=60).json()["count"]
    r = c.chat.completions.create(model="any", messages=long, tools=[weather], max_tokens=1, temperature=0)
    assert counted == r.usage.prompt_tokens and counted - alone == 164, (counted, alone, r.usage.prompt_tokens)
    # parallel_tool_calls: after turns of two calls each the model calls twice; false keeps the first.
    pairs = [("Paris", "Lyon"), ("Berlin", "Bonn"), ("Madrid", "Seville")]
    two = [m for i, (a, b) in enumerate(pairs) for m in (
        {"role": "user", "content": f"What is the weather in {a} and {b}?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}{k}", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
            for k, city in enumerate((a, b))]},
        {"role": "tool", "tool_call_id": f"c{i}0", "content": "Sunny."},
        {"role": "tool", "tool_call_id": f"c{i}1", "content": "Sunny."},
        {"role": "assistant", "content": f"It is sunny in {a} and {b}."})]
    two.append({"role": "user", "content": "What is the weather in Rome and Milan?"})
    cities = {}
    for parallel in (True, False):
        r = c.chat.completions.create(model="any", messages=two, tools=[weather], max_tokens=80, temperature=0,
                                      parallel_tool_calls=parallel)
        cities[parallel] = [json.loads(t.function.arguments)["city"] for t in r.choices[0].message.tool_calls]
    assert cities == {True: ["Rome", "Milan"], False: ["Rome"]}, cities
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="any", messages=two, tools=[weather], max_tokens=4, extra_body={"parallel_tool_calls": "yes"})
    assert "parallel_tool_calls must be true or false" in str(e.value)


@pytest.mark.parametrize("template_name", ["qwen2.5.jinja", "llama3.1.jinja"])
def test_calls_in_the_models_own_syntax_are_held_to_the_tools_schemas_and_stream_as_they_are_written(fresh_server, template_name):
    """With a template that writes Hermes' <tool_call> blocks (Qwen2.5's) or Llama 3's JSON calls,
    "auto"'s calls are held to the tools' schemas (llama.cpp's lazy grammar: from <tool_call> on, or
    where the reply opens with '{'): a city the schema does not list is not written, where
    --tool-call-grammar off (the control, vLLM's way) writes it. Held calls stream as they are
    written, a name first and then the arguments in pieces, joined equal to the reply not streamed;
    a call cut by max_tokens keeps its arguments so far with finish "length"."""
    template = SOURCE_DIR / "tests" / "fixtures" / "chat_templates" / template_name
    cities = ["Paris", "Berlin", "Madrid"]
    weather = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": cities}}, "required": ["city"]}}}

    ask = WEATHER_TURNS + [{"role": "user", "content": "What is the weather in Rome?"}]
    args = dict(model="any", messages=ask, tools=[weather], max_tokens=60, temperature=0)
    written = {}
    for grammar in ("off", "on"):
        srv = fresh_server("--draft", "ngram", "--chat-template", str(template), "--tool-call-grammar", grammar)
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        if template_name.startswith("llama3"):  # the small model answers Llama 3's prompt in words: opened with '{' by a bias
            brace = httpx.post(srv.url + "/tokenize", json={"prompt": "{"}, timeout=30).json()["tokens"]
            args["logit_bias"] = {str(brace[0]): 10}
        r = c.chat.completions.create(**args)
        calls = r.choices[0].message.tool_calls
        written[grammar] = [json.loads(t.function.arguments)["city"] for t in calls or []]
        if grammar == "on":
            assert r.choices[0].finish_reason == "tool_calls" and calls and calls[0].function.name == "get_weather", r
    # Held, every city is the schema's; read as written, the model names Rome (Qwen2.5's
    # template) or writes no well-formed call at all (Llama 3's).
    assert written["on"] and set(written["on"]) <= set(cities), written
    assert written["off"] == (["Rome"] if template_name.startswith("qwen") else []), written
    # (c: the server with the grammar) Streamed: the call's name first, then its arguments in pieces.
    pieces = []
    content, streamed, finishes = streamed_tool_reply(c, args, pieces)
    assert finishes == ["tool_calls"] and content == "" and streamed == {
        i: ("get_weather", t.function.arguments) for i, t in enumerate(calls)}
    assert len(pieces) > 2, pieces
    # Cut by max_tokens inside its arguments: the call begun, its arguments so far, finish "length".
    whole = calls[0].function.arguments
    for max_tokens in range(6, 30):
        cut = c.chat.completions.create(**{**args, "max_tokens": max_tokens}).choices[0]
        if cut.finish_reason == "length" and cut.message.tool_calls and cut.message.tool_calls[0].function.arguments != whole:
            break
    else:
        pytest.fail("no max_tokens cut the call inside its arguments")
    so_far = cut.message.tool_calls[0].function.arguments
    assert whole.startswith(so_far) and cut.message.content is None, cut
    assert streamed_tool_reply(c, {**args, "max_tokens": max_tokens}) == ("", {0: ("get_weather", so_far)}, ["length"])
    assert len(cut.message.tool_calls) == 1


def test_call_ids_are_nine_letters_and_digits_for_a_template_that_writes_calls_as_mistrals_do(fresh_server):
    # Mistral's templates refuse a conversation whose call ids are not 9 letters and digits; the
    # calls this server returns can be sent back to it as they are.
    template = SOURCE_DIR / "tests" / "fixtures" / "tool_templates" / "mistral-tools-like.jinja"
    srv = fresh_server("--draft", "ngram", "--chat-template", str(template))
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = c.chat.completions.create(model="any", messages=ask, tools=[WEATHER], tool_choice="required", max_tokens=200, temperature=0)
    calls = r.choices[0].message.tool_calls
    assert calls and all(len(t.id) == 9 and t.id.isalnum() for t in calls), r.choices[0]
    back = ask + [{"role": "assistant", "content": None, "tool_calls": [t.model_dump() for t in calls]},
                  {"role": "tool", "tool_call_id": calls[0].id, "content": "Sunny."}]
    answered = c.chat.completions.create(model="any", messages=back, max_tokens=2)  # not refused
    assert answered.choices[0].finish_reason in ("length", "stop") and answered.usage.prompt_tokens > len(ask[0]["content"]) // 4
    back[1]["tool_calls"][0]["id"] = back[2]["tool_call_id"] = "call_1"  # the control: the template refuses another id
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="any", messages=back, max_tokens=2)
    assert "Tool call IDs should be alphanumeric strings with length 9!" in str(e.value)


def test_the_tool_call_parser_option_forces_a_format_or_stops_the_server_at_start_naming_why(fresh_server):
    # vLLM's --tool-call-parser: "generic" serves tools in llama.cpp's generic format even where the
    # template writes them (the prompt then describes them in the system message, not the template's
    # way); a syntax the template cannot serve, or an unknown name, stops `serve` with one line.
    template = SOURCE_DIR / "tests" / "fixtures" / "chat_templates" / "qwen2.5.jinja"
    srv = fresh_server("--draft", "ngram", "--chat-template", str(template), "--tool-call-parser", "generic")
    joke = [{"role": "user", "content": "Tell me a joke."}]
    native = subprocess.run([str(SPECULA_BIN), "chat-template", "--model", str(DEFAULT_MODEL), "--chat-template", str(template),
                             "--messages", json.dumps(joke), "--tools", json.dumps([WEATHER])],
                            capture_output=True, text=True, check=True).stdout
    native_count = httpx.post(srv.url + "/tokenize", json={"prompt": native}, timeout=30).json()["count"]
    generic_count = httpx.post(srv.url + "/tokenize", json={"messages": joke, "tools": [WEATHER]}, timeout=30).json()["count"]
    assert generic_count != native_count, (generic_count, native_count)
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    r = c.chat.completions.create(model="any", messages=joke, tools=[WEATHER], max_tokens=60, temperature=0)
    assert r.usage.prompt_tokens == generic_count
    assert "own hermes syntax" not in srv.output() and "<tool_call>" not in (r.choices[0].message.content or "")
    for args, words in ((["--tool-call-parser", "hermes"], "the chat template does not write the tools it is handed"),
                        (["--tool-call-parser", "pythonic"], "--tool-call-parser must be auto, generic, hermes, llama3_json or mistral")):
        proc = subprocess.run([str(SPECULA_BIN), "serve", "--model", str(DEFAULT_MODEL), "--port", "0", *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


PREFILL = [{"role": "user", "content": "What is the capital of France?"},
           {"role": "assistant", "content": "The capital of France is"}]


def test_continue_final_message_continues_a_prefilled_reply_as_vllm_does(server, client, model_id):
    """vLLM's continue_final_message (with add_generation_prompt false): the last message left
    open, so the reply continues it; its prompt is /tokenize's with the same fields, and the reply
    is what /v1/completions gives for those tokens."""
    fields = {"add_generation_prompt": False, "continue_final_message": True}
    r = client.chat.completions.create(model=model_id, messages=PREFILL, max_tokens=12, temperature=0, extra_body=fields)
    tok = httpx.post(server.url + "/tokenize", json={"messages": PREFILL, **fields}, timeout=30).json()
    assert r.usage.prompt_tokens == tok["count"]
    prompt = httpx.post(server.url + "/detokenize", json={"tokens": tok["tokens"]}, timeout=30).json()["prompt"]
    assert prompt.endswith("<|im_start|>assistant\nThe capital of France is"), prompt
    plain = client.completions.create(model=model_id, prompt=tok["tokens"], max_tokens=12, temperature=0)
    assert r.choices[0].message.content == plain.choices[0].text and r.choices[0].message.content
    # The control: without it the assistant's turn is closed and a new one opened (a longer prompt).
    closed = httpx.post(server.url + "/tokenize", json={"messages": PREFILL}, timeout=30).json()
    closed_text = httpx.post(server.url + "/detokenize", json={"tokens": closed["tokens"]}, timeout=30).json()["prompt"]
    assert closed_text.endswith("The capital of France is<|im_end|>\n<|im_start|>assistant\n"), closed_text
    # add_generation_prompt false alone: the conversation as it stands, its last turn closed.
    bare = httpx.post(server.url + "/tokenize", json={"messages": PREFILL, "add_generation_prompt": False}, timeout=30).json()
    text = httpx.post(server.url + "/detokenize", json={"tokens": bare["tokens"]}, timeout=30).json()["prompt"]
    assert text.endswith("The capital of France is<|im_end|>\n"), text
    # Streamed the same.
    streamed = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
        model=model_id, messages=PREFILL, max_tokens=12, temperature=0, extra_body=fields, stream=True) if ch.choices)
    assert streamed == r.choices[0].message.content
    # A conversation long enough to be templated on the preparation thread keeps the fields.
    long = [{"role": "user", "content": "=" * 17000}] + PREFILL  # 17 KB in ~270 tokens
    r = client.chat.completions.create(model=model_id, messages=long, max_tokens=4, temperature=0, extra_body=fields)
    tok = httpx.post(server.url + "/tokenize", json={"messages": long, **fields}, timeout=30).json()
    assert r.usage.prompt_tokens == tok["count"]
    tail = httpx.post(server.url + "/detokenize", json={"tokens": tok["tokens"][-12:]}, timeout=30).json()["prompt"]
    assert tail.endswith("assistant\nThe capital of France is"), tail
    assert client.completions.create(model=model_id, prompt=tok["tokens"], max_tokens=4, temperature=0).choices[0].text == \
        r.choices[0].message.content


def test_bad_chat_template_fields_are_400s_naming_the_field(server):
    post = lambda body, path="/v1/chat/completions": httpx.post(server.url + path, json={"messages": PREFILL, **body}, timeout=30)
    for body, param, words in (
            ({"continue_final_message": True}, "continue_final_message", "add_generation_prompt: false"),
            ({"add_generation_prompt": "no"}, "add_generation_prompt", "true or false"),
            ({"chat_template_kwargs": [1]}, "chat_template_kwargs", "an object"),
            ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs", "'messages'"),
            ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs", "own field"),
            ({"chat_template_kwargs": {"continue_final_message": True}}, "chat_template_kwargs", "own field")):
        for path in ("/v1/chat/completions", "/tokenize"):
            r = post(body, path)
            assert r.status_code == 400 and r.json()["error"]["param"] == param and words in r.text, (path, body, r.text)
    blank = [PREFILL[0], {"role": "assistant", "content": "  "}]
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "messages": blank, "add_generation_prompt": False, "continue_final_message": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages" and "text to continue" in r.text, r.text
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200


THINKING_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                     "{% if add_generation_prompt %}<|im_start|>assistant\n"
                     "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")


def test_chat_template_kwargs_reach_the_template_as_variables(fresh_server, tmp_path):
    """vLLM's chat_template_kwargs (e.g. Qwen3's enable_thinking: false): more variables for the
    template, shown in the prompt the request is answered from."""
    template = tmp_path / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE, encoding="utf-8")
    srv = fresh_server("--draft", "ngram", "--chat-template", str(template))
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    ask = [{"role": "user", "content": "Name a colour."}]
    prompts = {}
    for name, kwargs in (("off", {"enable_thinking": False}), ("on", {"enable_thinking": True}), ("none", None)):
        body = {"messages": ask, **({"chat_template_kwargs": kwargs} if kwargs else {})}
        tok = httpx.post(srv.url + "/tokenize", json=body, timeout=30).json()
        prompts[name] = httpx.post(srv.url + "/detokenize", json={"tokens": tok["tokens"]}, timeout=30).json()["prompt"]
        r = c.chat.completions.create(model="any", messages=ask, max_tokens=4, temperature=0,
                                      extra_body={"chat_template_kwargs": kwargs} if kwargs else {})
        assert r.usage.prompt_tokens == tok["count"]
    assert prompts["off"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), prompts["off"]
    assert prompts["on"] == prompts["none"] and "<think>" not in prompts["on"]


# A reasoning model's template, DeepSeek R1's way: the reply opened inside <think> (Qwen3's
# enable_thinking false writes an empty block instead), earlier replies' reasoning left out.
REASONING_TEMPLATE = (
    "{% for m in messages %}{% set c = m.content %}{% if m.role == 'assistant' and '</think>' in c %}"
    "{% set c = c.split('</think>')[-1] %}{% endif %}<|im_start|>{{ m.role }}\n{{ c }}"
    "{% if not loop.last or m.role != 'assistant' %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}")


def streamed_reply(client, args):
    """A streamed chat reply put together: its reasoning_content, its content, its finish reasons."""
    reasoning, content, finishes = "", "", []
    for chunk in client.chat.completions.create(**args, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        content += delta.content or ""
        if chunk.choices[0].finish_reason:
            finishes.append(chunk.choices[0].finish_reason)
    return reasoning, content, finishes


def test_a_reasoning_models_thinking_comes_back_apart_as_reasoning_content(fresh_server, tmp_path):
    """With a template that writes </think>, a chat reply's reasoning is `reasoning_content` and
    what follows </think> is `content` (vLLM's deepseek_r1 reasoning parser, llama.cpp's
    reasoning_format deepseek), streamed the same; each split is the raw completion of the same
    prompt tokens cut at </think>. include_reasoning false leaves the reasoning out; a template
    that closes the block in the prompt (enable_thinking false) makes the reply all content;
    --reasoning-parser none (the control) leaves the text whole."""
    template = tmp_path / "reasoning.jinja"
    template.write_text(REASONING_TEMPLATE, encoding="utf-8")
    srv = fresh_server("--draft", "ngram", "--chat-template", str(template))
    assert "returned apart as reasoning_content" in srv.output()
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    ask = [{"role": "user", "content": "Is the sky blue?"}]

    def raw(messages, **fields):  # the same prompt's tokens, completed without a template or parser
        tok = httpx.post(srv.url + "/tokenize", json={"messages": messages, **{k: v for k, v in fields.items()
                         if k in ("add_generation_prompt", "continue_final_message", "chat_template_kwargs")}}, timeout=30).json()
        body = {"prompt": tok["tokens"], "temperature": 0, **{k: v for k, v in fields.items()
                if k in ("max_tokens", "logit_bias", "min_tokens")}}
        return httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]

    r = c.chat.completions.create(model="any", messages=ask, max_tokens=20, temperature=0)
    message = r.choices[0].message
    whole = raw(ask, max_tokens=20)
    assert "</think>" not in whole and message.reasoning_content == whole and message.content is None, message
    assert streamed_reply(c, dict(model="any", messages=ask, max_tokens=20, temperature=0)) == (
        whole, "", [r.choices[0].finish_reason])
    # A prefilled reply that is still reasoning, nudged to close it (a bias on "</"; min_tokens
    # keeps it going after): the reasoning before </think>, the answer after it.
    closed = 0
    for bias in (4, 5):
        prefill = ask + [{"role": "assistant", "content": "<think>\nThe sky is blue.\n"}]
        fields = dict(max_tokens=24, logit_bias={"9617": bias}, min_tokens=6, add_generation_prompt=False,
                      continue_final_message=True)
        text = raw(prefill, **fields)
        extra = {k: fields[k] for k in ("logit_bias", "min_tokens", "add_generation_prompt", "continue_final_message")}
        args = dict(model="any", messages=prefill, max_tokens=24, temperature=0, extra_body=extra)
        m = c.chat.completions.create(**args).choices[0].message
        if "</think>" in text:
            closed += 1
            before, after = text.split("</think>", 1)
            assert (m.reasoning_content, m.content) == (before, after), (m, text)
            assert streamed_reply(c, args)[:2] == (before, after)
            hidden_args = {**args, "extra_body": {**extra, "include_reasoning": False}}
            hidden = c.chat.completions.create(**hidden_args).choices[0].message
            assert getattr(hidden, "reasoning_content", None) is None and hidden.content == after
            assert streamed_reply(c, hidden_args)[:2] == ("", after)
        else:
            assert (m.reasoning_content, m.content) == (text, None), (m, text)
    assert closed >= 1, "no case closed its reasoning: the split went untested"
    # A prefill that is not reasoning: the continuation is all answer.
    prefill = ask + [{"role": "assistant", "content": "The sky is"}]
    fields = dict(max_tokens=8, add_generation_prompt=False, continue_final_message=True)
    m = c.chat.completions.create(model="any", messages=prefill, max_tokens=8, temperature=0,
                                  extra_body={"add_generation_prompt": False, "continue_final_message": True}).choices[0].message
    assert m.content == raw(prefill, **fields) and getattr(m, "reasoning_content", None) is None
    # enable_thinking false: the template closes the block itself, and the reply is the answer.
    off = dict(model="any", messages=ask, max_tokens=12, temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    m = c.chat.completions.create(**off).choices[0].message
    assert m.content == raw(ask, max_tokens=12, chat_template_kwargs={"enable_thinking": False}) and m.content
    assert getattr(m, "reasoning_content", None) is None
    # The control: without the parser the same request's text is whole, as content.
    plain = fresh_server("--draft", "ngram", "--chat-template", str(template), "--reasoning-parser", "none")
    assert "reasoning_content" not in plain.output()
    p = openai.OpenAI(base_url=plain.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    m = p.chat.completions.create(model="any", messages=ask, max_tokens=20, temperature=0).choices[0].message
    assert m.content == whole and getattr(m, "reasoning_content", None) is None


def hand_written_grammar_after_think(answer, opened=True):
    """GBNF written here, not by the server: any text without </think>, </think>, then `answer`
    (rule t_i: the text ends with the marker's first i characters; '<' begins it and occurs in it
    once, so any other character that breaks the marker goes back to t0); not `opened`, either
    whitespace, <think> and that, or `answer` alone."""
    marker = "</think>"
    rules = ["root ::= t0" if opened else 'root ::= [ \\t\\n\\r]{0,20} "<think>" t0 | answer']
    for i, ch in enumerate(marker):
        after = "answer" if i + 1 == len(marker) else f"t{i + 1}"
        rules.append(f't{i} ::= [^<{ch}] t0 | "<" t1 | "{ch}" {after}' if i else f't0 ::= [^<] t0 | "<" t1')
    return "\n".join(rules) + "\nanswer ::= " + answer + "\n"


def test_a_constrained_reply_reasons_first_and_its_grammar_starts_after_think(fresh_server, tmp_path):
    """With a template that opens <think>, a reply held to a constraint reasons first and is held
    to it only after </think>, as vLLM's structured outputs are with a reasoning parser: the chat
    reply equals /v1/completions of the same prompt tokens under a grammar written here for 'text
    without </think>, </think>, then the choice' (nudged to close its block by a bias on the
    marker's tokens), streamed the same; a JSON schema's and JSON mode's answers are JSON;
    enable_thinking false (the prompt closes the block) holds the reply from its start, and
    --reasoning-parser none (the control) holds the whole reply."""
    template = tmp_path / "reasoning.jinja"
    template.write_text(REASONING_TEMPLATE, encoding="utf-8")
    srv = fresh_server("--draft", "ngram", "--chat-template", str(template))
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    ask = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]
    prompt = httpx.post(srv.url + "/tokenize", json={"messages": ask}, timeout=30).json()["tokens"]
    marker_tokens = httpx.post(srv.url + "/tokenize", json={"prompt": "</think>"}, timeout=30).json()["tokens"]
    assert len(marker_tokens) > 1  # text, not a special token: the grammar can write it
    choice = ["yes", "no"]
    closed = None
    for bias in (3, 5, 8):
        logit_bias = {str(t): bias for t in marker_tokens}
        text = httpx.post(srv.url + "/v1/completions", timeout=60, json={
            "prompt": prompt, "temperature": 0, "max_tokens": 40, "logit_bias": logit_bias,
            "grammar": hand_written_grammar_after_think('"yes" | "no"')}).json()["choices"][0]["text"]
        args = dict(model="any", messages=ask, max_tokens=40, temperature=0, logit_bias=logit_bias,
                    extra_body={"guided_choice": choice})
        r = c.chat.completions.create(**args)
        m = r.choices[0].message
        if "</think>" in text:
            before, after = text.split("</think>", 1)
            assert (m.reasoning_content, m.content) == (before, after) and after in choice, (m, text)
            assert r.choices[0].finish_reason == "stop"
            assert streamed_reply(c, args) == (before, after, ["stop"])
            closed = logit_bias
        else:
            assert (m.reasoning_content, m.content) == (text, None), (m, text)
    assert closed is not None, "no reply closed its reasoning: the grammar after it went untested"
    schema = {"type": "object", "properties": {"sky": {"type": "string", "enum": ["blue", "grey"]}}, "required": ["sky"]}
    for fmt in ({"type": "json_schema", "json_schema": {"name": "sky", "schema": schema}}, {"type": "json_object"}):
        r = c.chat.completions.create(model="any", messages=ask, max_tokens=60, temperature=0, logit_bias=closed,
                                      response_format=fmt)
        m = r.choices[0].message
        assert isinstance(m.reasoning_content, str) and "</think>" not in m.reasoning_content, m
        if r.choices[0].finish_reason == "stop" or fmt["type"] == "json_schema":  # (JSON mode's object may run past max_tokens)
            answer = json.loads(m.content)
            assert isinstance(answer, dict) and (fmt["type"] == "json_object" or answer["sky"] in ("blue", "grey")), m
    # A grammar's own fault is named as before, not in the rules wrapped around it.
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="any", messages=ask, max_tokens=4, extra_body={"grammar": 'start ::= "a"\n'})
    assert "no rule named 'root'" in str(e.value) and "block" not in str(e.value), e.value
    # The prompt closes the block itself: the reply may open one of its own (this model does, its
    # prompt ending "<think>\n\n</think>\n\n") or answer at once; either way the split is
    # the completion's under the grammar written here for a reply that starts outside the block.
    kwargs = {"enable_thinking": False}
    off_prompt = httpx.post(srv.url + "/tokenize", json={"messages": ask, "chat_template_kwargs": kwargs}, timeout=30).json()["tokens"]
    assert off_prompt != prompt
    for bias in (None, closed):
        text = httpx.post(srv.url + "/v1/completions", timeout=60, json={
            "prompt": off_prompt, "temperature": 0, "max_tokens": 40, "logit_bias": bias,
            "grammar": hand_written_grammar_after_think('"yes" | "no"', opened=False)}).json()["choices"][0]["text"]
        off = c.chat.completions.create(model="any", messages=ask, max_tokens=40, temperature=0, logit_bias=bias, extra_body={
            "guided_choice": choice, "chat_template_kwargs": kwargs}).choices[0].message
        start = text.lstrip()
        if not start.startswith("<think>"):
            assert (off.content, getattr(off, "reasoning_content", None)) == (text, None) and text in choice, (off, text)
        elif "</think>" in start:
            assert (off.reasoning_content, off.content) == tuple(start[len("<think>"):].split("</think>", 1)), (off, text)
        else:
            assert (off.reasoning_content, off.content) == (start[len("<think>"):], None), (off, text)
    # The control: without the parser the grammar holds the whole reply.
    plain = fresh_server("--draft", "ngram", "--chat-template", str(template), "--reasoning-parser", "none")
    p = openai.OpenAI(base_url=plain.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    m = p.chat.completions.create(model="any", messages=ask, max_tokens=8, temperature=0,
                                  extra_body={"guided_choice": choice}).choices[0].message
    assert m.content in choice and getattr(m, "reasoning_content", None) is None, m


def test_documents_reach_a_template_that_writes_them(fresh_server, tmp_path, server):
    """vLLM's documents (retrieval templates': Command R's, Granite's) are the template's `documents`
    variable; chat_template_kwargs may set its own instead (vLLM's merge); anything but an array of
    objects of strings is a 400 naming the field."""
    template = tmp_path / "documents.jinja"
    template.write_text("{% for d in documents %}[{{ d.title }}: {{ d.text }}]{% endfor %}"
                        "{% for m in messages %}{{ m.content }}|{% endfor %}", encoding="utf-8")
    srv = fresh_server("--draft", "ngram", "--chat-template", str(template))
    ask = [{"role": "user", "content": "Which is older?"}]
    docs = [{"title": "Rome", "text": "Founded 753 BC."}, {"title": "Paris", "text": "Founded 3rd century BC."}]

    def rendered(**fields):
        tok = httpx.post(srv.url + "/tokenize", json={"messages": ask, **fields}, timeout=30).json()
        return httpx.post(srv.url + "/detokenize", json={"tokens": tok["tokens"]}, timeout=30).json()["prompt"]
    assert rendered(documents=docs) == "[Rome: Founded 753 BC.][Paris: Founded 3rd century BC.]Which is older?|"
    assert rendered(documents=docs, chat_template_kwargs={"documents": [{"title": "X", "text": "y"}]}) == "[X: y]Which is older?|"
    r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={"messages": ask, "documents": docs, "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(
        httpx.post(srv.url + "/tokenize", json={"messages": ask, "documents": docs}, timeout=30).json()["tokens"])
    for bad in ("a", [1], [{"title": 5}]):
        r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={"messages": ask, "documents": bad, "max_tokens": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "documents", r.text


def test_an_assistants_reasoning_content_sent_back_reaches_the_template(fresh_server, tmp_path, server):
    """A conversation sent back with an assistant's reasoning_content (or vLLM's newer `reasoning`)
    hands it to a template that reads it (Qwen3's does); a non-string one is a 400 naming it."""
    template = tmp_path / "reads_reasoning.jinja"
    template.write_text("{% for m in messages %}{% if m.reasoning_content is string %}[{{ m.reasoning_content }}]{% endif %}"
                        "{{ m.content }}|{% endfor %}", encoding="utf-8")
    srv = fresh_server("--draft", "ngram", "--chat-template", str(template))
    for key in ("reasoning_content", "reasoning"):
        messages = [{"role": "user", "content": "Is 7 prime?"}, {"role": "assistant", "content": "Yes.", key: "no divisors"},
                    {"role": "user", "content": "And 9?"}]
        tok = httpx.post(srv.url + "/tokenize", json={"messages": messages}, timeout=30).json()
        text = httpx.post(srv.url + "/detokenize", json={"tokens": tok["tokens"]}, timeout=30).json()["prompt"]
        assert text == "Is 7 prime?|[no divisors]Yes.|And 9?|", text
    bare = [{"role": "user", "content": "Is 7 prime?"}, {"role": "assistant", "content": "Yes."}]
    tok = httpx.post(srv.url + "/tokenize", json={"messages": bare}, timeout=30).json()
    assert httpx.post(srv.url + "/detokenize", json={"tokens": tok["tokens"]}, timeout=30).json()["prompt"] == "Is 7 prime?|Yes.|"
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "assistant", "content": "x", "reasoning_content": 5}, {"role": "user", "content": "y"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].reasoning_content", r.text
