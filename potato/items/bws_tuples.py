"""The tuples a best–worst scaling project shows: the same ones Potato 2.12 builds from the items.

With a top-level ``bws_config``, Potato 2.12 does not serve the data's items:
it builds tuples of ``tuple_size`` of them at start-up and serves those,
``bws_tuple_0001``, ``bws_tuple_0002``, …; an annotator picks the best and the
worst of each by its position (``A``, ``B``, …). The answers name only the
tuple and the positions, so training must rebuild exactly the tuples 2.12
showed. 2.12.1 draws them from ``random.Random(seed)``, walking shuffled
passes over the items in load order so every item is shown once per pass
before any is shown again (``tests/unit/test_bws_tuples.py`` checks this copy
against 2.12.1's own generator). A change to the data or to ``bws_config``
makes different tuples: 2.12 re-numbers them on its next start, and answers
saved before refer to tuples that no longer exist.

The ``bws_config`` keys and their defaults are read with the other answer
shapes (``potato.scheme_fields.BwsConfig``). Pure: no I/O.
"""

from __future__ import annotations

import random
from typing import Any, Mapping, Sequence

from potato.scheme_fields import POSITION_LABELS, BwsConfig

# The field of a tuple that lists its items, as 2.12 names it: [{source_id, text, position}].
TUPLE_ITEMS_FIELD = "_bws_items"
TUPLE_ID_FORMAT = "bws_tuple_{:04d}"


def bws_tuples(pool: Sequence[Mapping[str, Any]], id_key: str, text_key: str,
               config: BwsConfig) -> list[dict[str, Any]]:
    """The tuples 2.12 builds from *pool* (its items in load order), each as 2.12 stores the tuple item.

    Raises ``ValueError`` when the pool has fewer items than a tuple (2.12 refuses to start then).
    """
    size = config.tuple_size
    if size > len(pool):
        raise ValueError(f"bws_config.tuple_size is {size}, more than the {len(pool)} items of the data: Potato 2.12 "
                         f"builds no tuples from them; add items or lower bws_config.tuple_size")
    rng = random.Random(config.seed)
    queue: list[int] = []
    tuples = []
    for i in range(config.tuple_count(len(pool))):
        chosen: list[int] = []
        while len(chosen) < size:
            if not queue:
                queue = list(range(len(pool)))
                rng.shuffle(queue)
            pick = next((q for q in queue if q not in chosen), None)
            if pick is None:  # the queue holds only items this tuple has: the next pass goes behind it
                refill = list(range(len(pool)))
                rng.shuffle(refill)
                queue.extend(refill)
                continue
            queue.remove(pick)
            chosen.append(pick)
        members = [{"source_id": str(pool[q][id_key]), "text": str(pool[q].get(text_key, "")),
                    "position": POSITION_LABELS[k]} for k, q in enumerate(chosen)]
        tuples.append({id_key: TUPLE_ID_FORMAT.format(i + 1), text_key: "", TUPLE_ITEMS_FIELD: members,
                       "_bws_tuple_size": size})
    return tuples


def tuple_texts(record: Mapping[str, Any], size: int) -> list[str] | None:
    """The texts of a tuple item's members in position order, or None when it is not a tuple of *size*."""
    members = record.get(TUPLE_ITEMS_FIELD)
    if not isinstance(members, list) or len(members) != size:
        return None
    texts = [m.get("text") if isinstance(m, Mapping) else None for m in members]
    return texts if all(isinstance(t, str) for t in texts) else None
