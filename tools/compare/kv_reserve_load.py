"""What reserving KV as requests grow (`specula serve --kv-reserve as-needed`, the default) does
under load against reserving each request's prompt + max_tokens at admission (`--kv-reserve
max-tokens`): the same closed-loop load from `specula-load` against a server of each kind in turn
(the main job's drafter, scripts/main_job.args, `--kv-tokens` as given), repeated, the two
alternating. The requests ask for many more tokens than the answers take (`--max-tokens 2048`, as
clients often set), so reserving max_tokens admits few at a time while their answers leave most
of their reservations unused. Reported per run: tokens/s in all, the server's preemptions, the
most requests running at once (/metrics' gauge, sampled), time to first token and end-to-end
latency (mean, p50, p90, ms) from specula-load's records, and as-needed's tokens/s over
max-tokens' in the same round. Prints one JSON object.

    build/venv/bin/python tools/compare/kv_reserve_load.py [--specula build/specula] [--load build/specula-load]
        [--prompts ../shared/data/prompts/chat.jsonl] [--concurrency 16] [--requests 64] [--max-tokens 2048]
        [--kv-tokens 16384] [--repeat 2]
"""
import argparse
import json
import pathlib
import shlex
import subprocess
import tempfile
import threading

from specula_server import add_load_args, describe, metric, serving

ROOT = pathlib.Path(__file__).resolve().parents[2]


def one_run(args, job, reserve, tmp):
    with serving(args.specula, [*job, "--kv-tokens", str(args.kv_tokens), "--kv-reserve", reserve]) as (url, _):
        out = pathlib.Path(tmp) / "load.json"
        most = [0]
        done = threading.Event()

        def watch():  # the running gauge's largest value during the load
            while not done.is_set():
                most[0] = max(most[0], metric(url, "specula_requests_running"))
                done.wait(0.05)
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            subprocess.run([args.load, "--url", url + "/v1/chat/completions", "--prompts", args.prompts,
                            "--concurrency", str(args.concurrency), "--requests", str(args.requests),
                            "--max-tokens", str(args.max_tokens), "--temperature", "0", "--quiet", "--out", str(out)],
                           check=True, stdout=subprocess.DEVNULL)
        finally:
            done.set()
            watcher.join()
        run = json.loads(out.read_text())
        ok = [r for r in run["requests"] if r["ok"]]
        return {"tokens_per_s": round(run["summary"]["total_tokens_per_s"], 1),
                "output_tokens": sum(r["output_tokens"] for r in ok),
                "failed": len(run["requests"]) - len(ok),
                "preemptions": metric(url, "specula_preemptions_total"),
                "finish_reasons": {k: sum(1 for r in ok if r["finish_reason"] == k) for k in {r["finish_reason"] for r in ok}},
                "most_running": most[0],
                "ttft_ms": describe([r["ttft_ms"] for r in ok]), "e2e_ms": describe([r["e2e_ms"] for r in ok])}


def main():
    ap = argparse.ArgumentParser()
    add_load_args(ap, ROOT, requests=64, max_tokens=2048)
    ap.add_argument("--kv-tokens", type=int, default=16384)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    job = shlex.split((ROOT / "scripts" / "main_job.args").read_text())
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            r = {reserve: one_run(args, job, reserve, tmp) for reserve in ("max-tokens", "as-needed")}
            r["as_needed_over_max_tokens"] = round(r["as-needed"]["tokens_per_s"] / r["max-tokens"]["tokens_per_s"], 3)
            rounds.append(r)
    print(json.dumps({"concurrency": args.concurrency, "requests": args.requests, "max_tokens": args.max_tokens,
                      "kv_tokens": args.kv_tokens, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
