"""Chat templates: Specula's Jinja interpreter (model/jinja*.cpp) against Jinja2 itself, set up as
Hugging Face's apply_chat_template sets it up (a sandbox, trim_blocks, lstrip_blocks, loop
controls, raise_exception, its tojson). Every case renders in both and must match byte for byte;
where Jinja2 refuses the conversation (raise_exception) Specula must refuse it with the same
message. The templates are the published chat templates of common model families
(tests/fixtures/chat_templates/), the default model's own from its GGUF, and short templates
that each exercise a piece of the language."""
from __future__ import annotations

import datetime
import json
import subprocess

import gguf
import jinja2
import pytest
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from conftest import FIXTURE_DIR

BOS, EOS = "<s>", "</s>"
TEMPLATE_DIR = FIXTURE_DIR / "chat_templates"


class Refused(Exception):
    pass


def _raise(message):
    raise Refused(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def jinja2_render(source: str, variables: dict) -> dict:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    context = {"bos_token": BOS, "eos_token": EOS, "tools": None, "documents": None, "add_generation_prompt": False}
    context.update(variables)
    try:
        return {"text": env.from_string(source).render(**context)}
    except Refused as e:
        return {"refused": str(e)}
    except Exception as e:  # a template error on this input (None iterated, an undefined's attribute)
        return {"failed": f"{type(e).__name__}: {e}"}


def chat_template_lines(specula_bin, template_path, lines, work_dir, stem) -> list[dict]:
    """`specula chat-template --input` on JSON lines (each a request's messages and options, or
    "variables"): each line's {"text"} or {"error"}."""
    inp, out = work_dir / f"{stem}.in.jsonl", work_dir / f"{stem}.out.jsonl"
    inp.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    cmd = [specula_bin, "chat-template", "--chat-template", template_path, "--bos", BOS, "--eos", EOS,
           "--input", inp, "--output", out]
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(got) == len(lines)
    return got


def specula_render(specula_bin, template_path, cases, work_dir) -> list[dict]:
    return chat_template_lines(specula_bin, template_path, [{"variables": c} for c in cases], work_dir, template_path.stem)


def check_same(specula_bin, template_path, cases, work_dir):
    source = template_path.read_text(encoding="utf-8")
    got = specula_render(specula_bin, template_path, cases, work_dir)
    assert len(got) == len(cases)
    for case, mine in zip(cases, got):
        want = jinja2_render(source, case)
        if "refused" in want:
            assert "error" in mine, f"{template_path.name}: Jinja2 refuses {case} ({want['refused']}), Specula rendered {mine}"
            assert want["refused"] in mine["error"], f"{template_path.name}: {mine['error']!r} lacks {want['refused']!r}"
        elif "failed" in want:
            assert "error" in mine, f"{template_path.name}: Jinja2 fails on {case} ({want['failed']}), Specula rendered {mine}"
        else:
            assert mine == want, f"{template_path.name} on {json.dumps(case)[:300]}"


def conversations():
    user = {"role": "user", "content": "What is the capital of France?"}
    assistant = {"role": "assistant", "content": "  Paris.  \n"}
    system = {"role": "system", "content": "You are terse.\nAnswer in one line."}
    odd = {"role": "user", "content": " Quotes ' \" and \\ backslashes, tabs\t, é, 日本語, emoji 🙂, {{ not jinja }} "}
    tool = {"role": "tool", "content": "{\"temperature\": 21}"}
    thinking = {"role": "assistant", "content": "<think>hmm</think>It is 21 degrees."}
    convs = [
        [user],
        [system, user],
        [user, assistant, odd],
        [system, user, assistant, odd],
        [user, assistant],
        [assistant, user],                 # roles that do not alternate
        [system, system, user],
        [user, thinking, user],
        [user, assistant, tool],
        [user, user],
    ]
    cases = []
    for conv in convs:
        for gen in (True, False):
            cases.append({"messages": conv, "add_generation_prompt": gen})
    return cases


def tool_cases():
    tools = [
        {"type": "function", "function": {
            "name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "days": {"type": "integer"},
                "units": {"type": ["string", "null"], "enum": ["c", "f"]},
                "hours": {"type": "array", "items": {"type": "number"}},
                "extra": {"type": "object", "additionalProperties": {"type": "boolean"}}},
                "required": ["city"]}}},
        {"type": "function", "function": {"name": "now", "description": "The time", "parameters": {"type": "object", "properties": {}}}},
    ]
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]}
    two_calls = {"role": "assistant", "content": None, "tool_calls": call["tool_calls"] * 2}
    result = {"role": "tool", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"}
    user = {"role": "user", "content": "Weather in Paris?"}
    system = {"role": "system", "content": "Use tools."}
    return [
        {"messages": [user], "tools": tools, "add_generation_prompt": True},
        {"messages": [system, user, call, result], "tools": tools, "add_generation_prompt": True},
        {"messages": [user, call, result, result, {"role": "assistant", "content": "21.5 and clear."}], "tools": tools},
        {"messages": [user, two_calls, result], "tools": tools, "add_generation_prompt": True},
        {"messages": [system, user], "tools": tools, "tools_in_user_message": False, "date_string": "1 Jan 2025"},
        {"messages": [user, call], "builtin_tools": ["brave_search", "code_interpreter", "get_weather"]},
        {"messages": [system], "tools": tools},
    ]


@pytest.mark.parametrize("name", sorted(p.name for p in TEMPLATE_DIR.glob("*.jinja")))
def test_a_published_chat_template_renders_every_conversation_as_jinja2_does(specula_bin, work_dir, name):
    cases = conversations() + tool_cases()
    check_same(specula_bin, TEMPLATE_DIR / name, cases, work_dir)


def test_the_default_models_own_template_renders_as_jinja2_does(specula_bin, default_model, work_dir):
    reader = gguf.GGUFReader(str(default_model))
    field = reader.fields["tokenizer.chat_template"]
    source = bytes(field.parts[field.data[0]]).decode("utf-8")
    path = work_dir / "smollm2.jinja"
    path.write_text(source, encoding="utf-8")
    check_same(specula_bin, path, conversations(), work_dir)


# Each piece of the language on its own: (template, variables).
FEATURES = [
    ("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}", {}),
    ("{{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-5 }} {{ 3.0 }} {{ 100000000000000000.0 }} {{ -0.0 }}", {}),
    ("{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1] + [2, 'x'] }} {{ 'x' + 'y' }}", {}),
    ("{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 2 >= 2 }} {{ true == 1 }}", {}),
    ("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }}", {}),
    ("{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 3 > 2 == 2 }} {{ 1 == 1 != 2 }} {{ 'a' in 'ab' in 'abc' }} {{ 1 < x <= 5 }} {{ not 1 < 2 < 3 }} {{ 1 < 2 < 3 and 0 > 1 > 2 }}", {"x": 5}),
    ("{{ \"don't stop-me (now) [ok] <b>x</b>\" | title }}|{{ \"don't stop-me\".title() }}|{{ 'hELLO wORLD' | title }}", {}),
    ("{% for m in l %}{{ loop.cycle('odd', 'even') }}{{ loop.cycle(1, 2, 3) }};{% endfor %}", {"l": [1, 2, 3, 4, 5]}),
    ("{% for m in l %}{{ loop.cycle() }}{% endfor %}", {"l": [1]}),
    ("{{ 0 < l | length < 3 }}|{{ 'a' < 'b' < 'c' < 'b' }}|{% if 1 <= m.n < 10 %}one digit{% endif %}", {"l": [1, 2], "m": {"n": 7}}),
    ("{{ not true }} {{ true and 'x' }} {{ '' or 'y' }} {{ 0 or [] }} {{ none and 1 }}", {}),
    ("{{ 'yes' if x else 'no' }} {{ 'yes' if y }}|{{ x if x is defined else 'undefined' }}", {"y": 0}),
    ("{{ none }} {{ true }} {{ [1, 'a', none, true, 1.5] }} {{ {'a': [1], 'b': {'c': 'd'}} }} {{ \"it's\" }} {{ ['it\\'s'] }}", {}),
    ("{{ undefined_thing }}|{{ undefined_thing | default('d') }}|{{ '' | default('e', true) }}|{{ none | default('f') }}", {}),
    ("{{ x.missing }}|{{ x['missing'] }}|{{ x.a }}|{{ x['a'] }}|{{ l[1] }}|{{ l[-1] }}|{{ l[9] }}|{{ l.0 }}", {"x": {"a": 1}, "l": [1, 2, 3]}),
    ("{{ s[1:] }}|{{ s[:-1] }}|{{ s[::-1] }}|{{ l[1:3] }}|{{ l[::2] }}|{{ l[-2:] }}|{{ s[10:] }}|{{ u[1:3] }}", {"s": "hello", "l": [1, 2, 3, 4], "u": "日本語です"}),
    ("{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}", {"l": ["a", "b", "c"]}),
    ("{% for x in l if x > 1 %}{{ x }}{{ loop.index }}{{ loop.last }} {% else %}empty{% endfor %}|{% for x in [] %}x{% else %}none{% endfor %}", {"l": [1, 2, 3]}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for c in 'héllo' %}[{{ c }}]{% endfor %}", {"d": {"z": 1, "a": 2}}),
    ("{% for x in l %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", {"l": [1, 2, 3, 4, 5]}),
    ("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% set ns = namespace(n=0, s='') %}{% for i in range(5) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
    ("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c, d = [3, 4] %}{{ c }}{{ d }}{% set block %}in {{ a }} block{% endset %}[{{ block }}]", {}),
    ("{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }} {{ range(0) | list }}", {}),
    ("{% if a %}A{% elif b %}B{% elif c %}C{% else %}D{% endif %}{% if not a and not b %}!{% endif %}", {"b": 0, "c": [1]}),
    ("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(name='C', punct='.') }}", {}),
    ("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(4) }}", {}),
    ("{{ s | trim }}|{{ s | upper }}|{{ s | lower }}|{{ s | title }}|{{ s | capitalize }}|{{ s | length }}|{{ s | wordcount }}", {"s": "  hello wORLD-x y  "}),
    ("{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' h') }}|{{ s.split() }}|{{ s.split('l') }}|{{ s.split('l', 1) }}", {"s": "  hello world  "}),
    ("{{ s.startswith('ab') }} {{ s.endswith('yz') }} {{ s.startswith(('x', 'a')) }} {{ s.upper() }} {{ s.replace('b', 'B') }} {{ s.find('c') }} {{ s.count('a') }} {{ '-'.join(['a', 'b']) }} {{ s.title() }}", {"s": "abcabc xyz"}),
    ("{{ s.splitlines() }} {{ 'x y'.split(' ') }} {{ 'a,,b'.split(',') }} {{ '  a  b '.split(none, 1) }} {{ '12'.isdigit() }} {{ ' '.isspace() }}", {"s": "a\nb\r\nc"}),
    ("{{ l | join(', ') }}|{{ l | first }}|{{ l | last }}|{{ l | length }}|{{ l | reverse | list }}|{{ l | sort }}|{{ l | sort(reverse=true) }}|{{ l | unique | list }}|{{ l | sum }}|{{ l | min }}|{{ l | max }}", {"l": [3, 1, 2, 3]}),
    ("{{ ws | sort }}|{{ ws | sort(case_sensitive=true) }}|{{ ws | unique | list }}|{{ ws | map('upper') | join }}|{{ ws | select('lower') | list }}", {"ws": ["b", "A", "a", "C"]}),
    ("{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %}|{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}|{{ d.keys() | list }}|{{ d.values() | list }}|{{ d.get('a') }}|{{ d.get('q', 'none') }}|{{ d | length }}", {"d": {"b": 2, "a": 1, "C": 3}}),
    ("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(' / ') }}|{{ ms | rejectattr('role', 'equalto', 'user') | list | length }}|{{ ms | map(attribute='x', default='-') | list }}|{{ ms | selectattr('extra') | list | length }}", {"ms": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "extra": 1}, {"role": "user", "content": "c"}]}),
    ("{{ l | select('odd') | list }} {{ l | reject('odd') | list }} {{ l | select('divisibleby', 3) | list }} {{ l | select('>', 2) | list }} {{ l | map('string') | join('+') }}", {"l": [1, 2, 3, 4, 6]}),
    ("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ l | tojson }}|{{ 'é\"\\n' | tojson }}|{{ 'é' | tojson(ensure_ascii=true) }}|{{ d | tojson(sort_keys=true) }}|{{ {} | tojson(indent=2) }}|{{ [] | tojson }}", {"d": {"b": [1, 2.5, None, True, {"x": "y"}], "a": "🙂"}, "l": [1, "two", [3]]}),
    ("{{ d | tojson(separators=(',', ':')) }}|{{ 1.0 | tojson }}|{{ 1e100 | tojson }}", {"d": {"a": [1, 2]}}),
    ("{{ 3.7 | int }} {{ '42' | int }} {{ 'x' | int }} {{ '2.5' | float }} {{ 3 | float }} {{ -3 | abs }} {{ 2.567 | round(1) }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.1 | round(method='ceil') }} {{ 42 | string }}", {}),
    ("{{ s | replace('a', 'o') }}|{{ s | replace('a', 'o', 1) }}|{{ s | indent(2) }}|{{ s2 | indent(4, true) }}|{{ s2 | indent(2, blank=true) }}|{{ '<a href=\"x\">&</a>' | e }}", {"s": "banana", "s2": "a\n\nb\nc"}),
    ("{{ x is defined }} {{ y is undefined }} {{ n is none }} {{ 1 is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ 's' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 's' is sequence }} {{ true is boolean }} {{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 1 is sameas 1 }} {{ 2 is in [1, 2] }} {{ 'a' is lower }} {{ x is not none }}", {"x": 1, "n": None}),
    ("{{ 1 is eq 1 }} {{ 1 is ne 2 }} {{ 1 is lt 2 }} {{ 3 is gt 2 }} {{ 2 is le 2 }} {{ 2 is ge 3 }} {{ 1 is true }} {{ true is true }} {{ false is false }} {{ range is callable }}", {}),
    ("a\n  {% if true %}\n    b\n  {% endif %}\n  c {# comment #}\n  {# line comment #}\nd\n{%+ if true %}e{% endif +%}\nf", {}),
    ("a  {%- if true -%}  b  {%- endif -%}  c {{- ' d ' -}} e\n\n{{ 'f' }}  \n  {%- for i in [1] %}\n{{ i }}\n{% endfor %}", {}),
    ("{% raw %}{{ not rendered }}{% if %}{% endraw %}|{{ '{{' }}|{{ \"}}\" }}", {}),
    ("{% filter upper %}shout {{ 'this' }}{% endfilter %}", {}),
    ("{% set d = {'k': 'v', 'n': [1, {'m': 2}]} %}{{ d.n[1].m }}{{ d['k'] }}{{ dict(a=1, b='x') }}{{ namespace(a=1).a }}", {}),
    ("{{ 'adjacent' ' strings' }} {{ \"\\t|\\u00e9|\\x41|\\\\\" }} {{ 'line\\\ncontinued' }}", {}),
    ("{% for m in messages %}{% if loop.first and m.role != 'system' %}[default system]{% endif %}{{ m.role[0] | upper }}:{{ m.content }}{% if not loop.last %}, {% endif %}{% endfor %}", {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}),
    ("{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }}{% endfor %}{{ loop.index }};{% endfor %}", {}),
    ("{{ not 1 in [1] }} {{ -2 ** 2 }} {{ -1 | abs }} {{ 'a' | upper ~ 'b' }} {{ 1 + 2 ~ 3 }} {{ 2 * 3 ~ 4 }} {{ (1, 2)[1] }} {{ [1, 2, 3][1:][0] }}", {}),
    ("{% if true %}{% set shown = 'set in if' %}{% endif %}{{ shown }}|{% for i in [1] %}{% set hidden = 1 %}{% endfor %}{{ hidden is defined }}", {}),
    ("  {#- trimmed comment -#}  x\n    {# kept indent? #}\n  y\n\t{% if true %}\n\tz\n\t{% endif %}\n", {}),
    ("{{ messages[0]['content'] | trim | length }} {{ (messages | last).role }} {{ messages | map(attribute='role') | join(',') }} {{ messages | length > 1 }}", {"messages": [{"role": "system", "content": " s "}, {"role": "user", "content": "u"}]}),
    ("{{ u[1] }}{{ u[-1] }}{{ 2 ** 62 }} {{ (-1) ** 1000000000000 }} {{ 1 ** 99999999999 }} {{ 7 // -1 }} {{ -7 % -1 }} {{ [] * 100000000000 }} {{ '' * 100000000000 }}", {"u": "日本語"}),
    ("{{ 'a' in undefined_thing }} {{ namespace(items=3).items }} {{ 'abc' | replace('', '-') }} {{ 'abc' | replace('', '-', 2) }} {{ 'abc' | replace('b', '-', 0) }}", {}),
    ("{{ x.y.z }}", {"x": {}}),
    ("{{ none.attr }}", {}),
    ("{% for x in none %}{% endfor %}", {}),
    ("{{ 1 + 'a' }}", {}),
    ("{{ 'a' < 1 }}", {}),
    ("{{ raise_exception('Refused: ' ~ messages | length ~ ' messages') if messages | length > 1 else 'ok' }}", {"messages": [1, 2]}),
]


