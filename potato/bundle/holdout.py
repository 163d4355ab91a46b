"""Which items are held out of training, to score the run on.

Holdout: an item is held out when ``sha256(id)`` read as a fraction of 2**64 is
below ``holdout_fraction`` — stable across Python processes and machines (unlike
``hash()``), independent of item order and of every other item. With Potato
2.12's ``splits``/``split_seed``, its seeded split decides instead, and its
``test`` items are held out (``split_of``), as 2.12 would hold them out.

The bundle (``potato.bundle.build``) marks each labelled item; the writeback's
leak guard and the evaluation read those marks, never this again.
"""

from __future__ import annotations

import hashlib
import math
from itertools import compress
from operator import methodcaller
from typing import Callable, Iterable, Mapping

from potato.config import ProjectConfig
from potato.errors import ProjectDataError


def is_holdout(item_id: str, fraction: float) -> bool:
    """Whether *item_id* is held out: ``sha256(id) / 2**64 < fraction`` (first 8 bytes).

    Depends on the id alone, so the split is the same in every process, on
    every machine, whatever the order of items or which others exist.
    """
    if fraction <= 0:
        return False
    digest = hashlib.sha256(_utf8(item_id)).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


def _utf8(item_id: str) -> bytes:
    """*item_id*'s UTF-8 bytes; a lone surrogate (an annotator's label on an id that is no item,
    which the bundle then ignores) is passed through rather than raising."""
    return item_id.encode("utf-8", "surrogatepass")


def holdout_flags(item_ids: list[str], fraction: float) -> list[bool]:
    """``is_holdout`` of each id, in C-level passes (a bundle asks about 500 k at once)."""
    if not fraction > 0:
        return [False] * len(item_ids)
    if fraction >= 1:
        return [True] * len(item_ids)
    # For an integer x, x < fraction * 2**64 exactly when x < its ceiling; and
    # a 32-byte digest sorts below that bound's 8 bytes exactly when its first
    # 8 bytes do (equal first bytes sort the longer digest after).
    limit = math.ceil(fraction * 2**64).to_bytes(8, "big")
    digest = methodcaller("digest")
    try:
        return list(map(limit.__gt__, map(digest, map(hashlib.sha256, map(str.encode, item_ids)))))
    except UnicodeEncodeError:  # rare: the slower encoding, for every id
        return list(map(limit.__gt__, map(digest, map(hashlib.sha256, map(_utf8, item_ids)))))


def split_holdout(item_ids: Iterable[str], fraction: float) -> set[str]:
    """The ids of *item_ids* that are held out (see ``is_holdout``)."""
    ids = list(item_ids)
    return set(compress(ids, holdout_flags(ids, fraction)))


def split_of(item_id: str, splits: Mapping[str, float], seed: int) -> str:
    """The split Potato 2.12 puts *item_id* in (its ``publish/preprocessing._partition_splits``).

    ``sha256(f"{seed}:{id}")``'s first 8 hex digits over 0xFFFFFFFF fall in one
    of the cumulative bands of *splits* (normalised, in the order given).
    Same id, same split: on every run, backend and machine, and in 2.12.
    """
    total = sum(splits.values()) or 1.0
    fraction = int(hashlib.sha256(_utf8(f"{seed}:{item_id}")).hexdigest()[:8], 16) / 0xFFFFFFFF
    bound = 0.0
    for name, share in splits.items():
        bound += share / total
        if fraction <= bound:
            return name
    return name


def holdout_rule(config: ProjectConfig, fraction: float | None = None
                 ) -> tuple[Callable[[list[str]], list[bool]], dict]:
    """``(which of these ids are held out?, how the manifest describes the split)`` for *config*.

    Potato 2.12's ``splits``/``split_seed`` hold out its ``test`` split; else
    ``holdout_fraction`` (or *fraction*, when given) does, by ``is_holdout``.
    """
    mt = config.model_training
    if fraction is None and mt.splits is not None:
        splits, seed = dict(mt.splits), mt.split_seed or 0
        return (lambda ids: [split_of(i, splits, seed) == "test" for i in ids]), {"splits": splits, "split_seed": seed}
    fraction = mt.holdout_fraction if fraction is None else fraction
    if not 0 <= fraction < 1:
        raise ProjectDataError(f"holdout_fraction must be at least 0 and below 1, got {fraction!r}")
    return (lambda ids: holdout_flags(ids, fraction)), {"holdout_fraction": fraction}
