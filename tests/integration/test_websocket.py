"""The WebSocket protocol of docs/protocol.md: streaming, statistics, draft flags, several
generations on one socket, cancel."""
import asyncio
import json

from websockets.asyncio.client import connect

from conftest import collect, collect_all

# A prompt that repeats itself, so the n-gram drafter finds matches and drafts get accepted.
REPEAT = "one two three four five six seven eight nine ten " * 6
STATS = {"prompt_tokens", "completion_tokens", "rounds", "drafted", "accepted", "acceptance_rate",
         "mean_accepted_length", "mean_confidence_threshold", "preemptions", "ttft_ms", "elapsed_ms", "tokens_per_second"}


def generate(gen_id, **fields):
    msg = {"type": "generate", "id": gen_id, "messages": [{"role": "user", "content": "Say hello."}],
           "max_tokens": 12, "temperature": 0}
    msg.update(fields)
    return json.dumps(msg)


def test_a_generation_streams_tokens_and_ends_with_done_and_stats(server):
    async def main():
        async with connect(server.ws_url) as ws:
            await ws.send(generate("g1"))
            tokens, done = await collect(ws, "g1")
            assert done["type"] == "done", done
            assert done["finish_reason"] in ("stop", "length")
            assert set(done["stats"]) >= STATS
            assert tokens, "no token event before done"
            for ev in tokens:
                assert ev["count"] == len(ev["tokens"])
                assert ev["text"] == "".join(t["text"] for t in ev["tokens"]) or ev["count"] == 0
            assert sum(ev["count"] for ev in tokens) == done["stats"]["completion_tokens"]
            assert done["stats"]["ttft_ms"] > 0 and done["stats"]["elapsed_ms"] >= done["stats"]["ttft_ms"]
            assert isinstance(done["seed"], int)
            # This server drafts with prompt lookup alone: no confidence rule, so no threshold.
            assert done["stats"]["mean_confidence_threshold"] == 0
    asyncio.run(main())


def test_draft_flags_count_exactly_the_accepted_draft_tokens(server):
    async def main():
        async with connect(server.ws_url) as ws:
            await ws.send(json.dumps({"type": "generate", "id": 7, "prompt": REPEAT, "max_tokens": 24,
                                      "temperature": 0, "speculation": {"k": 4}}))
            tokens, done = await collect(ws, 7)
            assert done["type"] == "done", done
            drafted = [t for ev in tokens for t in ev["tokens"] if t["draft"]]
            assert len(drafted) == done["stats"]["accepted"]
            assert done["stats"]["accepted"] > 0, "the n-gram drafter accepted nothing on a repeating prompt"
            assert any(ev["count"] > 1 for ev in tokens), "a round's tokens were never coalesced into one event"
            assert 0 < done["stats"]["acceptance_rate"] <= 1
    asyncio.run(main())


def test_two_generations_run_on_one_socket_keyed_by_id(server):
    async def main():
        async with connect(server.ws_url) as ws:
            await ws.send(generate("a", max_tokens=8))
            await ws.send(generate("b", max_tokens=10, messages=[{"role": "user", "content": "Count to five."}]))
            texts, ends = await collect_all(ws, ["a", "b"])
            assert ends["a"]["type"] == ends["b"]["type"] == "done"
            assert ends["a"]["stats"]["completion_tokens"] <= 8
            assert ends["b"]["stats"]["completion_tokens"] <= 10
            assert texts["a"] and texts["b"]
    asyncio.run(main())


def test_greedy_output_is_the_same_alone_and_beside_another_generation(server):
    async def main():
        async with connect(server.ws_url) as ws:
            await ws.send(generate("solo", max_tokens=10))
            tokens, _ = await collect(ws, "solo")
            solo = "".join(ev["text"] for ev in tokens)
            await ws.send(generate("pair", max_tokens=10))
            await ws.send(generate("other", max_tokens=10, messages=[{"role": "user", "content": "Name a colour."}]))
            tokens, _ = await collect(ws, "pair")
            assert "".join(ev["text"] for ev in tokens) == solo
    asyncio.run(main())