def test_each_piece_of_the_language_renders_as_jinja2_renders_it(specula_bin, work_dir):
    mismatches = []
    for i, (source, variables) in enumerate(FEATURES):
        path = work_dir / f"feature{i:02d}.jinja"
        path.write_text(source, encoding="utf-8")
        want = jinja2_render(source, variables)
        got = specula_render(specula_bin, path, [variables], work_dir)[0]
        if "refused" in want or "failed" in want:
            if not ("error" in got and want.get("refused", "") in got["error"]):
                mismatches.append((source, want, got))
        elif got != want:
            mismatches.append((source, want, got))
    assert not mismatches, "\n".join(f"{s!r}\n  jinja2:  {w}\n  specula: {g}" for s, w, g in mismatches)


def test_a_planted_difference_in_the_interpreter_is_caught(specula_bin, work_dir):
    # The control: the same comparison fails when one side's template differs by one character,
    # so the byte-for-byte checks above can fail.
    path = work_dir / "control.jinja"
    path.write_text("{{ messages[0].content }}!", encoding="utf-8")
    got = specula_render(specula_bin, path, [{"messages": [{"role": "user", "content": "x"}]}], work_dir)[0]
    assert got != jinja2_render("{{ messages[0].content }}?", {"messages": [{"role": "user", "content": "x"}]})
    assert got == jinja2_render("{{ messages[0].content }}!", {"messages": [{"role": "user", "content": "x"}]})


