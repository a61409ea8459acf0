#!/usr/bin/env bash
# Tools in the model's own syntax, streamed (eighty-first session): with `tools` in a chat request
# and a template that writes them (--chat-template, default Qwen2.5's fixture: Hermes calls), a
# reply in words streams as it is generated instead of arriving whole at its end. For the first
# PROMPTS_N prompts of the benchmark set, greedy, MAX_TOKENS each, with and without a tool, one
# after the other on one server: the seconds to the first content chunk and to the end of the
# stream. Prints one JSON line per configuration (medians) on stdout.
# TEMPLATE=model serves the model's own template (the default model's writes no tools: llama.cpp's
# generic format, whose calls and response stream piece by piece since the eighty-second session);
# then a "piece" is a content chunk or a call's (its header or more of its arguments).
#
# ASK=weather (eighty-third session) sends, instead of the benchmark set, PROMPTS_N questions for
# the weather in a city after three turns in which the assistant called the tool (the model then
# calls it: Hermes' calls, held to the schema and streamed as they are written since that session).
# SERVE_ARGS: more options for `specula serve` (e.g. "--tool-call-grammar off", the control).
#
# Settings (environment): SPECULA_BUILD (./build), SPECULA_MODEL, TEMPLATE, PROMPTS
# (../shared/data/prompts/chat.jsonl), PROMPTS_N (12), MAX_TOKENS (128), PORT (18181), THREADS (2),
# ASK, SERVE_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${SPECULA_BUILD:-$ROOT/build}
CACHE=${SPECULA_CACHE:-$HOME/.cache/specula}
MODEL=${SPECULA_MODEL:-$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf}
TEMPLATE=${TEMPLATE:-$ROOT/tests/fixtures/chat_templates/qwen2.5.jinja}
PROMPTS=${PROMPTS:-$ROOT/../shared/data/prompts/chat.jsonl}
PORT=${PORT:-18181}
LOG=$(mktemp)
TEMPLATE_ARGS=(--chat-template "$TEMPLATE")
[ "$TEMPLATE" = model ] && TEMPLATE_ARGS=()
read -r -a SERVE_EXTRA <<< "${SERVE_ARGS:-}"
"$BUILD/specula" serve --model "$MODEL" --port "$PORT" --threads "${THREADS:-2}" "${TEMPLATE_ARGS[@]}" "${SERVE_EXTRA[@]}" > "$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true; rm -f "$LOG"' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break; sleep 0.2; done
"$BUILD/venv/bin/python" - "$PORT" "$PROMPTS" "${PROMPTS_N:-12}" "${MAX_TOKENS:-128}" "${ASK:-}" <<'PY'
import json, statistics, sys, time
import openai
port, prompts, count, max_tokens, ask = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)
weather = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
conversations = [json.loads(line)["messages"] for line in open(prompts, encoding="utf-8") if line.strip()][:count]
if ask == "weather":
    def turn(city, i):
        return [{"role": "user", "content": f"What is the weather in {city}?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": f"call{i}", "type": "function", "function": {
                    "name": "get_weather", "arguments": json.dumps({"city": city})}}]},
                {"role": "tool", "tool_call_id": f"call{i}", "content": "Sunny."},
                {"role": "assistant", "content": f"It is sunny in {city}."}]
    history = turn("Paris", 1) + turn("Berlin", 2) + turn("Madrid", 3)
    cities = ["Rome", "Oslo", "Lima", "Cairo", "Tokyo", "Quito", "Dakar", "Hanoi", "Sofia", "Perth", "Baku", "Riga"]
    conversations = [history + [{"role": "user", "content": f"What is the weather in {c}?"}] for c in (cities * 4)[:count]]
runs = {"tools": [], "no tools": []}
called = 0
for messages in conversations:
    for name, extra in (("tools", {"tools": [weather]}), ("no tools", {})):
        start, first, chunks, calls = time.perf_counter(), None, 0, False
        for chunk in client.chat.completions.create(model="any", messages=messages, stream=True,
                                                    max_tokens=max_tokens, temperature=0, **extra):
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta and (delta.content or delta.tool_calls):
                chunks += 1
                calls = calls or bool(delta.tool_calls)
                first = first if first is not None else time.perf_counter() - start
        runs[name].append((first, time.perf_counter() - start, chunks))
        called += calls
for name, rows in runs.items():
    firsts = [r[0] for r in rows if r[0] is not None]
    print(json.dumps({"config": name, "requests": len(rows), "first_piece_s": round(statistics.median(firsts), 4),
                      "end_s": round(statistics.median(r[1] for r in rows), 4),
                      "pieces": round(statistics.median(r[2] for r in rows), 1),
                      **({"replies_with_calls": called} if name == "tools" else {})}))
PY
