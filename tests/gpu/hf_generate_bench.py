"""Hugging Face transformers generate() at the shapes of `specula bench decode --shape`, on the same
GPU, for the side-by-side numbers issue 6 asks for (docs/cuda.md). Random BF16 weights
(transformers' own initialisation) at exactly Llama 3.2 1B / 3B's configuration (vocabulary
128256, tied embeddings, llama3 RoPE), batch 1, greedy, a fixed prompt of random ids, no end token.

Per shape (median of --repeat runs after one warm-up): prefill tokens/s (one forward over the
prompt), generate() end-to-end tokens/s, decode tokens/s ((new tokens - 1) / (generate time -
prefill time)), and the decode fraction of the roofline: bytes read per step (BF16 weights + BF16
KV of the average context) / the device-to-device copy bandwidth measured in the same run with
torch ((read + write) / time), the method `specula bench decode` uses. Prints one JSON object.

usage: python3 tests/gpu/hf_generate_bench.py [--shape llama-3.2-1b,llama-3.2-3b] [--device cuda]
           [--prompt-tokens 128] [--decode-tokens 128] [--repeat 3] [--cache dynamic|static]
tiny-1 / tiny-2 (the smoke-test shapes of bench_shape.cpp) run anywhere, on --device cpu too."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def shape_config(name: str) -> dict:
    """The same shapes as tools/specula/bench_shape.cpp's shape_config."""
    c = dict(vocab_size=128256, intermediate_size=8192, num_key_value_heads=8, max_position_embeddings=131072,
             rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=128000,
             eos_token_id=None, hidden_act="silu", attention_bias=False, mlp_bias=False,
             rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192})
    if name == "llama-3.2-1b":
        c.update(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, head_dim=64)
    elif name == "llama-3.2-3b":
        c.update(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24, head_dim=128)
    elif name in ("tiny-1", "tiny-2"):
        two = name == "tiny-2"
        c.update(vocab_size=4096, intermediate_size=512, num_key_value_heads=2, hidden_size=256 if two else 128,
                 num_hidden_layers=4 if two else 2, num_attention_heads=4, head_dim=64 if two else 32)
    else:
        raise SystemExit(f"--shape: llama-3.2-1b, llama-3.2-3b, tiny-1 or tiny-2, got {name!r}")
    return c


def sync(torch, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def copy_bandwidth_gbs(torch, device: str, nbytes: int = 1 << 30) -> float:
    """Median of 10 device-to-device copies, (read + write) / time."""
    n = nbytes // 2
    a = torch.ones(n, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    times = []
    for i in range(12):
        sync(torch, device)
        t0 = time.perf_counter()
        (b if i % 2 else a).copy_(a if i % 2 else b)
        sync(torch, device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    del a, b
    return 2 * (n * 2) / statistics.median(times) / 1e9


def bench_shape(torch, transformers, name: str, args, bandwidth_gbs: float) -> dict:
    cfg = shape_config(name)
    config = transformers.LlamaConfig(**cfg)
    t0 = time.perf_counter()
    with torch.device(args.device):
        model = transformers.LlamaForCausalLM._from_config(config, torch_dtype=torch.bfloat16)
    model.eval()
    sync(torch, args.device)
    build_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(1234)
    prompt = torch.randint(0, cfg["vocab_size"], (1, args.prompt_tokens), generator=gen).to(args.device)
    mask = torch.ones_like(prompt)
    n_new = args.decode_tokens
    kwargs = dict(max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False, pad_token_id=0, eos_token_id=None)
    if args.cache == "static":
        kwargs["cache_implementation"] = "static"

    prefill, generate = [], []
    with torch.inference_mode():
        for r in range(args.repeat + 1):  # run 0 warms up
            sync(torch, args.device)
            t0 = time.perf_counter()
            model(input_ids=prompt, attention_mask=mask, use_cache=True)
            sync(torch, args.device)
            t1 = time.perf_counter()
            out = model.generate(input_ids=prompt, attention_mask=mask, **kwargs)
            sync(torch, args.device)
            t2 = time.perf_counter()
            got = out.shape[1] - prompt.shape[1]
            if got != n_new:
                raise SystemExit(f"{name}: generate() made {got} tokens, asked for {n_new}")
            if r:
                prefill.append(t1 - t0)
                generate.append(t2 - t1)
    tp, tg = statistics.median(prefill), statistics.median(generate)
    decode_tps = (n_new - 1) / max(tg - tp, 1e-9)
    params = sum(p.numel() for p in model.parameters())  # a tied head is counted once
    hidden, vocab, layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    # Per decode step: every weight once (the tied head reads the whole table), one embedding row, BF16 KV.
    weight_bytes = 2 * (params + hidden)
    avg_ctx = args.prompt_tokens + n_new / 2
    kv_bytes = avg_ctx * layers * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
    roofline = bandwidth_gbs * 1e9 / (weight_bytes + kv_bytes) if bandwidth_gbs > 0 else 0
    del model
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"shape": name, "build_seconds": build_s, "prompt_tokens": args.prompt_tokens, "decode_tokens": n_new,
            "cache": args.cache, "prefill_tokens_per_second": args.prompt_tokens / tp,
            "generate_tokens_per_second": n_new / tg, "decode_tokens_per_second": decode_tps,
            "decode_runs_seconds": generate, "weight_bytes_per_token": weight_bytes, "kv_bytes_per_token": kv_bytes,
            "roofline_tokens_per_second": roofline, "roofline_fraction": decode_tps / roofline if roofline else 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama-3.2-1b,llama-3.2-3b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cache", choices=["dynamic", "static"], default="dynamic")
    args = ap.parse_args()
    if args.prompt_tokens < 1 or args.decode_tokens < 2 or args.repeat < 1:
        ap.error("--prompt-tokens >= 1, --decode-tokens >= 2, --repeat >= 1")
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"hf_generate_bench: needs torch and transformers ({e})", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("hf_generate_bench: --device cuda but torch sees no GPU", file=sys.stderr)
        return 2
    bandwidth = copy_bandwidth_gbs(torch, args.device, (1 << 30) if args.device.startswith("cuda") else (1 << 26))
    out = {"bench": "hf_generate", "torch": torch.__version__, "transformers": transformers.__version__,
           "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
           "bandwidth_gb_per_s": bandwidth, "bandwidth_method": "torch copy_ device-to-device, (read + write) / time",
           "shapes": []}
    for name in args.shape.split(","):
        out["shapes"].append(bench_shape(torch, transformers, name, args, bandwidth))
        s = out["shapes"][-1]
        print(f"{name}: decode {s['decode_tokens_per_second']:.1f} tokens/s, "
              f"{100 * s['roofline_fraction']:.0f}% of the roofline", file=sys.stderr)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
