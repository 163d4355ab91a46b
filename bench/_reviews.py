"""Realistic product reviews for the throughput benches: deterministic, no downloads.

Real review corpora are long-tailed: most reviews are a sentence or three, a
few run on for paragraphs. A bench on fixed short texts hides the cost that
matters in practice — a random batch padded to its longest review — so these
reviews draw their sentence count from a log-normal distribution: a few words
at the short end, well past 256 word pieces at the long end (about 8 % of
them), median around 45.

Each review mixes opinion sentences (about the product, its parts, delivery)
with neutral ones (how it was used, what was compared); the label is the
majority of the opinions, and mixed reviews end with a verdict that decides
them. So a model must read the text, not spot one word, and both a well-trained
baseline and ours land in the high nineties rather than at exactly 1.0.

    from bench._reviews import make_reviews, make_span_reviews
    items = make_reviews(2000, seed=0)        # [{"id", "text", "label"}, ...]
    tagged = make_span_reviews(2000, seed=0)  # [{"id", "text", "spans": [{"start", "end", "label"}]}, ...]
"""

from __future__ import annotations

import math
import random
import string
from typing import Any, Dict, List, Optional, Tuple

PRODUCTS = ["headphones", "blender", "backpack", "phone case", "desk lamp", "coffee maker", "keyboard",
            "water bottle", "pair of running shoes", "tent", "vacuum cleaner", "charger", "toaster",
            "office chair", "rain jacket", "smart watch", "monitor", "stroller", "drill", "mattress"]
PARTS = ["battery", "build quality", "design", "fit", "screen", "motor", "zipper", "handle", "cable", "lid",
         "padding", "buttons", "app", "manual", "finish", "strap", "noise level", "packaging"]
GOOD = ["excellent", "superb", "solid", "sturdy", "reliable", "comfortable", "well made", "fantastic",
        "better than expected", "a real pleasure", "impressive", "great"]
BAD = ["awful", "flimsy", "unreliable", "uncomfortable", "badly made", "disappointing", "cheap",
       "worse than expected", "a constant annoyance", "broken", "poor", "terrible"]
GOOD_OPENERS = ["I really like this {p}.", "This {p} exceeded my expectations.", "Happy with this {p}.",
                "Best {p} I have owned.", "Five stars for this {p}.", "Great {p} for the price."]
BAD_OPENERS = ["I regret buying this {p}.", "This {p} let me down.", "Unhappy with this {p}.",
               "Worst {p} I have owned.", "One star for this {p}.", "Poor {p} for the price."]
GOOD_VERDICTS = ["Overall I would buy it again.", "All in all, recommended.", "In the end I am glad I kept it."]
BAD_VERDICTS = ["Overall I would not buy it again.", "All in all, avoid it.", "In the end I sent it back."]
NEUTRAL = [
    "I bought it {when} after comparing a few others.", "We use it {freq} at home.",
    "It came in a {colour} box with a short manual.", "My {who} uses it more than I do.",
    "I have had it for about {n} weeks now.", "The listing said it ships from a warehouse nearby.",
    "I mostly use it {freq} on weekdays.", "It replaced an older model from another brand.",
    "The instructions cover setup in {n} steps.", "I ordered the {colour} version.",
]
FILL = {"when": ["last month", "in the spring", "before a trip", "on a sale"],
        "freq": ["every day", "twice a week", "now and then", "in the evenings"],
        "colour": ["black", "grey", "white", "blue", "green"],
        "who": ["partner", "sister", "roommate", "son", "father"],
        "n": ["two", "three", "six", "ten"]}
SPAN_LABELS = ["PRODUCT", "ASPECT", "POSITIVE", "NEGATIVE"]  # make_span_review's
PRODUCT_SPAN = {"p": "PRODUCT"}
# Sentences per review: exp(N(mu, sigma)), so the word-piece count is long-tailed.
MU, SIGMA = 1.55, 1.1


Piece = Tuple[str, Optional[str]]  # a stretch of a review's text, and its span label (None: no span)


def _render(template: str, labels: Dict[str, str], **values: str) -> List[Piece]:
    """``template.format(**values)`` as pieces; each field named in ``labels`` is a span of that label."""
    pieces = []  # type: List[Piece]
    for literal, field, _, _ in string.Formatter().parse(template):
        if literal:
            pieces.append((literal, None))
        if field is not None:
            pieces.append((values[field], labels.get(field)))
    return pieces


def _fill(template: str, rng: random.Random, product: str) -> List[Piece]:
    values = {key: rng.choice(options) for key, options in FILL.items()}
    return _render(template, PRODUCT_SPAN, p=product, **values)


def _opinion(positive: bool, rng: random.Random, product: str) -> List[Piece]:
    part = rng.choice(PARTS)
    word = rng.choice(GOOD if positive else BAD)
    forms = ["The {part} is {w}.", "I found the {part} {w}.", "Honestly, the {part} of this {p} is {w}.",
             "After a while the {part} still seems {w}."]
    labels = dict(PRODUCT_SPAN, part="ASPECT", w="POSITIVE" if positive else "NEGATIVE")
    return _render(rng.choice(forms), labels, part=part, w=word, p=product)


