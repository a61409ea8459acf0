"""What `--scheduling-policy priority` does under load: the same closed-loop load from
`specula-load` twice against one `specula serve --scheduling-policy priority` (the main job's
drafter, scripts/main_job.args; `--max-batch 4`, so that most of the sessions' requests wait), once
with the prompt lines alternately at priority -1 ("interactive") and 1 ("batch"), once with every
line at 0 (first come, first served); the class of a request is its line's parity in both runs.
Reported per run: tokens/s in all and the server's preemptions (a -1 request that finds the batch
full preempts a running 1, docs/engine.md, "Preemption"); per class: requests, time to first token
and end-to-end latency (mean, p50, p90, ms), from specula-load's own records. Prints one JSON object.

    build/venv/bin/python tools/compare/priority_load.py [--specula build/specula] [--load build/specula-load]
        [--prompts ../shared/data/prompts/chat.jsonl] [--concurrency 16] [--requests 96] [--max-tokens 64]
"""
import argparse
import json
import pathlib
import shlex
import subprocess
import tempfile

from specula_server import add_load_args, describe, metric, serving

ROOT = pathlib.Path(__file__).resolve().parents[2]


def lines_with_priorities(src, dst, priorities):
    """Writes src's prompt lines to dst, line i with priorities[i % 2]; returns each line's id."""
    ids = []
    with open(src) as f, open(dst, "w") as out:
        for i, line in enumerate(x for x in f if x.strip()):
            j = json.loads(line)
            j["id"] = f"p{i}"
            j["priority"] = priorities[i % 2]
            ids.append(j["id"])
            out.write(json.dumps(j) + "\n")
    return ids


def main():
    ap = argparse.ArgumentParser()
    add_load_args(ap, ROOT, requests=96, max_tokens=64)
    args = ap.parse_args()
    job = shlex.split((ROOT / "scripts" / "main_job.args").read_text())
    result = {}
    with tempfile.TemporaryDirectory() as tmp, \
            serving(args.specula, [*job, "--max-batch", "4", "--scheduling-policy", "priority"]) as (url, _):
        for name, priorities in [("priorities -1 / 1", (-1, 1)), ("all 0 (first come, first served)", (0, 0))]:
            prompts = pathlib.Path(tmp) / "prompts.jsonl"
            lines_with_priorities(args.prompts, prompts, priorities)
            out = pathlib.Path(tmp) / "load.json"
            before = metric(url, "specula_preemptions_total")
            subprocess.run([args.load, "--url", url + "/v1/chat/completions", "--prompts", str(prompts),
                            "--concurrency", str(args.concurrency), "--requests", str(args.requests),
                            "--max-tokens", str(args.max_tokens), "--temperature", "0", "--quiet", "--out", str(out)],
                           check=True, stdout=subprocess.DEVNULL)
            run = json.loads(out.read_text())
            classes = {}
            for r in run["requests"]:
                cls = "even lines" + (" (-1)" if priorities[0] else "") if int(r["prompt_id"][1:]) % 2 == 0 \
                    else "odd lines" + (" (1)" if priorities[1] else "")
                c = classes.setdefault(cls, {"ttft": [], "e2e": [], "failed": 0})
                if r["ok"]:
                    c["ttft"].append(r["ttft_ms"])
                    c["e2e"].append(r["e2e_ms"])
                else:
                    c["failed"] += 1
            result[name] = {
                "tokens_per_s": round(run["summary"]["total_tokens_per_s"], 1),
                "preemptions": metric(url, "specula_preemptions_total") - before,
                "classes": {k: {"ttft_ms": describe(v["ttft"]), "e2e_ms": describe(v["e2e"]), "failed": v["failed"]}
                            for k, v in sorted(classes.items())}}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
