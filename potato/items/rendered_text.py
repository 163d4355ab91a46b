"""The text Potato 2.12's annotate page renders for an item, and where each of its characters came from.

Span answers are character offsets, but not into the item's text as the data
file holds it: 2.12 measures them on the text its page *renders* (the
browser's text of ``#text-content``, in code points), and it pre-fills
predicted spans on the same basis. That text differs from the raw one, the
bundle's ``text``, in ways real data hits (measured against 2.12.1):

- runs of spaces become one space, the ends are trimmed, and control
  characters go — tabs included, so ``"two\\ttabbed"`` renders ``"twotabbed"``
  (``normalize_display_text``); with ``highlight_linebreaks: true`` a newline
  becomes a ``<br/>`` and leaves the text;
- the words ``javascript:``, ``vbscript:``, ``data:`` and ``expression(``
  are cut out (``sanitize_html``'s dangerous patterns): ``"data: 5"``
  renders ``" 5"``;
- HTML it allows (``<b>``, ``<br/>``, ``<p>``, …) becomes markup and leaves
  the text; other tags show as written;
- a character reference (``&amp;``, ``&mdash;``, ``&#39;``) shows as the one
  character it names; a lone ``&`` or ``<`` shows as itself.

Non-ASCII text is counted the same way on both sides (code points; 2.12's
``span-core.js`` converts the browser's UTF-16 units), so an emoji is one
character to both.

``render`` replays those steps (2.12.1's ``get_displayed_text`` and
``server_utils/span_text.instance_dom_text``) and keeps, for every rendered
character, the range of raw characters it shows; ``to_raw`` and
``from_raw`` convert a span between the two. tests/unit/test_rendered_text.py
checks the replay against 2.12.1's own functions on hostile text.

Items 2.12 renders from something other than one string (a list shown as a
dialogue, a mapping, a ``displayed_text`` field) have no such mapping here:
``renders_raw_text`` says so, and their spans are left out.

Pure; server side only.
"""

from __future__ import annotations

import html
import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

