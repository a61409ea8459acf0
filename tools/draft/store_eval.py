"""A datastore drafter measured against the trained head on the same positions (docs/draft.md,
"A datastore of the target's own text"). Retrieval drafting (REST, SuffixDecoding) keeps a large
body of text and proposes what followed the longest earlier match of the context's last tokens;
here the body is the target's own text, the draft data files' tokens. The head's proposals and the
target's greedy chain come from `specula draft-eval --depth D --proposals FILE`.

    python -m draft.store_eval --data A.spd B.spd --proposals P.jsonl [--max-n 16] [--min-n 2]

prints JSON: the mean accepted length of the head and of the store at the same positions, the
best of the two at each position (what a perfect chooser would get), and, by the store's match
length n, what "the store where it matches at least n tokens, the head elsewhere" would accept.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

import numpy as np

from draft import data_format

SEP = -1
_MUL = np.uint64(0x9E3779B97F4A7C15)


def read_tokens(paths) -> list[np.ndarray]:
    """Every record's tokens (prompt and response) of the .spd files. data_format.read maps the
    files, so the hidden rows beside the tokens are never read."""
    return [s.tokens.astype(np.int64) for p in paths for s in data_format.read(p)[1]]


class Store:
    """All n-grams (n = 1..max_n) of the token streams, each keyed by a hash of its tokens read
    backwards from its last one, sorted, with the index of that last token."""

    def __init__(self, streams, max_n: int = 16):
        parts = []
        for s in streams:
            parts += [np.asarray(s, dtype=np.int64), np.array([SEP], dtype=np.int64)]
        self.S = np.concatenate(parts) if parts else np.array([SEP], dtype=np.int64)
        self.max_n = max_n
        N = len(self.S)
        tok = (self.S + 7).astype(np.uint64)
        h = np.zeros(N, np.uint64)
        crosses = self.S == SEP  # an n-gram may not hold a separator
        self.tables = {}
        with np.errstate(over="ignore"):
            for n in range(1, max_n + 1):
                shifted = np.zeros(N, np.uint64)
                shifted[n - 1:] = tok[:N - n + 1]
                h = h * _MUL + shifted
                if n > 1:
                    crosses = crosses.copy()
                    crosses[n - 1:] |= self.S[:N - n + 1] == SEP
                ok = ~crosses
                ok[:n - 1] = False
                idx = np.nonzero(ok)[0]
                order = np.argsort(h[idx], kind="stable")
                self.tables[n] = (h[idx][order], idx[order])

    @staticmethod
    def _key(tokens) -> np.uint64:
        x = np.uint64(0)
        with np.errstate(over="ignore"):
            for t in reversed(list(tokens)):
                x = x * _MUL + np.uint64(int(t) + 7)
        return x

    def matches(self, context, n: int) -> np.ndarray:
        """Indices of the last token of every occurrence of context's last n tokens."""
        hs, idx = self.tables[n]
        key = self._key(context[-n:])
        lo, hi = np.searchsorted(hs, key, "left"), np.searchsorted(hs, key, "right")
        want = np.asarray(context[-n:], dtype=np.int64)
        return np.array([i for i in idx[lo:hi] if np.array_equal(self.S[i - n + 1:i + 1], want)], dtype=np.int64)

    def propose(self, context, depth: int, min_n: int = 2) -> tuple[list[int], int]:
        """(drafts, n): the longest n (max_n down to min_n) whose last-n context occurs, then at
        each depth the most frequent next token among the occurrences still followed by the
        drafts so far (ties to the lower id), stopping at a record's end. ([], 0) if none."""
        for n in range(min(self.max_n, len(context)), min_n - 1, -1):
            at = self.matches(context, n)
            if len(at) == 0:
                continue
            drafts = []
            for d in range(1, depth + 1):
                nxt = self.S[at + d]
                counts = Counter(int(t) for t in nxt if t != SEP)
                if not counts:
                    break
                best = min(counts, key=lambda t: (-counts[t], t))
                drafts.append(best)
                at = at[nxt == best]
            return drafts, n
        return [], 0


def accepted(drafts, target) -> int:
    m = 0
    while m < len(drafts) and m < len(target) and drafts[m] == target[m]:
        m += 1
    return m


def evaluate(store: Store, proposal_lines, min_n: int = 2) -> dict:
    head, mine, ns = [], [], []
    for line in proposal_lines:
        rec = json.loads(line)
        tokens = rec["tokens"]
        for c in rec["chains"]:
            m, target = c["position"], c["target"]
            drafts, n = store.propose(tokens[:m + 1], len(target), min_n)
            head.append(accepted(c["draft"], target))
            mine.append(accepted(drafts, target))
            ns.append(n)
    head, mine, ns = (np.array(v, dtype=np.float64) for v in (head, mine, ns))
    if len(head) == 0:
        raise ValueError("the proposals file holds no chain positions")
    by_n, rule = [], []
    for n in range(min_n, store.max_n + 1):
        at = ns == n
        if at.any():
            by_n.append({"n": n, "positions": int(at.sum()), "head": head[at].mean(), "store": mine[at].mean()})
        use = ns >= n
        rule.append({"store_from_n": n, "share": use.mean(), "mean_accepted_length": np.where(use, mine, head).mean()})
    return {"positions": len(head), "head": head.mean(), "store": mine.mean(), "store_proposes": (ns > 0).mean(),
            "best_of_both": np.maximum(head, mine).mean(), "by_match_length": by_n, "store_where_it_matches": rule}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m draft.store_eval", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", nargs="+", required=True, help="draft data files (.spd) whose tokens form the store")
    ap.add_argument("--proposals", required=True, help="the JSONL of `specula draft-eval --proposals`")
    ap.add_argument("--max-n", type=int, default=16)
    ap.add_argument("--min-n", type=int, default=2)
    a = ap.parse_args(argv)
    if not 1 <= a.min_n <= a.max_n <= 64:
        ap.error("need 1 <= --min-n <= --max-n <= 64")
    store = Store(read_tokens(a.data), a.max_n)
    with open(a.proposals) as f:
        print(json.dumps(evaluate(store, f, a.min_n)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
