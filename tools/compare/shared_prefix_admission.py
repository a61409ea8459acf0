"""What charging a joining request only for the blocks that running requests do not already hold
(docs/engine.md, "Shared blocks charged at admission") does under load, against a build that charges
each joining request its whole context (`--baseline`, the build of any commit before it): the chat
prompts, each behind one long system prompt (1,178 tokens, the same for all, as a deployment's
instructions are), from `specula-load` against `specula serve` with the main job's drafter
(scripts/main_job.args) and a KV pool too small for every session's whole context, the two builds
one after the other in each round, the first of them alternating from round to round. Reported per
run as by kv_reserve_load.py (tokens/s, preemptions, the most requests running at once, time to
first token and end to end), and this build's tokens/s over the baseline's in the same round. Prints
one JSON object.

    build/venv/bin/python tools/compare/shared_prefix_admission.py --baseline OLD/build/specula
        [--specula build/specula] [--load build/specula-load] [--prompts ../shared/data/prompts/chat.jsonl]
        [--concurrency 16] [--requests 64] [--max-tokens 128] [--kv-tokens 4096] [--repeat 2]
"""
import argparse
import json
import pathlib
import shlex
import tempfile

from specula_server import add_load_args, load_run

ROOT = pathlib.Path(__file__).resolve().parents[2]

TOPICS = ["billing", "shipping", "returns", "warranties", "accounts", "passwords", "privacy", "orders",
          "discounts", "gift cards", "subscriptions", "invoices", "deliveries", "refunds", "repairs",
          "installations", "manuals", "spare parts", "complaints", "feedback"]


def system_prompt():
    """A deployment's long instructions: a rule for each of TOPICS, 1,178 tokens of the default model."""
    rules = [f"Rule {i + 1}, {t}: when the user asks about {t}, answer in plain words, give the steps in the "
             f"order the user takes them, name the page of the help centre that covers {t}, and never promise "
             f"a date or an amount that the records do not show." for i, t in enumerate(TOPICS)]
    return ("You are the assistant of a company that sells household appliances. Follow these rules in every "
            "answer, and answer questions outside them as a careful, friendly expert would.\n" + "\n".join(rules))


def main():
    ap = argparse.ArgumentParser()
    add_load_args(ap, ROOT, requests=64, max_tokens=128)
    ap.add_argument("--baseline", required=True, help="a specula binary that charges joining requests their whole context")
    ap.add_argument("--kv-tokens", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    job = shlex.split((ROOT / "scripts" / "main_job.args").read_text())
    system = system_prompt()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        prompts = pathlib.Path(tmp) / "prompts.jsonl"
        with open(args.prompts) as src, open(prompts, "w") as dst:
            for line in src:
                p = json.loads(line)
                p["messages"] = [{"role": "system", "content": system}, *p["messages"]]
                dst.write(json.dumps(p) + "\n")
        serve = [*job, "--kv-tokens", str(args.kv_tokens)]
        for i in range(args.repeat):
            builds = [("baseline", args.baseline), ("this", args.specula)]
            r = {name: load_run(args, serve, tmp, prompts, binary) for name, binary in (builds if i % 2 == 0 else builds[::-1])}
            r["this_over_baseline"] = round(r["this"]["tokens_per_s"] / r["baseline"]["tokens_per_s"], 3)
            rounds.append(r)
    print(json.dumps({"concurrency": args.concurrency, "requests": args.requests, "max_tokens": args.max_tokens,
                      "kv_tokens": args.kv_tokens, "system_prompt_chars": len(system), "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
