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
import tempfile

from specula_server import add_load_args, load_run

ROOT = pathlib.Path(__file__).resolve().parents[2]


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
            r = {reserve: load_run(args, [*job, "--kv-tokens", str(args.kv_tokens), "--kv-reserve", reserve], tmp)
                 for reserve in ("max-tokens", "as-needed")}
            r["as_needed_over_max_tokens"] = round(r["as-needed"]["tokens_per_s"] / r["max-tokens"]["tokens_per_s"], 3)
            rounds.append(r)
    print(json.dumps({"concurrency": args.concurrency, "requests": args.requests, "max_tokens": args.max_tokens,
                      "kv_tokens": args.kv_tokens, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
