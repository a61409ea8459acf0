"""OpenAI's Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}) through the real
`openai` client: each response is the chat route's reply to the conversation it stands for."""
import json
import time

import httpx
import jsonschema
import openai
import pydantic
import pytest


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def check_event_order(events, numbered=True):
    """The Responses API's stream: numbered in order; one item open at a time (each added, its
    deltas, its done, before the next is added), every delta and done naming the open item by id
    and index; the last event the whole response, whose items are the ones streamed."""
    if numbered:
        assert [e.sequence_number for e in events] == list(range(len(events)))
    open_item, done = None, []
    for e in events[2:-1]:
        if e.type == "response.output_item.added":
            assert open_item is None, f"{e.item.id} added while {open_item.id} is open"
            assert e.output_index == len(done)
            open_item = e.item
        elif e.type == "response.output_item.done":
            assert open_item is not None and e.item.id == open_item.id and e.output_index == len(done)
            done.append(e.item)
            open_item = None
        else:
            assert open_item is not None and e.item_id == open_item.id and e.output_index == len(done), e
    assert open_item is None
    assert [item.id for item in events[-1].response.output] == [item.id for item in done]


def chat_reply(client, messages, **extra):
    return client.chat.completions.create(model="any", messages=messages, temperature=0, **extra)


def test_a_response_is_the_chat_reply_to_its_instructions_and_input_with_its_usage_and_status(client):
    question = "What is the capital of France?"
    r = client.responses.create(model="any", input=question, instructions="Answer in one short sentence.",
                                max_output_tokens=24, temperature=0)
    c = chat_reply(client, [{"role": "system", "content": "Answer in one short sentence."},
                            {"role": "user", "content": question}], max_tokens=24)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "SmolLM2-135M-Instruct.Q4_1"
    assert r.output_text == c.choices[0].message.content and r.output_text
    assert [item.type for item in r.output] == ["message"] and r.output[0].role == "assistant"
    assert r.usage.input_tokens == c.usage.prompt_tokens and r.usage.output_tokens == c.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.instructions == "Answer in one short sentence." and r.max_output_tokens == 24 and r.temperature == 0
    want = "incomplete" if c.choices[0].finish_reason == "length" else "completed"
    assert r.status == want, (r.status, c.choices[0].finish_reason)
    # The same question as items of text parts; a cut reply is incomplete with its reason.
    items = client.responses.create(model="any", temperature=0, max_output_tokens=24, instructions="Answer in one short sentence.",
                                    input=[{"role": "user", "content": [{"type": "input_text", "text": question}]}])
    assert items.output_text == r.output_text
    short = client.responses.create(model="any", input=question, max_output_tokens=2, temperature=0)
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"
    assert short.usage.output_tokens == 2


def test_a_streamed_response_sends_the_events_the_sdk_assembles_into_the_same_response(client):
    args = dict(model="any", input="What is the capital of France?", max_output_tokens=60, temperature=0)
    whole = client.responses.create(**args)
    events = list(client.responses.create(**args, stream=True))
    check_event_order(events)
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete" if whole.status == "incomplete" else "response.completed"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text and events[-1].response.output_text == whole.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens
    # The SDK's own stream helper checks the events' items and indices as it builds its snapshot
    # (its final response is the response.completed event's: a reply that ends on its own).
    assert whole.status == "completed", whole.output_text
    with client.responses.stream(**args) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(texts) == whole.output_text == final.output_text