# normalize_display_text (2.12.1 server_utils/span_text.py)
_CONTROL = re.compile(r"[\x00-\x1F\x7F]")
# sanitize_html (2.12.1 server_utils/html_sanitizer.py), in its order
_DANGEROUS = (
    re.compile(r"javascript:", re.IGNORECASE),
    re.compile(r"vbscript:", re.IGNORECASE),
    re.compile(r"data:", re.IGNORECASE),
    re.compile(r"expression\s*\(", re.IGNORECASE),
)
_TAG = re.compile(r"<(/?)(\w+)([^>]*)(/?)>", re.IGNORECASE | re.DOTALL)
_CHAR_REF = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")
# Anything a step above may change: without one of these the rendered text is the raw text (most items).
_MAY_CHANGE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f&<]|  |javascript:|vbscript:|data:|expression\s*\(", re.IGNORECASE)
_ALLOWED_ELEMENTS = frozenset(
    "span b i u strong em mark s del ins br hr wbr div p ul ol li dl dt dd h1 h2 h3 h4 h5 h6 table thead "
    "tbody tr th td caption sub sup small code pre blockquote abbr cite kbd samp var details summary a img "
    "figure figcaption video audio source track ruby rt rp".split()
)

# The item field that, when present, 2.12 shows instead of the text (without normalising it).
DISPLAYED_TEXT_FIELD = "displayed_text"


@dataclass(frozen=True)
class Rendering:
    """The rendered text and, per rendered character ``i``, the raw range ``[starts[i], ends[i])`` it shows."""

    text: str
    starts: Sequence[int]
    ends: Sequence[int]

    def to_raw(self, start: int, end: int) -> tuple[int, int] | None:
        """The raw range a rendered span ``[start, end)`` shows; None when it is empty or outside the text."""
        if not 0 <= start < end <= len(self.text):
            return None
        return self.starts[start], self.ends[end - 1]

    def from_raw(self, start: int, end: int) -> tuple[int, int] | None:
        """The rendered span showing raw ``[start, end)``: every rendered character drawn from it.

        None when nothing of it is rendered (markup, trimmed or collapsed spaces only).
        """
        if start >= end:
            return None
        first = bisect_right(self.ends, start)  # the first character ending after start
        last = bisect_left(self.starts, end)  # the first character starting at or after end
        return (first, last) if first < last else None


def renders_raw_text(record: Mapping[str, Any], text_key: str) -> bool:
    """Whether 2.12 renders this item from its text field as one string (so ``render`` applies)."""
    return isinstance(record.get(text_key), str) and DISPLAYED_TEXT_FIELD not in record


def render(raw: str, highlight_linebreaks: bool = False) -> Rendering:
    """What 2.12.1's annotate page shows of *raw*, with each character's raw range."""
    if _MAY_CHANGE.search(raw) is None and raw == raw.strip() and not (highlight_linebreaks and "\n" in raw):
        return Rendering(raw, range(len(raw)), range(1, len(raw) + 1))  # shown as it is
    chars = _normalized(raw, highlight_linebreaks)
    for pattern in _DANGEROUS:
        chars = _cut(chars, pattern)
    text = "".join(c for c, _, _ in chars)
    out_text: list[str] = []
    starts: list[int] = []
    ends: list[int] = []

    def emit(shown: str, start: int, end: int) -> None:
        for k, ch in enumerate(shown):
            out_text.append(ch)
            # A reference that shows several characters: the first starts at the reference, the last ends it.
            starts.append(start)
            ends.append(end if k == len(shown) - 1 else start)

    def text_segment(lo: int, hi: int) -> None:
        pos = lo
        for ref in _CHAR_REF.finditer(text, lo, hi):
            for k in range(pos, ref.start()):
                emit(chars[k][0], chars[k][1], chars[k][2])
            emit(html.unescape(ref.group(0)), chars[ref.start()][1], chars[ref.end() - 1][2])
            pos = ref.end()
        for k in range(pos, hi):
            emit(chars[k][0], chars[k][1], chars[k][2])

    pos = 0
    for tag in _TAG.finditer(text):
        text_segment(pos, tag.start())
        if tag.group(2).lower() not in _ALLOWED_ELEMENTS:  # escaped: shown as written
            for k in range(tag.start(), tag.end()):
                emit(chars[k][0], chars[k][1], chars[k][2])
        pos = tag.end()
    text_segment(pos, len(text))
    return Rendering("".join(out_text), tuple(starts), tuple(ends))


def _normalized(raw: str, highlight_linebreaks: bool) -> list[tuple[str, int, int]]:
    """``normalize_display_text`` as ``(char, raw start, raw end)`` triples."""
    # Control characters go first, tabs among them, so spaces they separated make one run.
    out: list[tuple[str, int, int]] = []
    for i, c in enumerate(raw):
        if c != "\n" and _CONTROL.match(c):
            continue
        if c == " " and out and out[-1][0] == " ":
            out[-1] = (" ", out[-1][1], i + 1)  # one space for the whole run
        else:
            out.append((c, i, i + 1))
    lo, hi = 0, len(out)
    while lo < hi and out[lo][0].isspace():
        lo += 1
    while hi > lo and out[hi - 1][0].isspace():
        hi -= 1
    out = out[lo:hi]
    if highlight_linebreaks:
        out = [piece for c, s, e in out for piece in ([(b, s, e) for b in "<br/>"] if c == "\n" else [(c, s, e)])]
    return out


def _cut(chars: list[tuple[str, int, int]], pattern: re.Pattern) -> list[tuple[str, int, int]]:
    """*chars* without the characters of *pattern*'s matches (``pattern.sub('', text)``)."""
    text = "".join(c for c, _, _ in chars)
    matches = list(pattern.finditer(text))
    if not matches:
        return chars
    out, pos = [], 0
    for m in matches:
        out.extend(chars[pos:m.start()])
        pos = m.end()
    out.extend(chars[pos:])
    return out


def spans_to_raw(raw: str, spans: Iterable[tuple[int, int, str]], highlight_linebreaks: bool = False
                 ) -> list[dict[str, Any]]:
    """Spans on 2.12's rendered text as ``[{"start", "end", "label"}]`` on *raw*, sorted by start.

    Each is cut to the characters it shows, without white space at its ends
    (so a span over ``<b>love</b>`` is ``love``); one that shows nothing, or
    lies outside the rendered text, is left out.
    """
    rendering = render(raw, highlight_linebreaks)
    shown = rendering.text
    out = []
    for start, end, label in spans:
        start, end = max(start, 0), min(end, len(shown))
        while start < end and shown[start].isspace():
            start += 1
        while end > start and shown[end - 1].isspace():
            end -= 1
        found = rendering.to_raw(start, end)
        if found is not None:
            out.append({"start": found[0], "end": found[1], "label": label})
    return sorted(out, key=lambda s: (s["start"], s["end"]))


def spans_to_rendered(raw: str, spans: Iterable[Mapping[str, Any]], highlight_linebreaks: bool = False
                      ) -> list[dict[str, Any]]:
    """Spans ``{"start", "end", "label", …}`` on *raw* moved onto 2.12's rendered text (other keys kept);
    one that shows nothing there is left out."""
    rendering = render(raw, highlight_linebreaks)
    out = []
    for span in spans:
        found = rendering.from_raw(span["start"], span["end"])
        if found is not None:
            out.append({**span, "start": found[0], "end": found[1]})
    return out