@pytest.mark.parametrize("source, error", [
    ("{% if x %}never closed", "the template ends before {% elif %} or {% else %} or {% endif %}"),
    ("{{ x | no_such_filter }}", "unknown filter 'no_such_filter'"),
    ("{% no_such_tag %}", "unknown tag 'no_such_tag'"),
    ("{{ x is no_such_test }}", "unknown test 'no_such_test'"),
    ("{{ 'unterminated }}", "not closed"),
    ("line one\n{{ 1 + }}", "line 2"),
])
def test_a_template_that_does_not_parse_is_one_clear_error(specula_bin, work_dir, source, error):
    path = work_dir / "bad.jinja"
    path.write_text(source, encoding="utf-8")
    proc = subprocess.run([str(specula_bin), "chat-template", "--chat-template", str(path), "--messages",
                           '[{"role": "user", "content": "x"}]'], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert error in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


# Templates that write the tools they are handed and an assistant's structured calls (the others
# get calls as the generic format's JSON after the text: model/chat_template.cpp).
TOOL_TEMPLATES = {"qwen2.5.jinja", "chatml-tools-hermes.jinja", "llama3.1.jinja"}


def openai_tool_conversations():
    """Conversations as an OpenAI client sends them: arguments as JSON text, content null beside calls."""
    tools = tool_cases()[0]["tools"]
    user = {"role": "user", "content": "Weather in Paris and Rome?"}
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call12345", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2, \"hours\": [1.5, 2]}"}}]}
    said = {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "call67890", "type": "function", "function": {"name": "now", "arguments": "{}"}}]}
    result = {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temperature\": 21.5}"}
    return [
        {"messages": [user], "tools": tools},
        {"messages": [user, call, result], "tools": tools},
        {"messages": [{"role": "system", "content": "Use tools."}, user, said, result], "tools": tools},
        {"messages": [user, call, result, {"role": "assistant", "content": "21.5 degrees."}, user], "tools": tools},
    ]