def test_previous_response_id_continues_the_kept_conversation_and_kept_responses_are_read_and_deleted(client):
    first = client.responses.create(model="any", input="My name is Ada. Say hello to me.", max_output_tokens=16, temperature=0)
    second = client.responses.create(model="any", previous_response_id=first.id, input="What is my name?",
                                     max_output_tokens=16, temperature=0)
    c = chat_reply(client, [{"role": "user", "content": "My name is Ada. Say hello to me."},
                            {"role": "assistant", "content": first.output_text},
                            {"role": "user", "content": "What is my name?"}], max_tokens=16)
    assert second.output_text == c.choices[0].message.content and second.previous_response_id == first.id
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as gone:
        client.responses.create(model="any", previous_response_id=first.id, input="Again?", max_output_tokens=4)
    assert gone.value.body["param"] == "previous_response_id"
    unkept = client.responses.create(model="any", input="Hi", max_output_tokens=4, temperature=0, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)


def entries(logprobs):
    return [(lp.token, lp.logprob, [(t.token, t.logprob) for t in lp.top_logprobs]) for lp in logprobs]


def test_include_logprobs_puts_the_chat_routes_logprobs_on_the_message_whole_and_streamed(client):
    """include: ["message.output_text.logprobs"] with top_logprobs (vLLM's and OpenAI's spelling):
    the message's output_text carries each token's entry with its alternatives, the chat route's
    logprobs.content for the same conversation; streamed, the text deltas' entries join to the
    same list, as do the done events'. Without include there are none (top_logprobs is echoed)."""
    question = "What is the capital of France?"
    args = dict(model="any", input=question, max_output_tokens=24, temperature=0, include=["message.output_text.logprobs"],
                top_logprobs=3)
    r = client.responses.create(**args)
    c = chat_reply(client, [{"role": "user", "content": question}], max_tokens=24, logprobs=True, top_logprobs=3)
    got = r.output[0].content[0].logprobs
    assert r.output_text == c.choices[0].message.content and r.top_logprobs == 3
    assert got and all(len(lp.top_logprobs) == 3 for lp in got)
    assert entries(got) == entries(c.choices[0].logprobs.content)
    assert [lp.bytes for lp in got] == [lp.bytes for lp in c.choices[0].logprobs.content]
    assert "".join(lp.token for lp in got) == r.output_text  # (plain text: every token is the message's)
    events = list(client.responses.create(**args, stream=True))
    check_event_order(events)
    deltas = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert entries(deltas) == entries(done.logprobs) == entries(got)
    assert entries(events[-1].response.output[0].content[0].logprobs) == entries(got)
    plain = client.responses.create(model="any", input=question, max_output_tokens=8, temperature=0, top_logprobs=2)
    assert not plain.output[0].content[0].logprobs and plain.top_logprobs == 2
    streamed = list(client.responses.create(model="any", input=question, max_output_tokens=8, temperature=0, stream=True))
    assert all(not e.logprobs for e in streamed if e.type in ("response.output_text.delta", "response.output_text.done"))


def long_turns():
    """Eight long notes and a question: more than the default model's context."""
    turns = []
    for i in range(8):
        turns += [{"role": "user", "content": f"Note {i}: " + " ".join(f"entry{i}x{k}" for k in range(260))},
                  {"role": "assistant", "content": f"I have noted list {i}."}]
    return turns + [{"role": "user", "content": "Which note did I give last?"}]


def tokens_of(server, messages):
    return httpx.post(server.url + "/tokenize", json={"messages": messages}, timeout=60).json()["count"]


def first_fitting_turn(server, system, turns, budget):
    """Where the kept conversation starts: the earliest user message with which it fits."""
    assert tokens_of(server, system + turns) > budget, "the conversation fits: the test shows nothing"
    start = next(s for s in range(0, len(turns), 2) if tokens_of(server, system + turns[s:]) <= budget)
    assert 0 < start < len(turns) - 1
    return start


