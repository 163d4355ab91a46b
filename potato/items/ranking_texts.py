"""What each label of a ranking schema stands for in an item: the texts a ranking's model scores.

A ranking schema's labels are the same for every item (``Response A`` …
``Response D``); what annotators put in order are the things the labels name
in the item they are shown. For each item, the first of these that fits:

1. **fields** — every label is a field of the item holding a string
   (``{"text": "How do I reverse a list?", "Response A": "…", "Response B": "…"}``):
   the texts are those fields, the prompt is the item's text.
2. **lines** — every label starts a line of the item's text, followed by a
   colon (Potato 2.12.1's own ranking example: ``Question: …`` then
   ``Response A: …`` on a line of its own): each text runs from after its
   colon to the next such line; the prompt is what comes before the first.
3. **labels** — otherwise the labels themselves are the texts, ranked for
   the item's text (a review's aspects, say: ``price``, ``service``, ``food``).

Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, NamedTuple, Sequence

FIELDS, LINES, LABELS = "fields", "lines", "labels"


class RankingTexts(NamedTuple):
    prompt: str
    texts: list[str]  # one per label, in the schema's order
    source: str       # FIELDS, LINES or LABELS


def ranking_texts(fields: Mapping[str, Any], text: str, labels: Sequence[str]) -> RankingTexts:
    """The prompt and the text of each of *labels* in the item whose *fields* and *text* are given."""
    found = [fields.get(label) for label in labels]
    if all(isinstance(value, str) for value in found):
        return RankingTexts(text, found, FIELDS)
    lines = _label_lines(text, labels)
    if lines is not None:
        return lines
    return RankingTexts(text, list(labels), LABELS)


def _label_lines(text: str, labels: Sequence[str]) -> RankingTexts | None:
    starts = []  # (where the line starts, where its text starts, label index)
    for k, label in enumerate(labels):
        match = re.search(rf"^[ \t]*{re.escape(label)}[ \t]*:", text, flags=re.MULTILINE)
        if match is None:
            return None
        starts.append((match.start(), match.end(), k))
    starts.sort()
    texts = [""] * len(labels)
    for (_, begin, k), following in zip(starts, [s[0] for s in starts[1:]] + [len(text)]):
        texts[k] = text[begin:following].strip()
    return RankingTexts(text[:starts[0][0]].strip(), texts, LINES)