def hugging_face_form(messages):
    """What vLLM and llama.cpp hand a template: calls' arguments parsed, each call with its id."""
    out = []
    for m in messages:
        h = {"role": m["role"], "content": m.get("content")}
        if m.get("tool_calls"):
            h["tool_calls"] = [{"id": c["id"], "type": "function",
                                "function": {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        if m["role"] == "tool":
            h.update({k: m[k] for k in ("tool_call_id", "name") if k in m})
        out.append(h)
    return out


def generic_form(messages):
    """The generic format: an assistant's calls as compact JSON after its text."""
    out = []
    for m in messages:
        text = m.get("content") or ""
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "parameters": json.loads(c["function"]["arguments"])} for c in m["tool_calls"]]
            text += ("\n" if text else "") + json.dumps({"tool_calls": calls}, separators=(",", ":"), ensure_ascii=False)
        out.append({"role": m["role"], "content": text})
    return out


@pytest.mark.parametrize("name", sorted(TOOL_TEMPLATES | {"zephyr.jinja", "gemma.jinja"}))
def test_an_openai_conversation_with_tools_reaches_the_template_as_hugging_face_hands_it(specula_bin, work_dir, name):
    path = TEMPLATE_DIR / name
    source = path.read_text(encoding="utf-8")
    cases = openai_tool_conversations()
    got = chat_template_lines(specula_bin, path, cases, work_dir, "tools")
    for case, mine in zip(cases, got, strict=True):
        if name in TOOL_TEMPLATES:
            want = jinja2_render(source, {"messages": hugging_face_form(case["messages"]), "tools": case["tools"],
                                          "add_generation_prompt": True})
        else:
            want = jinja2_render(source, {"messages": generic_form(case["messages"]), "add_generation_prompt": True})
        if "text" in want:
            assert mine == want, f"{name} on {json.dumps(case)[:300]}"
            if name in TOOL_TEMPLATES:
                assert "get_weather" in mine["text"]
        else:
            assert "error" in mine, f"{name}: Jinja2 gives {want}, Specula rendered {mine}"


def hugging_face_continue(rendered: str, final_message: str) -> str:
    """transformers' apply_chat_template(continue_final_message=True): the rendered chat cut after
    the last place the final message's text appears (its trailing whitespace kept where the
    template kept it); a ValueError where the template does not write that text."""
    if final_message.strip() not in rendered:
        raise ValueError("continue_final_message is set but the final message does not appear in the chat")
    at = rendered.rindex(final_message.strip())
    if rendered[at: at + len(final_message.lstrip())] == final_message:
        return rendered[: at + len(final_message.lstrip())]
    return rendered[: at + len(final_message.strip())]


THINKING = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}"
            "<think></think>{% endif %}{% endif %}{% if tags %}{{ tags | join(',') }}{% endif %}")


