"""`specula generate` and `specula chat` run through the actor engine, the server's and the C++
API's path (issue 14, item 3); `generate --sequential` runs the sequential loop of spec/, the
method's reference. The engine must print the reference's text for every drafter, greedy and
coupled, and chat must answer as generate does."""
import json
import re
import os
import subprocess

import pytest

from conftest import SHARED_DIR

PROMPT = "Name three colors and say one thing about each."


def generate(specula_bin, model, *flags, prompt=PROMPT):
    p = subprocess.run([str(specula_bin), "generate", "--model", str(model), "--prompt", prompt, "--chat",
                        "--max-tokens", "40", "--json", *flags], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("draft", ["none", "ngram", "eagle", "ngram:n=3+eagle", "skip:10-19"])
def test_generate_through_the_engine_prints_the_sequential_loops_text_greedy_and_coupled(specula_bin, default_model, draft):
    greedy = ["--temperature", "0", "--draft", draft]
    engine = generate(specula_bin, default_model, *greedy)
    reference = generate(specula_bin, default_model, *greedy, "--sequential")
    assert "pipeline" in engine and "pipeline" not in reference  # which path each took
    assert engine["prompt_ids"] == reference["prompt_ids"]
    assert engine["ids"] == reference["ids"] and engine["text"] == reference["text"]
    assert engine["finish_reason"] == reference["finish_reason"]
    assert engine["device"] == reference["device"]
    if draft != "none":
        assert engine["speculative"]["draft"] == draft and engine["speculative"]["sampling"] == "greedy"
        assert engine["speculative"]["drafted"] > 0
    if draft == "skip:10-19":
        return  # the slowest drafter: greedy is enough to show its path
    coupled = ["--temperature", "0.8", "--seed", "3", "--draft", draft, "--spec-sampling", "coupled"]
    a = generate(specula_bin, default_model, *coupled)
    b = generate(specula_bin, default_model, *coupled, "--sequential")
    assert a["ids"] == b["ids"], "coupled sampling through the engine differs from the sequential loop"
    assert a["seed"] == b["seed"] == 3


def test_generate_refuses_bad_prompt_ids_and_an_empty_prompt_in_one_line(specula_bin, default_model):
    for flags, words in ((["--prompt-ids", "1,99999"], ["--prompt-ids", "99999", "outside the vocabulary"]),
                         (["--prompt", ""], ["the prompt is empty"])):
        p = subprocess.run([str(specula_bin), "generate", "--model", str(default_model), "--max-tokens", "2", *flags],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and p.stdout == ""
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
        for w in words:
            assert w in p.stderr, p.stderr


def test_pipelining_where_the_streams_would_share_the_cores_is_declined_in_one_line_unless_always(specula_bin, default_model):
    """--pipeline on with --threads as many as the CPUs (the draft stream's pool as many again):
    the two streams would take turns on the same cores, so the engine does not pipeline and says
    so in one line; --pipeline always pipelines anyway; both give target-only's greedy text."""
    cpus = str(len(os.sched_getaffinity(0)))
    flags = ["--temperature", "0", "--draft", "ngram", "--threads", cpus]
    p = subprocess.run([str(specula_bin), "generate", "--model", str(default_model), "--prompt", PROMPT, "--chat",
                        "--max-tokens", "40", "--json", *flags, "--pipeline", "on"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    declined = json.loads(p.stdout.strip().splitlines()[-1])
    assert declined["pipeline"] is True and declined["pipelined"] is False
    lines = [line for line in p.stderr.splitlines() if "not pipelining" in line]
    assert len(lines) == 1 and f"{cpus} CPUs" in lines[0] and "--pipeline always" in lines[0], p.stderr
    forced = generate(specula_bin, default_model, *flags, "--pipeline", "always")
    assert forced["pipelined"] is True
    assert declined["ids"] == forced["ids"] == generate(specula_bin, default_model, *flags, "--pipeline", "off")["ids"]
    bad = subprocess.run([str(specula_bin), "generate", "--model", str(default_model), "--prompt", PROMPT, "--pipeline", "sometimes"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and bad.stdout == ""
    assert "--pipeline must be off, on or always, got 'sometimes'" in bad.stderr, bad.stderr


def test_prompt_lookup_in_front_of_the_head_prints_target_only_greedy_text_pipelined_or_not(specula_bin, default_model):
    """The main job's drafter through the engine, with the optimistic continuation forced and
    without, and through the sequential loop: the head drafts on from its own features only after
    a round it drafted itself, with lookup's rounds in between (a prompt whose reply repeats
    the prompt); the text is target-only's every time. K is fixed (4, with the entropy rule) where
    the test asserts that drafts were accepted: under the main job's adaptive K the engine's
    load-adaptive policy picks K from measured forward times, and beside other tests it may hold
    the drafter at K = 0 for a whole short reply (CI saw 0 accepted once). The main job's adaptive
    settings run too, for the text alone."""
    prompt = "Repeat this list twice: apples, pears, plums, figs, dates."
    flags = ["--temperature", "0", "--max-tokens", "80"]
    fixed = [*flags, "--spec-k", "4", "--draft-entropy", "2", "--draft", "ngram:n=3+eagle"]
    want = generate(specula_bin, default_model, *flags, "--draft", "none", prompt=prompt)
    for pipeline in ("off", "always"):
        got = generate(specula_bin, default_model, *fixed, "--pipeline", pipeline, prompt=prompt)
        assert got["pipelined"] is (pipeline == "always")
        assert got["ids"] == want["ids"], pipeline
        assert got["speculative"]["accepted"] > 0, got["speculative"]
    adaptive = generate(specula_bin, default_model, *flags, "--adaptive", "--draft-entropy", "2", "--draft", "ngram:n=3+eagle",
                        "--pipeline", "always", prompt=prompt)
    assert adaptive["ids"] == want["ids"]
    seq = subprocess.run([str(specula_bin), "generate", "--model", str(default_model), "--prompt", prompt, "--chat", "--json",
                          *fixed, "--sequential"], capture_output=True, text=True, timeout=300)
    assert seq.returncode == 0, seq.stderr
    sequential = json.loads(seq.stdout.strip().splitlines()[-1])
    assert sequential["ids"] == want["ids"] and sequential["speculative"]["accepted"] > 0


def test_the_engine_benchmark_reports_pipelining_declined_on_shared_cores_and_forced_with_pipeline_always(specula_bin, default_model):
    """`bench spec --pipeline both`: each run's JSON says whether the engine pipelined; with
    --threads as many as the CPUs the pipelined configuration runs unpipelined (and the summary
    line says so) unless --pipeline-always."""
    cpus = str(len(os.sched_getaffinity(0)))
    base = [str(specula_bin), "bench", "spec", "--model", str(default_model), "--threads", cpus, "--concurrency", "1",
            "--pipeline", "both", "--drafts", "ngram", "--requests", "2", "--max-tokens", "8",
            "--prompts", str(SHARED_DIR / "data" / "prompts" / "chat.jsonl"), "--limit", "2"]
    for extra, forced in (([], False), (["--pipeline-always"], True)):
        p = subprocess.run(base + extra, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        runs = {r["config"]: r for r in json.loads(p.stdout)["runs"]}
        assert runs["ngram"]["pipelined"] is False
        assert runs["ngram pipelined"]["pipeline"] is True and runs["ngram pipelined"]["pipelined"] is forced
        assert ("declined: shared cores" in p.stderr) is not forced, p.stderr


def chat(specula_bin, model, lines, *flags):
    p = subprocess.run([str(specula_bin), "chat", "--model", str(model), "--temperature", "0", "--max-tokens", "40", *flags],
                       input="".join(line + "\n" for line in lines), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p


def test_chat_answers_through_the_engine_as_generate_does_and_keeps_the_conversation(specula_bin, default_model):
    p = chat(specula_bin, default_model, [PROMPT, "Which of them is the warmest?", "/reset", PROMPT, "/quit"],
             "--draft", "ngram")
    replies = p.stdout.rstrip("\n").split("\n")
    want = generate(specula_bin, default_model, "--temperature", "0", "--max-tokens", "40")["text"]
    # The first reply is generate's text for the same message (a reply may hold newlines, so
    # compare the stream's start); after /reset the same message gets the same reply again.
    assert p.stdout.startswith(want + "\n"), (p.stdout, want)
    assert "(conversation cleared)" in p.stdout
    after_reset = p.stdout.split("(conversation cleared)\n", 1)[1]
    assert after_reset.startswith(want + "\n")
    # The second turn answered in context: a reply, with the whole conversation as its prompt.
    stats = [line for line in p.stderr.splitlines() if line.startswith("[") and "tok/s decode" in line]
    assert len(stats) == 3, p.stderr
    prompts = [int(line.split("prompt ")[1].split(" tokens")[0]) for line in stats]
    assert prompts[1] > prompts[0] + 40 and prompts[2] == prompts[0], prompts
    assert sum(1 for line in p.stderr.splitlines() if line.startswith("[ngram:")) == 3
    assert replies


def test_chat_past_the_context_says_so_clears_the_conversation_and_goes_on(specula_bin, default_model):
    long = "Please tell me everything you know about the history of the Roman Empire in detail."
    p = chat(specula_bin, default_model, ["Hi", long, long, "Hi", "/quit"], "--ctx", "96")
    assert "maximum context length" in p.stderr and "the conversation was cleared" in p.stderr, p.stderr
    stats = [line for line in p.stderr.splitlines() if "tok/s decode" in line]
    assert len(stats) >= 2, p.stderr  # the turns before and after the refusal were answered


def test_the_loop_benchmark_runs_every_combination_of_listed_draft_lengths_in_one_pass(specula_bin, default_model):
    """`bench spec --spec-k 1,3 --draft-confidence 0.2,0.9`: each drafter runs once per
    combination (the last option varying fastest), each run names its settings and keeps to them
    (no round drafts more than its K), greedy text equals target-only in every run; a bad item in a
    list, an empty list, and a list with --concurrency are one clear error each."""
    base = [str(specula_bin), "bench", "spec", "--model", str(default_model), "--drafts", "eagle", "--max-tokens", "24",
            "--prompts", str(SHARED_DIR / "data" / "prompts" / "chat.jsonl"), "--limit", "2"]
    p = subprocess.run(base + ["--spec-k", "1,3", "--draft-confidence", "0.2,0.9"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert "draft_confidence" not in out  # with a grid, only the runs name their settings
    runs = [r for r in out["runs"] if r["draft"] != "none"]
    assert [(r["draft_length"]["k"], round(r["draft_length"]["draft_confidence"], 6)) for r in runs] == \
        [(1, 0.2), (1, 0.9), (3, 0.2), (3, 0.9)]
    for r in runs:
        assert r["text_matches_target"] is True, r
        assert max(b["drafts"] for b in r["verify_cost_by_draft_length"]) <= r["draft_length"]["k"], r
    assert runs[2]["mean_draft_length"] > 1 and runs[2]["drafted"] > runs[3]["drafted"], runs

    for extra, says in ((["--draft-confidence", "0.3,x"], "--draft-confidence expects a number, got 'x'"),
                        (["--spec-k", ","], "--spec-k names no value"),
                        (["--spec-k", "2,17"], "--spec-k"),
                        (["--concurrency", "1", "--spec-k", "2,3"], "--spec-k takes one value with --concurrency")):
        bad = subprocess.run(base + extra, capture_output=True, text=True, timeout=300)
        assert bad.returncode == 2 and says in bad.stderr and "Traceback" not in bad.stderr, (extra, bad.stderr)
        assert bad.stdout == "", (extra, bad.stdout)


def test_the_loop_benchmark_runs_the_automatic_confidence_threshold_beside_a_fixed_one(specula_bin, default_model):
    """`bench spec --adaptive --draft-confidence 0.3,auto`: the automatic run names itself and its
    starting threshold, keeps the greedy text, and after its warm-up drafts at thresholds of its
    own (their mean is not the start); the fixed run's mean threshold is its own."""
    cmd = [str(specula_bin), "bench", "spec", "--model", str(default_model), "--drafts", "eagle", "--max-tokens", "64",
           "--prompts", str(SHARED_DIR / "data" / "prompts" / "chat.jsonl"), "--limit", "2", "--adaptive",
           "--spec-k-max", "4", "--draft-confidence", "0.3,auto"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    fixed, auto = [r for r in json.loads(p.stdout)["runs"] if r["draft"] != "none"]
    assert fixed["draft_length"]["draft_confidence"] == 0.3 and fixed["mean_confidence_threshold"] == pytest.approx(0.3)
    assert auto["draft_length"]["draft_confidence"] == "auto" and auto["draft_length"]["draft_confidence_start"] == 0.3
    assert fixed["text_matches_target"] is True and auto["text_matches_target"] is True
    assert 0.05 <= auto["mean_confidence_threshold"] <= 0.95
    assert auto["mean_confidence_threshold"] != pytest.approx(0.3, abs=1e-4), auto


def test_the_loop_benchmark_repeats_each_prompt_and_reports_each_pass_and_the_least_time(specula_bin, default_model):
    """`bench spec --repeat 2`: each prompt's configurations run twice (the second time in reverse
    order, target-only last), with the same text each time; each run reports a speedup per pass
    and one from each prompt's fastest run, which is at least the mean's tokens/s. --repeat outside
    1..100 and the engine's options without --concurrency are one clear error each."""
    base = [str(specula_bin), "bench", "spec", "--model", str(default_model), "--drafts", "ngram;eagle", "--max-tokens", "24",
            "--prompts", str(SHARED_DIR / "data" / "prompts" / "chat.jsonl"), "--limit", "2", "--spec-k", "3"]
    p = subprocess.run(base + ["--repeat", "2"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["repeats"] == 2
    once = json.loads(subprocess.run(base, capture_output=True, text=True, timeout=600, check=True).stdout)
    assert once["repeats"] == 1
    for r, r1 in zip(out["runs"], once["runs"]):
        assert r["draft"] == r1["draft"] and r["tokens"] == 2 * r1["tokens"], (r, r1)
        assert len(r["speedup_by_repeat"]) == 2 and len(r1["speedup_by_repeat"]) == 1
        assert r["least_time_tokens_per_second"] >= r["tokens_per_second"], r
        if r["draft"] == "none":
            assert r["speedup_by_repeat"] == [1.0, 1.0] and r["least_time_speedup"] == 1.0
        else:
            assert r["text_matches_target"] is True, r
            assert (r["drafted"], r["accepted"], r["rounds"]) == (2 * r1["drafted"], 2 * r1["accepted"], 2 * r1["rounds"])
            assert r["least_time_speedup"] > 0 and all(x > 0 for x in r["speedup_by_repeat"]), r
    for extra, says in ((["--repeat", "0"], "--repeat must be 1..100, got 0"),
                        (["--requests", "4"], "--requests is for the engine's bench spec"),
                        (["--pipeline-always"], "--pipeline-always is for the engine's bench spec")):
        bad = subprocess.run(base + extra, capture_output=True, text=True, timeout=300)
        assert bad.returncode == 2 and says in bad.stderr and bad.stdout == "", (extra, bad.stderr)


def test_a_greedy_confidence_threshold_changes_greedy_drafts_only_in_the_loop_and_the_engine(specula_bin, default_model):
    """--draft-confidence-greedy P: greedy requests draft under P instead of --draft-confidence's
    threshold, sampled ones as before. In the loop (`bench spec`, both settings in one run) a strict
    greedy threshold drafts fewer tokens greedy, with the same text, and leaves a seeded T 0.8 run's
    counts exactly as they were; through the engine (`generate`) the same."""
    bench = [str(specula_bin), "bench", "spec", "--model", str(default_model), "--drafts", "eagle", "--max-tokens", "32",
             "--prompts", str(SHARED_DIR / "data" / "prompts" / "chat.jsonl"), "--limit", "2", "--spec-k", "4",
             "--draft-confidence", "0.2", "--draft-confidence-greedy", "0,0.95"]
    counts = {}
    for mode, extra in (("greedy", []), ("exact", ["--temperature", "0.8", "--spec-sampling", "exact", "--seed", "3"])):
        p = subprocess.run(bench + extra, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        runs = [r for r in json.loads(p.stdout)["runs"] if r["draft"] != "none"]
        assert [r["draft_length"].get("draft_confidence_greedy", 0) for r in runs] == [0, 0.95]
        counts[mode] = [(r["drafted"], r["accepted"], r["rounds"]) for r in runs]
    assert counts["greedy"][1][0] < counts["greedy"][0][0], counts
    assert counts["exact"][1] == counts["exact"][0], counts

    def drafted(*flags):
        return generate(specula_bin, default_model, "--draft", "eagle", "--spec-k", "4", "--draft-confidence", "0.2",
                        *flags)["speculative"]["drafted"]

    assert drafted("--draft-confidence-greedy", "0.95", "--temperature", "0") < drafted("--temperature", "0")
    sampled = ("--temperature", "0.8", "--seed", "5", "--spec-sampling", "exact")
    assert drafted("--draft-confidence-greedy", "0.95", *sampled) == drafted(*sampled)
    bad = subprocess.run(bench[:-1] + ["1.5"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "greedy draft confidence threshold must be in [0, 1)" in bad.stderr, bad.stderr


def test_a_greedy_k_max_lengthens_greedy_drafts_only_in_the_loop_and_the_engine(specula_bin, default_model):
    """--spec-k-max-greedy K: greedy requests draft up to K tokens a round instead of --spec-k-max,
    sampled ones as before. With adaptive K and a confidence threshold low enough that the rule
    rarely ends a draft, a round drafts up to K_max: greedy rounds reach past --spec-k-max's 2 with
    a greedy K_max of 6 and never past 6, sampled rounds never past 2; the JSON names both ranges."""
    lengths = ["--draft", "eagle", "--adaptive", "--spec-k", "2", "--spec-k-max", "2", "--draft-confidence", "0.01"]
    bench = [str(specula_bin), "bench", "spec", "--model", str(default_model), "--drafts", "eagle", "--max-tokens", "48",
             "--prompts", str(SHARED_DIR / "data" / "prompts" / "chat.jsonl"), "--limit", "2", *lengths[2:],
             "--spec-k-max-greedy", "2,6"]
    for mode, extra in (("greedy", []), ("exact", ["--temperature", "0.8", "--spec-sampling", "exact", "--seed", "3"])):
        p = subprocess.run(bench + extra, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        runs = [r for r in json.loads(p.stdout)["runs"] if r["draft"] != "none"]
        assert [r["draft_length"]["k_range_greedy"] for r in runs] == [[1, 2], [1, 6]]
        deepest = [len(r["per_position_acceptance"]) for r in runs]
        if mode == "greedy":
            assert deepest[0] <= 2 < deepest[1] <= 6, deepest
        else:
            assert max(deepest) <= 2, deepest

    def deepest(*flags):
        return len(generate(specula_bin, default_model, *lengths, *flags)["speculative"]["per_position_acceptance"])

    assert 2 < deepest("--spec-k-max-greedy", "6", "--temperature", "0") <= 6
    assert deepest("--temperature", "0") <= 2
    assert deepest("--spec-k-max-greedy", "6", "--temperature", "0.8", "--seed", "5", "--spec-sampling", "exact") <= 2


def test_logit_bias_min_tokens_and_ignore_eos_flags_steer_the_engine_and_the_loop_alike(specula_bin, default_model):
    greedy = ["--temperature", "0"]
    short = "Say hi."
    plain = generate(specula_bin, default_model, *greedy, prompt=short)
    assert plain["finish_reason"] == "stop" and len(plain["ids"]) < 30, plain  # ends well before max_tokens
    # The first token banned: the text changes, and the engine drafting with the head prints the
    # loop's target-only text.
    ban = ["--logit-bias", f"{plain['ids'][0]}:-100"]
    engine = generate(specula_bin, default_model, *greedy, *ban, "--draft", "eagle", prompt=short)
    loop = generate(specula_bin, default_model, *greedy, *ban, "--sequential", prompt=short)
    assert engine["ids"] == loop["ids"] and engine["ids"][0] != plain["ids"][0]
    # min_tokens keeps the answer going past its stop token; ignore_eos to max_tokens.
    n = len(plain["ids"]) + 5
    longer = generate(specula_bin, default_model, *greedy, "--min-tokens", str(n), "--draft", "ngram", prompt=short)
    assert len(longer["ids"]) >= n and longer["ids"][:len(plain["ids"]) - 1] == plain["ids"][:-1]
    assert generate(specula_bin, default_model, *greedy, "--min-tokens", str(n), "--sequential", prompt=short)["ids"] == \
        longer["ids"]
    whole = generate(specula_bin, default_model, *greedy, "--ignore-eos", prompt=short)
    assert whole["finish_reason"] == "length" and len(whole["ids"]) == 40
    assert generate(specula_bin, default_model, *greedy, "--ignore-eos", "--sequential", prompt=short)["ids"] == whole["ids"]


def test_allowed_token_ids_and_bad_words_flags_steer_the_engine_and_the_loop_alike(specula_bin, default_model, tmp_path):
    """--bad-words and --allowed-token-ids (vLLM's bad_words and allowed_token_ids): a banned word
    is its token sequences banned as vLLM tokenizes it, which equals biasing its one-token forms by
    -100; an allowed set holds every token to it; the engine drafting with the main job's drafter
    prints the loop's target-only text, greedy and coupled."""
    greedy = ["--temperature", "0"]
    ask = "What is the capital of France?"
    plain = generate(specula_bin, default_model, *greedy, prompt=ask)
    assert "Paris" in plain["text"], plain["text"]
    words = tmp_path / "words.jsonl"
    words.write_text('"Paris"\n" Paris"\n')
    subprocess.run([str(specula_bin), "tokenize", "--model", str(default_model), "--input", str(words), "--output",
                    str(tmp_path / "ids.jsonl")], check=True, capture_output=True, timeout=120)
    forms = [json.loads(line)["ids"] for line in (tmp_path / "ids.jsonl").read_text().splitlines()]
    assert all(len(f) == 1 for f in forms), forms  # one token each, so a bias of -100 bans the same
    biased = generate(specula_bin, default_model, *greedy, "--sequential", "--logit-bias",
                      ",".join(f"{f[0]}:-100" for f in forms), prompt=ask)
    allowed = sorted(set(plain["ids"]) - {forms[1][0]})
    for mode in (greedy, ["--temperature", "0.8", "--seed", "3", "--spec-sampling", "coupled"]):
        for lists in (["--bad-words", "Paris"], ["--bad-words", '["Rome", "Paris"]'], ["--allowed-token-ids", ",".join(map(str, allowed))]):
            engine = generate(specula_bin, default_model, *mode, *lists, "--draft", "ngram:n=3+eagle", prompt=ask)
            loop = generate(specula_bin, default_model, *mode, *lists, "--sequential", prompt=ask)
            assert engine["ids"] == loop["ids"], (lists, engine["text"], loop["text"])
            assert "Paris" not in engine["text"], (lists, engine["text"])
            if lists[0] == "--allowed-token-ids":
                assert set(engine["ids"]) <= set(allowed), engine["ids"]
            elif mode == greedy and lists[1] == "Paris":
                assert engine["ids"] == biased["ids"], (engine["text"], biased["text"])
    # `chat` answers as generate does under the lists; `bench spec` runs every request under them.
    p = chat(specula_bin, default_model, [ask, "/quit"], "--bad-words", "Paris", "--draft", "ngram")
    assert p.stdout.startswith(biased["text"] + "\n"), (p.stdout, biased["text"])
    p = subprocess.run([str(specula_bin), "bench", "spec", "--model", str(default_model), "--drafts", "ngram", "--max-tokens", "16",
                        "--prompts", str(SHARED_DIR / "data" / "prompts" / "chat.jsonl"), "--limit", "1", "--bad-words", "Paris"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert sorted(out["sampling"]["bad_words_token_ids"]) == sorted(forms), out["sampling"]
    assert all(r["text_matches_target"] for r in out["runs"] if r["draft"] != "none"), out["runs"]


def test_json_object_makes_the_engine_and_the_loop_write_the_same_json_object(specula_bin, default_model):
    """--json-object (JSON mode, docs/speculative.md): the engine drafting with the main job's
    drafter prints the loop's target-only text, greedy and coupled, and a text a stop token ended
    parses as one object."""
    ask = "Describe a cat as a JSON object with its name and age."
    for mode in (["--temperature", "0"], ["--temperature", "0.8", "--seed", "3", "--spec-sampling", "coupled"]):
        flags = [*mode, "--json-object", "--max-tokens", "120"]
        engine = generate(specula_bin, default_model, *flags, "--draft", "ngram:n=3+eagle", prompt=ask)
        loop = generate(specula_bin, default_model, *flags, "--sequential", prompt=ask)
        assert engine["ids"] == loop["ids"], (engine["text"], loop["text"])
        assert engine["text"].lstrip().startswith("{"), engine["text"]
        if engine["finish_reason"] == "stop":
            assert isinstance(json.loads(engine["text"]), dict), engine["text"]
    plain = generate(specula_bin, default_model, "--temperature", "0", "--max-tokens", "120", prompt=ask)
    assert not plain["text"].lstrip().startswith("{"), "the model writes JSON unasked: the test shows nothing"


def test_json_schema_and_grammar_files_make_the_engine_and_the_loop_write_the_same_text(specula_bin, default_model, tmp_path):
    """--json-schema FILE and --grammar FILE (docs/speculative.md, "Grammars"): the engine drafting
    with the main job's drafter prints the loop's target-only text, greedy and coupled; a text a
    stop token ended is JSON with the schema's members in its order, or a sentence of the grammar."""
    schema = tmp_path / "cat.json"
    schema.write_text(json.dumps({"type": "object", "required": ["name", "age"], "properties": {
        "name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}}}))
    gbnf = tmp_path / "cat.gbnf"
    gbnf.write_text('root ::= "Name: " [A-Z] [a-z]{1,10} "\\nAge: " [0-9]{1,2} "\\n"\n')
    ask = "Describe a cat with its name and age."
    stopped = 0
    for constraint in (["--json-schema", str(schema)], ["--grammar", str(gbnf)]):
        for mode in (["--temperature", "0"], ["--temperature", "0.8", "--seed", "3", "--spec-sampling", "coupled"]):
            flags = [*mode, *constraint, "--max-tokens", "60"]
            engine = generate(specula_bin, default_model, *flags, "--draft", "ngram:n=3+eagle", prompt=ask)
            loop = generate(specula_bin, default_model, *flags, "--sequential", prompt=ask)
            assert engine["ids"] == loop["ids"], (engine["text"], loop["text"])
            if engine["finish_reason"] != "stop":
                continue
            stopped += 1
            if constraint[0] == "--json-schema":
                assert list(json.loads(engine["text"])) == ["name", "age"], engine["text"]
            else:
                assert re.fullmatch(r"Name: [A-Z][a-z]{1,10}\nAge: [0-9]{1,2}\n", engine["text"]), engine["text"]
    assert stopped >= 2, stopped


@pytest.mark.parametrize("flags, words", [
    (["--json-schema", "/nonexistent.json"], ["--json-schema", "cannot read", "/nonexistent.json"]),
    (["--grammar", "{dir}/bad.gbnf"], ["--grammar", "line 1", "rule 'x' is used but not defined"]),
    (["--json-schema", "{dir}/bad.json"], ["--json-schema", "/properties/n: uniqueItems is not supported"]),
    (["--json-schema", "{dir}/bad.json", "--json-object"], ["at most one of --json-object, --json-schema and --grammar"]),
    (["--logit-bias", "5"], ["--logit-bias", "TOKEN_ID:BIAS", "\"5\""]),
    (["--logit-bias", "5:1,x:2"], ["--logit-bias", "\"x:2\""]),
    (["--logit-bias", "5:200"], ["logit_bias", "[-100, 100]"]),
    (["--logit-bias", "99999:1"], ["99999", "vocabulary"]),
    (["--min-tokens", "50", "--max-tokens", "40"], ["min_tokens (50)", "max_tokens (40)"]),
    (["--min-tokens", "-1"], ["--min-tokens"]),
    (["--allowed-token-ids", "99999"], ["--allowed-token-ids", "99999", "vocabulary"]),
    (["--allowed-token-ids", "1,x"], ["--allowed-token-ids", "'x'"]),
    (["--allowed-token-ids", "4294967296"], ["--allowed-token-ids", "4294967296 is out of range"]),
    (["--bad-words", "a, "], ["--bad-words", "bad_words[1] is empty"]),
    (["--bad-words", '["a", 1]'], ["--bad-words", "holds 1, not a string"]),
    (["--bad-words", "[a"], ["--bad-words", "not a JSON array"]),
    (["--allowed-token-ids", "72", "--bad-words", "X"], ["--bad-words", "every token of allowed_token_ids"]),  # 72: "X"
])
def test_bad_logit_bias_and_min_tokens_flags_are_one_line_errors(specula_bin, default_model, flags, words, tmp_path):
    (tmp_path / "bad.gbnf").write_text("root ::= x\n")
    (tmp_path / "bad.json").write_text('{"type": "object", "properties": {"n": {"type": "array", "uniqueItems": true}}}')
    flags = [f.replace("{dir}", str(tmp_path)) for f in flags]
    for path in ([], ["--sequential"]):
        p = subprocess.run([str(specula_bin), "generate", "--model", str(default_model), "--prompt", "Hi",
                            *(flags if "--max-tokens" in flags else [*flags, "--max-tokens", "2"]), *path],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and p.stdout == "", p.stdout
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
        for w in words:
            assert w in p.stderr, p.stderr
