"""Span offsets: the text Potato 2.12.1 renders, replayed here, checked against 2.12.1's own functions.

2.12.1 measures span offsets on the text of its annotate page
(``instance_dom_text(get_displayed_text(raw))``); ``potato.items.rendered_text``
replays that and maps each rendered character back to the raw text. The
comparison runs 2.12.1's own code in its virtualenv on hostile strings
(HTML-special characters, references, tags, whitespace, control characters,
non-ASCII, emoji, its dangerous-pattern words) and random mixtures of them.
"""

from __future__ import annotations

import html
import json
import os
import random
import subprocess

import pytest

from potato.items.rendered_text import render, renders_raw_text
from tests.support.potato212 import potato212  # noqa: F401  (fixture)

HOSTILE = [
    "Alice met Bob in Paris.",
    "  Tom  &amp; Jerry <b>love</b>   cheese &lt;3 — café 😀 ok  ",
    "x < y and y > z & w; data: ÆØÅ 中文 test",
    "line one\nline two\ttabbed\r\nend",
    "a &mdash; b &notit; c &#39; d &#x1F600; e &bogus; f &amp g",
    "<script>alert(1)</script> and <i>it</i><br/>next <unknown attr='1'>x</unknown>",
    "JavaScript:void vbscript: DATA: expression  (1) jajavascript:vascript:",
    "\x00\x01 spaced\x0b\x0c out \x7f",
    "👩‍👩‍👧 family 🇯🇵 flag e\u0301 combining",
    "<p class='x'>para</p><a href=\"http://e.org\">link</a> &NotEqualTilde; two",
    "   ",
    "",
]
PIECES = ["a", "é", "😀", " ", "  ", "\t", "\n", "\r", "&", "&amp;", "&lt;", "&mdash;", "&#39;", "<", ">",
          "<b>", "</b>", "<br/>", "<x>", "data:", "javascript:", "\x01", "中", '"', "'", ";"]

_REFERENCE = """
import json, sys
from potato.server_utils.span_text import instance_dom_text, normalize_display_text
out = []
for text in json.load(sys.stdin):
    out.append([instance_dom_text(normalize_display_text(text, flag)) for flag in (False, True)])
print(json.dumps(out))
"""


def _samples() -> list[str]:
    rng = random.Random(17)
    return HOSTILE + ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 25))) for _ in range(400)]


def test_the_rendered_text_is_what_potato_212_renders(potato212, tmp_path):
    samples = _samples()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # this project's potato must not shadow 2.12's
    done = subprocess.run([str(potato212.parent / "python"), "-c", _REFERENCE], input=json.dumps(samples),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    expected = json.loads(done.stdout)
    for text, (plain, with_breaks) in zip(samples, expected):
        assert render(text).text == plain, text
        assert render(text, highlight_linebreaks=True).text == with_breaks, text


@pytest.mark.parametrize("text", _samples()[:60])
def test_each_rendered_character_maps_back_to_the_raw_characters_that_show_it(text):
    shown = render(text)
    assert len(shown.starts) == len(shown.ends) == len(shown.text)
    assert list(shown.starts) == sorted(shown.starts) and list(shown.ends) == sorted(shown.ends)
    i = 0
    while i < len(shown.text):
        start, end = shown.starts[i], shown.ends[i]
        if start == end:  # the first of several characters one reference shows
            j = i
            while shown.ends[j] == shown.starts[j]:
                j += 1
            assert html.unescape(text[start:shown.ends[j]]) == shown.text[i:j + 1]
            i = j + 1
            continue
        raw = text[start:end]
        assert raw == shown.text[i] or html.unescape(raw) == shown.text[i] or (raw.strip(" ") == "" and
                                                                              shown.text[i] == " ")
        i += 1


def test_a_span_converts_to_the_raw_text_and_back():
    raw = "  Tom  &amp; Jerry <b>love</b>   cheese &lt;3 — café 😀 ok  "
    shown = render(raw)
    assert shown.text == "Tom & Jerry love cheese <3 — café 😀 ok"
    for word in ("Tom", "&", "Jerry", "love", "<3", "café", "😀", "ok"):
        start = shown.text.index(word)
        raw_span = shown.to_raw(start, start + len(word))
        assert html.unescape(raw[raw_span[0]:raw_span[1]]) == word
        assert shown.from_raw(*raw_span) == (start, start + len(word))
    # "Tom & Jerry" in the raw text spans markup and a reference: it comes back whole.
    assert shown.from_raw(raw.index("Tom"), raw.index("Jerry") + 5) == (0, 11)


def test_spans_that_show_nothing_have_no_counterpart():
    shown = render("a <b>bold</b> word  ")
    assert shown.from_raw(2, 5) is None  # the <b> tag alone
    assert shown.from_raw(18, 20) is None  # trailing spaces, trimmed
    assert shown.to_raw(3, 3) is None and shown.to_raw(0, 99) is None


def test_only_a_string_text_without_displayed_text_is_rendered_from_the_raw_text():
    assert renders_raw_text({"text": "x"}, "text")
    assert not renders_raw_text({"text": ["turn 1", "turn 2"]}, "text")
    assert not renders_raw_text({"text": "x", "displayed_text": "<b>x</b>"}, "text")