@pytest.mark.parametrize("name", sorted(p.name for p in TEMPLATE_DIR.glob("*.jinja")) + ["thinking"])
def test_continue_final_message_and_chat_template_kwargs_render_as_hugging_face_renders_them(specula_bin, work_dir, name):
    """vLLM's continue_final_message (the last message left open for the reply to continue, cut
    as transformers cuts it) and chat_template_kwargs (more template variables), through
    `specula chat-template --input`, against Jinja2 and transformers' cut."""
    path = TEMPLATE_DIR / name if name != "thinking" else work_dir / "thinking.jinja"
    if name == "thinking":
        path.write_text(THINKING, encoding="utf-8")
    source = path.read_text(encoding="utf-8")
    user = {"role": "user", "content": "Name a colour."}
    cases = [{"messages": [user, {"role": "assistant", "content": prefill}], "add_generation_prompt": False,
              "continue_final_message": True} for prefill in ("The colour is", "Sure: ", "  padded  ", "two\nlines\n")]
    # the prefill's text written earlier too: the cut is at its last place
    cases += [{"messages": [{"role": "user", "content": "Blue"}, {"role": "assistant", "content": "Blue"}],
               "add_generation_prompt": False, "continue_final_message": True}]
    cases += [{"messages": [user], "chat_template_kwargs": kwargs} for kwargs in
              ({"enable_thinking": False}, {"enable_thinking": True, "tags": ["a", "b"]})]
    cases += [{"messages": [user, {"role": "assistant", "content": "Blue"}], "add_generation_prompt": False}]
    got = chat_template_lines(specula_bin, path, cases, work_dir, "continue")
    continued = rendered = 0
    for case, mine in zip(cases, got, strict=True):
        variables = {**case.get("chat_template_kwargs", {}), "messages": case["messages"],
                     "add_generation_prompt": case.get("add_generation_prompt", True)}
        want = jinja2_render(source, variables)
        if "text" in want and case.get("continue_final_message"):
            rendered += 1
            try:
                want = {"text": hugging_face_continue(want["text"], case["messages"][-1]["content"])}
                continued += 1
            except ValueError:
                want = {"failed": "not written as it is"}
        if "text" in want:
            assert mine == want, f"{name} on {json.dumps(case)}"
        else:
            assert "error" in mine, f"{name}: Jinja2 / transformers give {want}, Specula rendered {mine}"
    if name == "thinking":
        assert "<think></think>" in got[5]["text"] and "<think>" not in got[6]["text"] and got[6]["text"].endswith("a,b")
    # (a template that fails without tools, as the Hermes one does in Jinja2 too, continues none)
    assert continued >= 2 or rendered == 0, f"{name}: too few cases continued to mean anything"


