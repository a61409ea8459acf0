"""llama.cpp's decode and prefill speed on a GGUF file, as `specula bench decode` measures Specula's.

The same shape of run: a 128-token prompt, then 128 greedy decode steps, three timed runs after a
warm-up, 2 threads; prints JSON with each run's tokens/s and the median. Uses llama-cpp-python (its
own kernels, built with -march=native, CPU repacking on); scripts/compare_llama_cpp.sh makes the
venv. Tooling only, for docs/benchmarks.md:

    ~/.cache/specula/llama-cpp-venv/bin/python tools/compare/llama_cpp_decode.py --model FILE.gguf
"""
import argparse
import json
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()

    from llama_cpp import Llama  # imported here so that --help works without the wheel

    llm = Llama(model_path=a.model, n_ctx=a.prompt_tokens + a.decode_tokens + 8, n_batch=512, n_threads=a.threads,
                n_threads_batch=a.threads, verbose=False)
    prompt = [100 + (i * 7919) % 20000 for i in range(a.prompt_tokens)]  # the same ids bench decode's harness uses
    prefill, decode = [], []
    for run in range(a.repeat + 1):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        token = int(llm.scores[len(prompt) - 1].argmax())
        for _ in range(a.decode_tokens):
            llm.eval([token])
            token = int(llm.scores[llm.n_tokens - 1].argmax())
        t2 = time.perf_counter()
        if run > 0:  # the first is the warm-up
            prefill.append(a.prompt_tokens / (t1 - t0))
            decode.append(a.decode_tokens / (t2 - t1))
    print(json.dumps({"engine": "llama.cpp (llama-cpp-python)", "model": a.model, "threads": a.threads,
                      "prefill_tokens_per_second": statistics.median(prefill), "prefill_runs": prefill,
                      "decode_tokens_per_second": statistics.median(decode), "decode_runs": decode}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
