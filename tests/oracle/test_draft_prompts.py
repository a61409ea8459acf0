"""tools/draft/prompts.py, the chat prompts the draft head's data answers (docs/draft.md): the
documented commands must keep writing the prompts that earlier heads were trained on, `--wide`
must widen the space without repeats, and no prompt may be one of the benchmark's."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from conftest import SHARED_DIR, SOURCE_DIR

sys.path.insert(0, str(SOURCE_DIR / "tools"))
from draft import prompts  # noqa: E402  (standard library only)

OPEN = ["qa", "explain", "creative", "howto"]
OTHERS = ["code", "math", "list", "chat", "copy", "rewrite"]


def _digest(rows):
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


@pytest.mark.parametrize("count,seed,kinds,digest", [
    # docs/draft.md, "The fine-tuned head" (open.jsonl, mix.jsonl), and train_draft.sh's default (seed 7)
    (1600, 101, OPEN, "81353ff662bcc16d417b18db2d7f4f8b8d7a108b93c9403a66ab9fc91c77ef2c"),
    (600, 102, OTHERS, "7fa3bcc43df223b856cf6294ea7f7de2726d1af91cdbb446d664d34eec2c1439"),
    (2400, 7, None, "94db7aa9360c931476460cb625658752b3e57177cce232148015a6211a4e9215"),
])
def test_without_wide_a_seed_writes_the_prompts_it_wrote_before_the_wide_lists_existed(count, seed, kinds, digest):
    assert _digest(prompts.generate(count, seed, kinds)) == digest


def _texts(*args, **kwargs):
    return {r["messages"][0]["content"] for r in prompts.generate(*args, **kwargs)}


def test_wide_writes_distinct_prompts_of_every_kind_deterministically_and_repeats_another_seeds_far_less_often():
    rows = prompts.generate(6000, 5, None, wide=True)
    assert len({r["messages"][0]["content"] for r in rows}) == 6000
    assert {r["category"] for r in rows} == set(OPEN + OTHERS)
    assert _digest(rows) == _digest(prompts.generate(6000, 5, None, wide=True))
    # Why the wide lists exist: 3,000 prompts of the open kinds from the base lists share ~60% with
    # another seed's 3,000 (later data repeats earlier data); from the wide lists ~22%.
    base = len(_texts(3000, 5, OPEN) & _texts(3000, 6, OPEN))
    wide = len(_texts(3000, 5, OPEN, wide=True) & _texts(3000, 6, OPEN, wide=True))
    assert wide < base / 2, (base, wide)


def test_no_prompt_of_either_generator_is_a_benchmark_prompt_and_exclude_leaves_out_a_held_out_set(tmp_path):
    bench = SHARED_DIR / "data" / "prompts" / "chat.jsonl"
    bench_texts = {m["content"] for line in bench.read_text().splitlines() if line.strip()
                   for m in json.loads(line)["messages"] if m["role"] == "user"}
    for wide in (False, True):
        assert not _texts(3000, 11, None, wide=wide) & bench_texts
    held = tmp_path / "held.jsonl"
    subprocess.run([sys.executable, "-m", "draft.prompts", "--out", str(held), "--count", "300", "--seed", "3", "--wide"],
                   cwd=SOURCE_DIR / "tools", check=True, capture_output=True)
    out = tmp_path / "train.jsonl"
    p = subprocess.run([sys.executable, "-m", "draft.prompts", "--out", str(out), "--count", "3000", "--seed", "3",
                        "--wide", "--exclude", str(held)], cwd=SOURCE_DIR / "tools", check=True, capture_output=True, text=True)
    held_texts = {json.loads(line)["messages"][0]["content"] for line in held.read_text().splitlines()}
    kept = [json.loads(line)["messages"][0]["content"] for line in out.read_text().splitlines()]
    assert len(held_texts) == 300 and not set(kept) & held_texts
    assert len(kept) == 3000 - 300 and "300 left out" in p.stderr  # the same seed writes the same first 300