# Python's printf-style formatting: (format, arguments) rendered as `f % a` (one argument), as
# `f % (a, b)` and `f | format(a, b)` (two), and `f % m` (a mapping).
PERCENT_CASES = [
    ("%s|%r", None), ("[%s]", "é"), ("%s", 1.5), ("%s", True), ("%s", None), ("%s", {"k": 1}), ("%r", "it's"), ("%r", 1.5),
    ("%d", 3), ("%d", -7), ("%d", 3.9), ("%d", True), ("%i", -3.2), ("%5d|", 42), ("%-5d|", 42), ("%05d", -42), ("%+d", 5),
    ("% d", 5), ("%.3d", 5), ("%x", 255), ("%#x", 255), ("%X", 255), ("%#X", 255), ("%o", 8), ("%#o", 8), ("%c", 233),
    ("%c", "é"), ("%5.2f|", 3.14159), ("%f", 2.5), ("%.0f", 2.5), ("%.0f", 3.5), ("%e", 12345.678), ("%+.1e", -0.000123),
    ("%.3g", 0.0001234), ("%g", 1e20), ("%G", 1.5e-10), ("%#g", 1.0), ("%10.4f|", -3.14159), ("%-8s|", "ab"),
    ("%8s|", "ab"), ("%.2s", "héllo"), ("%5s|", "é"), ("100%% %s", "sure"), ("%.1f%%", 99.5), ("%ld", 7), ("%s", ""),
    ("%s %s", "one"), ("%d", "x"), ("%x", 1.5), ("%c", 1114112), ("%z", 1), ("%", 1), ("%s", [1, "a"]),
    ("%d", 9.21e18), ("%a", "é"), ("%a", "日\U0001F600"), ("%lld", 1), ("%5%|%s", 1), ("%.1500f", 1.0), ("%.300d", 7),
]
PERCENT_PAIRS = [("%s and %s", 1, "b"), ("%*d|", 5, 42), ("%-*d|", 5, 42), ("%.*f", 2, 3.14159), ("%s", 1, 2),
                 ("%(a)s", 1, 2)]