def test_truncation_auto_drops_the_oldest_turns_that_do_not_fit_and_cuts_a_lone_turn_that_does_not(client, server):
    """truncation "auto" (OpenAI: items dropped from the conversation's start): the instructions
    stay, and the conversation starts at the earliest user message with which the prompt leaves
    room for max_output_tokens; the reply is the chat route's to exactly those messages, its
    input_tokens their count. Disabled, the same input is refused; a single turn longer than the
    context is cut to its latest tokens."""
    context = client.models.list().data[0].model_extra["max_model_len"]
    inst, turns = "Answer in one short sentence.", long_turns()
    system = [{"role": "system", "content": inst}]
    start = first_fitting_turn(server, system, turns, context - 16)
    r = client.responses.create(model="any", input=turns, instructions=inst, truncation="auto", max_output_tokens=16, temperature=0)
    c = chat_reply(client, system + turns[start:], max_tokens=16)
    assert r.usage.input_tokens == tokens_of(server, system + turns[start:]) == c.usage.prompt_tokens
    assert r.output_text == c.choices[0].message.content and r.truncation == "auto"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="any", input=turns, instructions=inst, max_output_tokens=16)
    assert refused.value.body["code"] == "context_length_exceeded"
    lone = client.responses.create(model="any", input="word " * 9000, truncation="auto", max_output_tokens=16, temperature=0)
    assert lone.usage.input_tokens == context - 16


def wait_until_ended(client, response_id, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        r = client.responses.retrieve(response_id)
        if r.status not in ("queued", "in_progress") or time.monotonic() > deadline:
            return r
        time.sleep(0.05)


def requests_running(server):
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(("specula_requests_running ", "specula_requests_waiting ")))