def _review_pieces(positive: bool, rng: random.Random) -> List[Piece]:
    """One review whose overall sentiment is ``positive``, as pieces (see :func:`make_span_review`)."""
    product = rng.choice(PRODUCTS)
    n = max(1, min(60, int(round(math.exp(rng.gauss(MU, SIGMA))))))
    if n == 1:  # the shortest reviews: a few words
        return _render(rng.choice(["Love it.", "Great {p}!", "Works well.", "Very happy."] if positive else
                                  ["Hate it.", "Awful {p}.", "Broke fast.", "Very unhappy."]), PRODUCT_SPAN, p=product)
    sentences = [_render(rng.choice(GOOD_OPENERS if positive else BAD_OPENERS), PRODUCT_SPAN, p=product)]
    mixed = n >= 4 and rng.random() < 0.3
    for _ in range(n - 1):
        if rng.random() < 0.45:
            sentences.append(_fill(rng.choice(NEUTRAL), rng, product))
        else:
            # A mixed review praises and blames, but leans its own way.
            leaning = positive if not mixed or rng.random() < 0.6 else not positive
            sentences.append(_opinion(leaning, rng, product))
    if mixed:
        sentences.append([(rng.choice(GOOD_VERDICTS if positive else BAD_VERDICTS), None)])
    pieces = sentences[0]
    for sentence in sentences[1:]:
        pieces = pieces + [(" ", None)] + sentence
    return pieces


def make_review(positive: bool, rng: random.Random) -> str:
    """One review whose overall sentiment is ``positive``."""
    return "".join(text for text, _ in _review_pieces(positive, rng))


def make_span_review(positive: bool, rng: random.Random) -> Tuple[str, List[Dict[str, Any]]]:
    """One review and its spans: each mention of the product (``PRODUCT``), each part an opinion is
    about (``ASPECT``) and the opinion's words (``POSITIVE``, ``NEGATIVE``) — not the same words in
    openers such as "Great headphones for the price.", so a tagger must read the sentence."""
    text, spans = "", []
    for piece, label in _review_pieces(positive, rng):
        if label is not None:
            spans.append({"start": len(text), "end": len(text) + len(piece), "label": label})
        text += piece
    return text, spans


def make_reviews(n: int, seed: int = 0, prefix: str = "r") -> List[Dict[str, str]]:
    """``n`` reviews ``{"id", "text", "label"}``, half positive, in a seeded order."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        positive = rng.random() < 0.5
        out.append({"id": "{}{}".format(prefix, i), "text": make_review(positive, rng),
                    "label": "positive" if positive else "negative"})
    return out


# Parts grouped into what a complaint is about, for a multi-label schema; packaging is rare on purpose.
ASPECTS = {"durability": ["build quality", "zipper", "handle", "finish", "strap"],
           "power": ["battery", "motor", "cable"],
           "comfort": ["fit", "padding", "noise level"],
           "usability": ["app", "manual", "buttons", "screen"],
           "packaging": ["packaging"]}


def make_rated_review(rng: random.Random) -> Dict[str, object]:
    """A review with a star rating, a 0-100 score and the aspects it complains about.

    One to six opinions about parts of the product, each good with the
    review's own chance, between neutral sentences. The rating (1-5) and the
    score follow the share of good opinions as an annotator would read it,
    with an annotator's slips: a rating one star off one time in seven, a
    score a few points either way. The complaints are the aspects (``ASPECTS``)
    of the parts that got a bad opinion.
    """
    product = rng.choice(PRODUCTS)
    chance = rng.random()
    opinions = [(rng.choice([p for parts in ASPECTS.values() for p in parts]), rng.random() < chance)
                for _ in range(rng.randint(1, 6))]
    share = sum(good for _, good in opinions) / len(opinions)
    sentences = [rng.choice(GOOD_OPENERS if share >= 0.5 else BAD_OPENERS).format(p=product)]
    forms = ["The {part} is {w}.", "I found the {part} {w}.", "Honestly, the {part} of this {p} is {w}.",
             "After a while the {part} still seems {w}."]
    for part, good in opinions:
        if rng.random() < 0.5:
            sentences.append(_fill(rng.choice(NEUTRAL), rng, product))
        sentences.append(rng.choice(forms).format(part=part, w=rng.choice(GOOD if good else BAD), p=product))
    rating = 1 + int(round(4 * share))
    if rng.random() < 1 / 7:
        rating = min(5, max(1, rating + rng.choice((-1, 1))))
    score = min(100, max(0, int(round(100 * share + rng.gauss(0, 5)))))
    complaints = [aspect for aspect, parts in ASPECTS.items() if any(p in parts and not g for p, g in opinions)]
    return {"text": " ".join(sentences), "rating": str(rating), "score": score, "complaints": complaints}


def make_rated_reviews(n: int, seed: int = 0, prefix: str = "q") -> List[Dict[str, object]]:
    """``n`` reviews ``{"id", "text", "rating", "score", "complaints"}`` (see :func:`make_rated_review`)."""
    rng = random.Random(seed)
    return [dict(make_rated_review(rng), id="{}{}".format(prefix, i)) for i in range(n)]
def make_span_reviews(n: int, seed: int = 0, prefix: str = "r") -> List[Dict[str, Any]]:
    """``n`` reviews ``{"id", "text", "spans"}`` (see :func:`make_span_review`), in a seeded order."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text, spans = make_span_review(rng.random() < 0.5, rng)
        out.append({"id": "{}{}".format(prefix, i), "text": text, "spans": spans})
    return out