PERCENT_MAPPINGS = [("%(a)s-%(b)05.1f", {"a": "x", "b": 2.25}), ("%(missing)s", {"a": 1}), ("%s", {"a": 1}),
                    ("%(a)s %%", {"a": [1, 2]}), ("no conversions", {"a": 1}), ("%(a)s %s", {"a": 1}), ("%(a)%", {"a": 1})]


def test_printf_style_formatting_renders_as_python_formats_it(specula_bin, work_dir):
    """`'...' % x` and the format filter: Python's printf-style formatting, against Jinja2. A list is
    taken as the arguments (a tuple) here, where Python formats a list as one argument: the one
    case that differs, and is checked for its error."""
    mismatches = []
    for name, source, cases in (
            ("one", "{{ f % a }}", [{"f": f, "a": a} for f, a in PERCENT_CASES]),
            ("two", "{{ f % (a, b) }}|{{ f | format(a, b) }}", [{"f": f, "a": a, "b": b} for f, a, b in PERCENT_PAIRS]),
            ("mapping", "{{ f % m }}", [{"f": f, "m": m} for f, m in PERCENT_MAPPINGS]),
            ("keywords", "{{ f | format(a=x, b=y) }}", [{"f": "%(a)s-%(b)s", "x": 1, "y": "z"}, {"f": "%(c)s", "x": 1, "y": 2}]),
            ("specials", "{{ f % (x | float) }}|{{ f % (y | float) }}|{{ f % (z | float) }}",  # (not constants: Jinja2 folds them into bad code)
             [{"f": f, "x": "-inf", "y": "nan", "z": "inf"} for f in ("%010f|", "%-10f|", "%+F", "% e")]),
            ("undefined", "{{ f % nothing }}", [{"f": "abc"}, {"f": "%s|"}]),
            ("namespace", "{{ f % namespace(a=1) }}", [{"f": "%(a)s"}])):  # (a namespace is not a mapping)
        path = work_dir / f"percent_{name}.jinja"
        path.write_text(source, encoding="utf-8")
        got = specula_render(specula_bin, path, cases, work_dir)
        for case, mine in zip(cases, got, strict=True):
            want = jinja2_render(source, case)
            if isinstance(case.get("a"), list) and name == "one":
                if "error" not in mine:  # (a list: its items are the arguments here)
                    mismatches.append((source, case, "expected an error", mine))
            elif "text" in want:
                if mine != want:
                    mismatches.append((source, case, want, mine))
            elif "error" not in mine:
                mismatches.append((source, case, want, mine))
    assert not mismatches, "\n".join(map(str, mismatches))


