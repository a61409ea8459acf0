"""Drives the `specula` program the way the oracle tests need it: `logits` (.npy of every
position's logits) and greedy `generate --json`. A failing run raises AssertionError carrying
the command line and its stderr. SPECULA_DEVICE (e.g. "cuda"), when set, is passed as --device
so the same oracles check another device. The host runs its f32 reference path (SPECULA_SIMD=
reference) unless a call passes simd=None (the environment's path, by default the int8 path) or
another value: the oracles' tight bounds are for f32 activations."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import uuid

import numpy as np


def _run(cmd: list[str], timeout: float, simd: str | None = "reference") -> subprocess.CompletedProcess:
    if os.environ.get("SPECULA_DEVICE"):
        cmd = cmd + ["--device", os.environ["SPECULA_DEVICE"]]
    env = dict(os.environ)
    if simd is not None:
        env["SPECULA_SIMD"] = simd
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {' '.join(map(str, cmd))}\n{proc.stderr.strip()[-2000:]}")
    return proc


def logits(specula_bin, model, tokens, work_dir, chunk: int | None = None, truncate_at: int | None = None,
           timeout: float = 120, simd: str | None = "reference", with_hidden: bool = False, feature_layers=None):
    """`specula logits`: float32 [len(tokens), vocab]. With truncate_at T, rows >= T come from
    re-feeding tokens[T:] (in chunks of `chunk`) after truncating the KV cache to T. With
    with_hidden, (logits, final hidden states [len(tokens), hidden])."""
    out = pathlib.Path(work_dir) / f"logits-{uuid.uuid4().hex}.npy"
    cmd = [specula_bin, "logits", "--model", model, "--tokens", ",".join(map(str, tokens)), "--out", out]
    if chunk is not None:
        cmd += ["--chunk", chunk]
    if truncate_at is not None:
        cmd += ["--truncate-at", truncate_at]
    hidden_path = pathlib.Path(work_dir) / f"hidden-{uuid.uuid4().hex}.npy"
    if with_hidden:
        cmd += ["--hidden-out", hidden_path]
    if feature_layers is not None:
        cmd += ["--feature-layers", ",".join(map(str, feature_layers))]
    _run(cmd, timeout, simd)
    try:
        arr = np.load(out)
        hidden = np.load(hidden_path) if with_hidden else None
    finally:
        out.unlink(missing_ok=True)
        hidden_path.unlink(missing_ok=True)
    assert arr.dtype == np.float32, f"specula logits wrote {arr.dtype}, expected float32"
    assert arr.ndim == 2 and arr.shape[0] == len(tokens), f"specula logits wrote shape {arr.shape} for {len(tokens)} tokens"
    return (arr, hidden) if with_hidden else arr


def generate_greedy(specula_bin, model, prompt_ids=None, max_tokens: int = 16, prompt: str | None = None,
                    chat: bool = False, timeout: float = 300, simd: str | None = "reference") -> dict:
    """`specula generate (--prompt-ids ... | --prompt TEXT [--chat]) --temperature 0 --json`:
    the JSON object it prints."""
    cmd = [specula_bin, "generate", "--model", model, "--max-tokens", max_tokens, "--temperature", 0, "--json"]
    cmd += ["--prompt-ids", ",".join(map(str, prompt_ids))] if prompt is None else ["--prompt", prompt]
    if chat:
        cmd.append("--chat")
    text = _run(cmd, timeout, simd).stdout.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        # Tolerate log lines before the object: the object is the last line.
        return json.loads(text.splitlines()[-1])