def test_a_background_response_is_answered_at_once_and_read_back_as_the_reply_it_would_have_been(client):
    """background: true (OpenAI's and vLLM's): the request is answered at once, queued with no
    output; the reply runs on and GET reads back the response the same request without background
    gives (text, usage, status), which a later request continues; a request that would continue
    it while it runs is refused. Without store, or streamed, it is a 400 naming the field."""
    args = dict(model="any", input="What is the capital of France?", max_output_tokens=24, temperature=0)
    whole = client.responses.create(**args)
    queued = client.responses.create(**args, background=True)
    assert queued.background is True and queued.status in ("queued", "in_progress") and queued.output == []
    assert queued.usage is None
    done = wait_until_ended(client, queued.id)
    assert done.id == queued.id and done.background is True
    assert (done.status, done.output_text, done.usage.output_tokens) == (whole.status, whole.output_text, whole.usage.output_tokens)
    after = client.responses.create(model="any", previous_response_id=queued.id, input="And of Italy?", max_output_tokens=16,
                                    temperature=0)
    c = chat_reply(client, [{"role": "user", "content": args["input"]}, {"role": "assistant", "content": whole.output_text},
                            {"role": "user", "content": "And of Italy?"}], max_tokens=16)
    assert after.output_text == c.choices[0].message.content
    running = client.responses.create(model="any", input="Write a long essay about the history of Rome.", max_output_tokens=400,
                                      temperature=0, background=True)
    with pytest.raises(openai.BadRequestError) as early:
        client.responses.create(model="any", previous_response_id=running.id, input="Go on.", max_output_tokens=4)
    assert early.value.body["param"] == "previous_response_id" and "in progress" in early.value.body["message"]
    client.responses.cancel(running.id)
    for extra, param in (({"store": False}, "store"), ({"stream": True}, "stream")):
        r = httpx.post(client.base_url.join("responses").__str__(), json={**args, "background": True, **extra}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_cancel_stops_a_background_response_where_it_is_and_delete_stops_and_forgets_one(client, server):
    """POST /v1/responses/{id}/cancel: a running background response ends "cancelled" with the
    items so far (fewer tokens than asked), and cancel again returns it as it is; a finished one is
    returned unchanged; one answered when it was made cannot be cancelled (400). DELETE of a running
    one stops its generation and forgets it. Another key's, or none, is a 404."""
    long = dict(model="any", input="Write a long essay about the history of Rome.", max_output_tokens=2000, temperature=0)
    r = client.responses.create(**long, background=True)
    deadline = time.monotonic() + 30
    while client.responses.retrieve(r.id).status == "queued" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client.responses.retrieve(r.id).status == "in_progress"
    cancelled = client.responses.cancel(r.id)
    assert cancelled.status == "cancelled"
    assert wait_until_ended(client, r.id).status == "cancelled"
    deadline = time.monotonic() + 30
    while requests_running(server) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert requests_running(server) == 0, "the cancelled response's generation still runs"
    final = client.responses.retrieve(r.id)
    assert final.status == "cancelled" and 0 < final.usage.output_tokens < 2000, final.usage
    assert final.output[0].status == "incomplete" and final.output_text
    assert client.responses.cancel(r.id).status == "cancelled"
    short = client.responses.create(model="any", input="Say hi.", max_output_tokens=8, temperature=0, background=True)
    ended = wait_until_ended(client, short.id)
    assert client.responses.cancel(short.id).model_dump() == ended.model_dump()
    foreground = client.responses.create(model="any", input="Say hi.", max_output_tokens=4, temperature=0)
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(foreground.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_nothing")
    gone = client.responses.create(**long, background=True)
    client.responses.delete(gone.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(gone.id)
    deadline = time.monotonic() + 30
    while requests_running(server) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert requests_running(server) == 0, "the deleted response's generation still runs"
    with pytest.raises(openai.NotFoundError):  # and it stays forgotten once its run has ended
        client.responses.retrieve(gone.id)
    for query in ("stream=true", "x=1&stream=1"):
        r = httpx.get(server.url + f"/v1/responses/{short.id}?{query}", timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "stream", (query, r.text)
    assert httpx.get(server.url + f"/v1/responses/{short.id}?stream=false", timeout=30).status_code == 200


def test_truncation_auto_drops_turns_for_a_reasoning_models_constrained_reply_too(fresh_server, tmp_path):
    """A reasoning model's reply held to a format is tokenized early (to see whether the prompt
    opens its reasoning); truncation "auto" still drops whole turns there."""
    from test_openai import REASONING_TEMPLATE
    template = tmp_path / "reasoning.jinja"
    template.write_text(REASONING_TEMPLATE, encoding="utf-8")
    srv = fresh_server("--draft", "none", "--chat-template", str(template))
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    context = c.models.list().data[0].model_extra["max_model_len"]
    inst, turns = "Answer in JSON.", long_turns()
    system = [{"role": "system", "content": inst}]
    start = first_fitting_turn(srv, system, turns, context - 8)
    r = c.responses.create(model="any", input=turns, instructions=inst, truncation="auto", max_output_tokens=8, temperature=0,
                           text={"format": {"type": "json_object"}})
    assert r.usage.input_tokens == tokens_of(srv, system + turns[start:]), r.usage


class City(pydantic.BaseModel):
    name: str
    country: str


def test_text_format_holds_the_reply_to_a_schema_as_the_sdks_parse_reads_it(client):
    r = client.responses.parse(model="any", input="Give a city and its country as JSON.", text_format=City,
                               max_output_tokens=60, temperature=0)
    assert isinstance(r.output_parsed, City), r.output_text
    j = client.responses.create(model="any", input="Give a JSON object with a key a.", max_output_tokens=30, temperature=0,
                                text={"format": {"type": "json_object"}})
    # (this small model nests objects until it is cut: a cut reply is the start of one object)
    assert j.output_text.lstrip().startswith("{") and (j.status == "incomplete" or isinstance(json.loads(j.output_text), dict))


WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
                          "required": ["city"]}}


def test_a_function_call_is_an_output_item_and_its_output_continues_the_conversation_as_the_chat_route_would(client):
    ask = "What is the weather in Paris?"
    named = {"type": "function", "name": "get_weather"}
    r = client.responses.create(model="any", input=ask, tools=[WEATHER], tool_choice=named, max_output_tokens=40, temperature=0)
    calls = [item for item in r.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", r.output
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    chat_tool = {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}
    c = chat_reply(client, [{"role": "user", "content": ask}], tools=[chat_tool], max_tokens=40,
                   tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert calls[0].arguments == c.choices[0].message.tool_calls[0].function.arguments
    # Streamed, the same call through the SDK's helper.
    with client.responses.stream(model="any", input=ask, tools=[WEATHER], tool_choice=named, max_output_tokens=40,
                                 temperature=0) as stream:
        argument_deltas = "".join(e.delta for e in stream if e.type == "response.function_call_arguments.delta")
        final = stream.get_final_response()
    streamed = [item for item in final.output if item.type == "function_call"]
    assert argument_deltas == streamed[0].arguments == calls[0].arguments
    check_event_order(list(client.responses.create(model="any", input=ask, tools=[WEATHER], tool_choice=named, max_output_tokens=40,
                                                   temperature=0, stream=True)))
    # The call's output, after the kept response, answers as the chat route answers that conversation.
    after = client.responses.create(model="any", previous_response_id=r.id, tools=[WEATHER], max_output_tokens=24, temperature=0,
                                    input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}])
    c2 = chat_reply(client, [{"role": "user", "content": ask},
                             {"role": "assistant", "content": None,
                              "tool_calls": [{"id": calls[0].call_id, "type": "function",
                                              "function": {"name": "get_weather", "arguments": calls[0].arguments}}]},
                             {"role": "tool", "tool_call_id": calls[0].call_id, "content": "Sunny, 21 C"}],
                    tools=[chat_tool], max_tokens=24)
    assert after.output_text == (c2.choices[0].message.content or "")
    # The same conversation sent whole, the first reply's output items as input (as a client that
    # keeps its own history does): the same answer.
    history = [{"role": "user", "content": ask}, *[item.model_dump(exclude_none=True) for item in r.output],
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}]
    resent = client.responses.create(model="any", input=history, tools=[WEATHER], max_output_tokens=24, temperature=0, store=False)
    assert resent.output_text == after.output_text


@pytest.mark.parametrize("extra, param", [
    ({}, "input"),
    ({"input": 5}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
    ({"input": [{"type": "file_search_call"}]}, "input"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": "x", "background": "yes"}, "background"),
    ({"input": "x", "include": ["file_search_call.results"]}, "include"),
    ({"input": "x", "include": ["message.output_text.logprobs"], "top_logprobs": 21}, "top_logprobs"),
    ({"input": "x", "top_logprobs": "3"}, "top_logprobs"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format"),
    ({"input": "x", "truncation": "sometimes"}, "truncation"),
    ({"input": "x", "previous_response_id": "resp_missing"}, "previous_response_id"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input"),
    ({"input": "x", "store": "yes"}, "store"),
    ({"input": "x", "metadata": [1]}, "metadata"),
    ({"input": "x", "tool_choice": {"type": "allowed_tools"}, "tools": []}, "tool_choice"),
])
def test_a_request_the_route_cannot_serve_is_a_400_naming_the_field(server, extra, param):
    r = httpx.post(server.url + "/v1/responses", json=extra, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def test_reading_a_response_that_is_not_kept_is_a_404_and_other_methods_are_refused(server):
    assert httpx.get(server.url + "/v1/responses/resp_nothing", timeout=30).status_code == 404
    assert httpx.delete(server.url + "/v1/responses/resp_nothing", timeout=30).status_code == 404
    assert httpx.post(server.url + "/v1/responses/resp_nothing", json={}, timeout=30).status_code == 405
    assert httpx.get(server.url + "/v1/responses", timeout=30).status_code == 405


def test_a_reasoning_reply_is_a_reasoning_item_before_its_message_as_the_chat_route_splits_it(fresh_server, tmp_path):
    """With the reasoning parser on, the reply's reasoning is a reasoning item and the answer after
    </think> the message, each the chat route's reasoning_content and content for the same
    conversation (a prefilled reply still reasoning, nudged to close it, as the chat test does);
    streamed, reasoning_text deltas come first, then output_text deltas, and join to the same."""
    from test_openai import REASONING_TEMPLATE
    template = tmp_path / "reasoning.jinja"
    template.write_text(REASONING_TEMPLATE, encoding="utf-8")
    srv = fresh_server("--draft", "ngram", "--chat-template", str(template))
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    closed = both = 0
    for prefill, bias in (("<think>\nThe sky is blue.\n", 4), ("<think>\nThe sky is blue.\n", 5), ("<think>\nYes", 6)):
        ask = [{"role": "user", "content": "Is the sky blue?"}, {"role": "assistant", "content": prefill}]
        extra = dict(logit_bias={"9617": bias}, min_tokens=6, add_generation_prompt=False, continue_final_message=True)
        m = c.chat.completions.create(model="any", messages=ask, max_tokens=24, temperature=0, extra_body=extra).choices[0].message
        args = dict(model="any", input=ask, max_output_tokens=24, temperature=0, extra_body=extra)
        r = c.responses.create(**args)
        kinds = [item.type for item in r.output]
        want = (["reasoning"] if m.reasoning_content else []) + (["message"] if m.content or not m.reasoning_content else [])
        assert kinds == want and r.output_text == (m.content or ""), (r.output, m)
        if m.reasoning_content:
            assert r.output[0].content[0].text == m.reasoning_content
        assert (r.usage.output_tokens_details.reasoning_tokens > 0) == bool(m.reasoning_content)
        events = list(c.responses.create(**args, stream=True))
        check_event_order(events)
        reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
        answer = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert (reasoning, answer) == (m.reasoning_content, m.content or "")
        types = [e.type for e in events]
        if m.content:
            closed += 1
        if m.content and m.reasoning_content:
            both += 1
            assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")
        strip = lambda output: [item.model_dump(exclude={"id"}) for item in output]  # (ids are each response's own)
        assert strip(events[-1].response.output) == strip(r.output)
    assert closed >= 1 and both >= 1, "no case reasoned and then answered: the items' order went untested"


def test_a_reply_that_fails_midway_streams_its_text_then_the_error_and_the_failed_response(client, server):
    """allowed_token_ids and bad_words that leave no token after the first: its text goes out as a
    delta, the message item closes as incomplete, then an error event and response.failed with
    that item; not streamed, a 400."""
    world = httpx.post(server.url + "/tokenize", json={"prompt": " world"}, timeout=30).json()["tokens"]
    extra = {"allowed_token_ids": world, "bad_words": ["world world"]}
    events = list(client.responses.create(model="any", input="Hello", max_output_tokens=10, temperature=0, stream=True,
                                          extra_body=extra))
    assert [e.type for e in events][-2:] == ["error", "response.failed"], [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    check_event_order(events[:-2] + events[-1:], numbered=False)  # (the error event names no item)
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == " world"
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "invalid_prompt" and "leave no token" in failed.error.message
    assert [(item.type, item.status, item.content[0].text) for item in failed.output] == [("message", "incomplete", " world")]
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="any", input="Hello", max_output_tokens=10, temperature=0, extra_body=extra)


def test_a_long_body_is_read_as_a_short_one_is(client, server):
    """A body past 16 KiB is parsed on the preparation thread (both readings of it): the same reply."""
    args = dict(model="any", input="Say hi.", max_output_tokens=8, temperature=0)
    short = client.responses.create(**args)
    long = client.responses.create(**args, extra_body={"padding": "x" * 40000})
    assert long.output_text == short.output_text
    deep = httpx.post(server.url + "/v1/responses", content=b'{"input": "x", "z": ' + b"[" * 100000 + b"]" * 100000 + b"}",
                      headers={"Content-Type": "application/json"}, timeout=30)
    assert deep.status_code == 400 and deep.json()["error"]["code"] == "invalid_json", deep.text