# Qwen3's way with an assistant's earlier reasoning: written from `reasoning_content` where the
# message has one (a string, even empty), else taken from a <think> block in its content.
QWEN3_LIKE = ("{%- for m in messages %}{%- if m.role == 'assistant' %}{%- set content = m.content or '' %}"
              "{%- if m.reasoning_content is string %}{%- set reasoning = m.reasoning_content %}"
              "{%- elif '</think>' in content %}{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}"
              "{%- set content = content.split('</think>')[-1] %}{%- else %}{%- set reasoning = none %}{%- endif %}"
              "<|im_start|>assistant\n{% if reasoning is not none %}<think>\n{{ reasoning.strip('\\n') }}\n</think>\n\n{% endif %}"
              "{{ content.lstrip('\\n') }}<|im_end|>\n{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
              "{%- endfor %}")


def test_an_assistants_earlier_reasoning_reaches_the_template_as_reasoning_content(specula_bin, work_dir):
    """An assistant message's reasoning_content (what a reasoning reply came back with) is handed to
    the template as the message's own field, as vLLM and transformers hand it; a message without
    one has none (the template then reads its content), and an empty one is still a string."""
    path = work_dir / "qwen3_like.jinja"
    path.write_text(QWEN3_LIKE, encoding="utf-8")
    user = {"role": "user", "content": "Is 7 prime?"}
    cases = [{"messages": [user, {"role": "assistant", "content": "Yes.", "reasoning_content": "\nIt has no divisors.\n"}, user]},
             {"messages": [user, {"role": "assistant", "content": "<think>Check 2..6.</think>Yes."}, user]},
             {"messages": [user, {"role": "assistant", "content": "Yes.", "reasoning_content": ""}, user]},
             {"messages": [user, {"role": "assistant", "content": "Yes."}, user]}]
    got = chat_template_lines(specula_bin, path, cases, work_dir, "reasoning_content")
    for case, mine in zip(cases, got, strict=True):
        want = jinja2_render(QWEN3_LIKE, {"messages": case["messages"], "add_generation_prompt": True})
        assert mine == want, (case, mine, want)
    assert "It has no divisors." in got[0]["text"] and "Check 2..6." in got[1]["text"]
    assert "<think>\n\n</think>" in got[2]["text"] and "<think>" not in got[3]["text"]
