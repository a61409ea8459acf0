"""The reduced vocabulary: the N most frequent tokens of the training text (ties: lower id first),
as token_map (reduced id -> target id, most frequent first) and its inverse (target id -> reduced
id, -1 outside). Tokens outside it get q = 0: the draft never proposes them and exact rejection
sampling's residual covers them (docs/speculative.md)."""
from __future__ import annotations

import numpy as np


def reduced_vocab(token_lists, n: int, target_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """(token_map int32 [min(n, target_vocab)], target_to_reduced int32 [target_vocab])."""
    token_map = extend(np.zeros(0, np.int32), token_lists, n, target_vocab)
    return token_map, inverse_of(token_map, target_vocab)


def extend(token_map: np.ndarray, token_lists, n: int, target_vocab: int) -> np.ndarray:
    """token_map followed by the text's most frequent tokens not in it (ties: lower id first), up to
    min(n, target_vocab) entries: an existing head's vocabulary grown with its order kept, or from
    an empty map a new one."""
    counts = np.zeros(target_vocab, dtype=np.int64)
    for t in token_lists:
        counts += np.bincount(np.asarray(t, dtype=np.int64), minlength=target_vocab)
    counts[token_map] = -1
    order = np.lexsort((np.arange(target_vocab), -counts))  # by count desc, then id asc
    extra = order[:max(0, min(n, target_vocab) - len(token_map))]
    return np.concatenate([np.asarray(token_map, np.int32), extra.astype(np.int32)])


def inverse_of(token_map: np.ndarray, target_vocab: int) -> np.ndarray:
    """target id -> reduced id (-1 outside the reduced vocabulary)."""
    inverse = np.full(target_vocab, -1, dtype=np.int32)
    inverse[token_map] = np.arange(len(token_map), dtype=np.int32)
    return inverse


def coverage(token_lists, inverse: np.ndarray) -> float:
    """Fraction of the tokens that fall inside the reduced vocabulary."""
    inside = total = 0
    for t in token_lists:
        t = np.asarray(t, dtype=np.int64)
        inside += int((inverse[t] >= 0).sum())
        total += len(t)
    return inside / max(total, 1)