def test_cancel_ends_a_generation_with_finish_reason_cancelled(server):
    async def main():
        async with connect(server.ws_url) as ws:
            await ws.send(generate("long", max_tokens=400, temperature=0.8, seed=1))
            async with asyncio.timeout(60):
                while json.loads(await ws.recv())["type"] != "token":
                    pass
            await ws.send(json.dumps({"type": "cancel", "id": "long"}))
            tokens, done = await collect(ws, "long")
            assert done["type"] == "done" and done["finish_reason"] == "cancelled", done
            assert done["stats"]["completion_tokens"] < 400
            # The id is free again and a cancel for an unknown id is ignored.
            await ws.send(json.dumps({"type": "cancel", "id": "nothing-runs-under-this-id"}))
            await ws.send(generate("long", max_tokens=3))
            _, again = await collect(ws, "long")
            assert again["type"] == "done"
    asyncio.run(main())


def test_a_stop_string_ends_the_text_before_it(server):
    async def main():
        async with connect(server.ws_url) as ws:
            await ws.send(generate("free", max_tokens=16))
            tokens, free = await collect(ws, "free")
            assert free["stop_reason"] is None, free  # the end token or max_tokens
            text = "".join(ev["text"] for ev in tokens)
            words = text.split()
            assert len(words) >= 3, text
            stop = words[len(words) // 2]
            await ws.send(generate("s", max_tokens=16, stop=[stop, "never appears"]))
            tokens, done = await collect(ws, "s")
            cut = "".join(ev["text"] for ev in tokens)
            assert done["finish_reason"] == "stop", (done, cut)
            assert cut == text[:text.index(stop)]
            assert done["stop_reason"] == stop  # which one ended it
            await ws.send(generate("kept", max_tokens=16, stop=[stop], include_stop_str_in_output=True))
            tokens, done = await collect(ws, "kept")
            assert "".join(ev["text"] for ev in tokens) == text[:text.index(stop) + len(stop)]
    asyncio.run(main())


def test_the_same_seed_gives_the_same_sampled_text(server):
    async def main():
        async with connect(server.ws_url) as ws:
            texts = []
            for gen_id in ("x", "y"):
                await ws.send(generate(gen_id, max_tokens=10, temperature=1.0, seed=1234))
                tokens, done = await collect(ws, gen_id)
                assert done["seed"] == 1234
                texts.append("".join(ev["text"] for ev in tokens))
            assert texts[0] == texts[1]
    asyncio.run(main())


def test_a_json_schema_and_a_grammar_constrain_a_streamed_generation(server):
    """response_format json_schema and grammar (docs/protocol.md) on the socket: the streamed text
    is JSON with the schema's members in its order, or a sentence of the grammar; a bad grammar is
    an error event naming the field, and the socket keeps serving."""
    schema = {"type": "object", "required": ["b", "a"],
              "properties": {"b": {"type": "string", "maxLength": 12}, "a": {"type": "boolean"}}}

    async def main():
        async with connect(server.ws_url) as ws:
            await ws.send(generate("j", max_tokens=60, response_format={
                "type": "json_schema", "json_schema": {"name": "ab", "schema": schema}}))
            tokens, done = await collect(ws, "j")
            text = "".join(ev["text"] for ev in tokens)
            assert done["finish_reason"] == "stop", (done, text)
            assert list(json.loads(text)) == ["b", "a"], text
            await ws.send(generate("bad", grammar="root ::= [z-a]\n"))
            err = json.loads(await ws.recv())
            assert err["type"] == "error" and err["param"] == "grammar" and "end comes before its start" in err["message"], err
            await ws.send(generate("g", max_tokens=20, grammar='root ::= "Hello" ("!" | ".")\n'))
            tokens, done = await collect(ws, "g")
            assert "".join(ev["text"] for ev in tokens) in ("Hello!", "Hello."), tokens
            assert done["finish_reason"] == "stop"
    asyncio.run(main())


def test_a_stream_goes_on_while_a_long_prompt_is_prefilled_in_pieces(fresh_server):
    """With --ubatch-size 64 a prompt of ~1,100 tokens goes into the cache over ~17 rounds, and a
    generation already streaming on the same socket is verified in each of them (docs/engine.md,
    "Prefill in pieces"): its events keep coming between the long prompt's arrival and its first
    token, where a prefill in one forward would hold them back until it ends."""
    srv = fresh_server("--draft", "ngram", "--ubatch-size", "64")
    long_text = " ".join(f"item {i} of the list is number {i * 7 % 100};" for i in range(110))

    async def main():
        async with connect(srv.ws_url) as ws:
            await ws.send(json.dumps({"type": "generate", "id": "a", "prompt": "Count from one to a hundred: one, two,",
                                      "max_tokens": 300, "temperature": 0, "ignore_eos": True}))
            first = json.loads(await ws.recv())
            assert first["id"] == "a" and first["type"] == "token", first
            await ws.send(json.dumps({"type": "generate", "id": "b", "prompt": long_text, "max_tokens": 4,
                                      "temperature": 0}))
            a_events_before_b, b_started, done = 0, False, set()
            async with asyncio.timeout(120):
                while done != {"a", "b"}:
                    ev = json.loads(await ws.recv())
                    if ev["type"] == "done":
                        done.add(ev["id"])
                        if ev["id"] == "b":
                            assert ev["stats"]["prompt_tokens"] > 1000, ev
                    elif ev["type"] == "token" and ev["id"] == "b":
                        b_started = True
                    elif ev["type"] == "token" and ev["id"] == "a" and not b_started:
                        a_events_before_b += ev.get("count", 1)
                    assert ev["type"] != "error", ev
            assert a_events_before_b >= 8, f"only {a_events_before_b} of a's tokens came while b's prompt went in"
    asyncio.run(main())


def test_an_ubatch_size_below_one_stops_the_server_at_start_naming_it():
    import subprocess
    from conftest import SPECULA_BIN
    r = subprocess.run([str(SPECULA_BIN), "serve", "--ubatch-size", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--ubatch-size must be between 1 and 65536" in r.stderr, (r.returncode, r.stderr)


def test_a_reasoning_models_reply_comes_as_reasoning_and_content_as_the_chat_route_splits_it(fresh_server, tmp_path):
    """With the reasoning parser on, each token event of a reply to messages carries, beside its raw
    text, what it adds to the reasoning and to the answer: joined, they are the chat route's
    reasoning_content and content for the same request (a prefilled reply still reasoning, nudged
    to close it, as the chat test does). include_reasoning false leaves the reasoning out; a raw
    prompt's events have the raw text alone."""
    import openai
    from test_openai import REASONING_TEMPLATE
    template = tmp_path / "reasoning.jinja"
    template.write_text(REASONING_TEMPLATE, encoding="utf-8")
    srv = fresh_server("--draft", "ngram", "--chat-template", str(template))
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    both = 0

    async def stream(**fields):
        async with connect(srv.ws_url) as ws:
            await ws.send(json.dumps({"type": "generate", "id": "r", "max_tokens": 24, "temperature": 0, **fields}))
            tokens, done = await collect(ws, "r")
            assert done["type"] == "done", done
            return tokens

    for prefill, bias in (("<think>\nThe sky is blue.\n", 4), ("<think>\nThe sky is blue.\n", 5), ("<think>\nYes", 6)):
        ask = [{"role": "user", "content": "Is the sky blue?"}, {"role": "assistant", "content": prefill}]
        extra = dict(logit_bias={"9617": bias}, min_tokens=6, add_generation_prompt=False, continue_final_message=True)
        m = c.chat.completions.create(model="any", messages=ask, max_tokens=24, temperature=0, extra_body=extra).choices[0].message
        tokens = asyncio.run(stream(messages=ask, **extra))
        assert tokens and all(isinstance(ev["content"], str) and isinstance(ev["reasoning"], str) for ev in tokens), tokens
        reasoning = "".join(ev["reasoning"] for ev in tokens)
        content = "".join(ev["content"] for ev in tokens)
        assert (reasoning, content) == (m.reasoning_content or "", m.content or ""), (tokens, m)
        raw = "".join(ev["text"] for ev in tokens)
        if reasoning and content:
            both += 1
            assert "</think>" in raw and raw.endswith(content), raw
            # The reasoning's events come before the answer's.
            assert max(i for i, ev in enumerate(tokens) if ev["reasoning"]) <= min(i for i, ev in enumerate(tokens) if ev["content"])
            quiet = asyncio.run(stream(messages=ask, include_reasoning=False, **extra))
            assert all("reasoning" not in ev for ev in quiet) and "".join(ev["content"] for ev in quiet) == content
    assert both >= 1, "no case reasoned and then answered: the split went untested"
    plain = asyncio.run(stream(prompt="<think>\nThe sky"))
    assert all("content" not in ev and "reasoning" not in ev for ev in plain)
