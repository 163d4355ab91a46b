"""Write small run bundles and job directories by hand, as docs/architecture.md describes them.

Independent of potato/bundle/build.py on purpose: the worker's tests check the
worker against the documented format, not against the bundle builder.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path
from typing import Any, Dict, List, Optional

POSITIVE = ["great", "excellent", "wonderful", "love", "superb", "fantastic", "delightful", "perfect"]
NEGATIVE = ["terrible", "awful", "horrible", "hate", "dreadful", "broken", "useless", "disappointing"]
FILLER = ["the", "this", "product", "was", "really", "item", "arrived", "today", "and", "it", "is",
          "my", "order", "quite", "very", "service", "box", "price"]


def easy_review(sentiment: str, rng: random.Random) -> str:
    """A short review whose sentiment word makes the label obvious."""
    words = rng.sample(FILLER, rng.randint(3, 7))
    cue = POSITIVE if sentiment == "positive" else NEGATIVE
    for _ in range(rng.randint(1, 2)):
        words.insert(rng.randrange(len(words) + 1), rng.choice(cue))
    return " ".join(words)


def easy_items(n: int = 120, *, unlabeled: int = 10, holdout_every: int = 5, seed: int = 0) -> List[Dict[str, Any]]:
    """``n`` labelled items (alternating positive / negative, every ``holdout_every``-th held out)
    plus ``unlabeled`` items without labels, in the bundle's ``items.jsonl`` shape."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        sentiment = "positive" if i % 2 == 0 else "negative"
        items.append({
            "id": "r{}".format(i),
            "text": easy_review(sentiment, rng),
            "labels": {"sentiment": sentiment},
            "holdout": (i // 2) % holdout_every == 0,
        })
    for j in range(unlabeled):
        items.append({
            "id": "u{}".format(j),
            "text": easy_review("positive" if j % 2 == 0 else "negative", rng),
            "labels": {},
            "holdout": False,
        })
    return items


# Places of two tokens (CJK: a token per character) with accents that the tokenizer strips.
PLACES = ["new york", "são paulo", "zürich centre", "東京", "hong kong", "malmö city"]
# Characters whose offsets go wrong first: accents, HTML, quotes, an emoji (one character, two in UTF-16).
DECORATIONS = ["Zoë", "<b>", "</b>", "&amp;", "&", '"', "'", "🙂", "«", "»", "—"]
SPAN_SCHEMAS = {"cues": ["POS", "NEG", "LOC"]}
SPAN_ANSWERS = {"cues": {"type": "span", "kind": "span"}}


def easy_span_text(rng: random.Random, words: int) -> tuple:
    """``(text, spans)``: filler words and decorations, with marked spans of the ``cues`` schema.

    ``POS`` a positive word, ``NEG`` a negative one, ``LOC`` a place of two
    tokens (whitespace inside may be doubled). Spans can stand next to each
    other (``great awful``: two spans a space apart), open or close the text, and sit
    inside HTML (``<b>great</b>``); every character before them shifts their
    offsets.
    """
    text, spans = "", []
    for _ in range(words):
        roll = rng.random()
        sep = "" if not text else rng.choice([" ", " ", " ", "  ", "\t", "\n"])
        if roll < 0.2:
            phrase, label = rng.choice(POSITIVE), "POS"
        elif roll < 0.35:
            phrase, label = rng.choice(NEGATIVE), "NEG"
        elif roll < 0.45:
            phrase, label = rng.choice(PLACES).replace(" ", rng.choice([" ", " ", "  "])), "LOC"
        else:
            text += sep + (rng.choice(DECORATIONS) if roll < 0.6 else rng.choice(FILLER))
            continue
        tagged = rng.random() < 0.15
        text += sep + ("<b>" if tagged else "")
        spans.append({"start": len(text), "end": len(text) + len(phrase), "label": label})
        text += phrase + ("</b>" if tagged else "")
    return text, spans


def span_corpus() -> List[str]:
    """Text to train a tiny model's tokenizer on, for :func:`easy_span_items`."""
    return [" ".join(POSITIVE + NEGATIVE + FILLER + PLACES + DECORATIONS)] * 3


def easy_span_items(n: int = 160, *, unlabeled: int = 10, holdout_every: int = 5, long_every: int = 7,
                    seed: int = 0) -> List[Dict[str, Any]]:
    """``n`` items of the ``cues`` span schema (every ``holdout_every``-th held out, every
    ``long_every``-th about 60 words long, past a 32-token window) plus ``unlabeled`` items."""
    rng = random.Random(seed)
    items = []
    for i in range(n + unlabeled):
        text, spans = easy_span_text(rng, 60 if i % long_every == 3 else rng.randint(4, 12))
        labelled = i < n
        items.append({"id": "s{}".format(i) if labelled else "u{}".format(i - n), "text": text,
                      "labels": {"cues": spans} if labelled else {},
                      "holdout": labelled and i % holdout_every == 0})
    return items


def write_bundle(bundle_dir: Path, items: List[Dict[str, Any]],
                 schemas: Optional[Dict[str, List[str]]] = None,
                 answers: Optional[Dict[str, Dict[str, Any]]] = None) -> Path:
    """Write ``manifest.json`` and ``items.jsonl`` into ``bundle_dir``; ``answers``: the manifest's
    entry per schema (docs/answer-types.md), left out when None (every schema nominal)."""
    schemas = schemas or {"sentiment": ["positive", "negative"]}
    bundle_dir.mkdir(parents=True, exist_ok=True)
    labeled = {s: sum(1 for it in items if s in it["labels"]) for s in schemas}
    holdout = {s: sum(1 for it in items if s in it["labels"] and it["holdout"]) for s in schemas}
    manifest = {
        "format": 1,
        "schemas": schemas,
        "id_key": "id",
        "text_key": "text",
        "holdout_fraction": 0.2,
        "counts": {"items": len(items), "labeled": labeled, "holdout": holdout,
                   "ties": {s: 0 for s in schemas}},
    }
    if answers is not None:
        manifest["answers"] = answers
    (bundle_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    with (bundle_dir / "items.jsonl").open("w") as f:
        for item in items:
            f.write(json.dumps(item) + "\n")
    return bundle_dir


def write_job(job_dir: Path, *, bundle: str = "bundle", items: Optional[List[Dict[str, Any]]] = None,
              labels: Optional[Dict[str, List[str]]] = None, answers: Optional[Dict[str, Dict[str, Any]]] = None,
              **fields: Any) -> Path:
    """Write ``job_dir/job.json`` (and, given ``items``, the bundle under it, with the schemas'
    ``labels`` and ``answers`` as :func:`write_bundle` takes them); returns ``job_dir``.

    ``fields`` override the job's keys (``options``, ``device``, ``include_unlabeled``, ...).
    """
    job_dir.mkdir(parents=True, exist_ok=True)
    if items is not None:
        write_bundle(job_dir / bundle, items, labels, answers)
    job = {
        "run_id": 1,
        "trainer": "hf-text-classification",
        "schemas": ["sentiment"],
        "bundle": bundle,
        "options": {},
        "device": "auto",
        "num_threads": None,
        "max_ram_mb": None,
        "include_unlabeled": True,
        "grace_seconds": 20,
    }
    job.update(fields)
    (job_dir / "job.json").write_text(json.dumps(job, indent=1))
    return job_dir


# -- every kind of answer ------------------------------------------------------------------

# A cue word per topic: an item names each of its topics (a multiselect) once.
TOPIC_CUES = {"price": ["cheap", "pricey"], "delivery": ["courier", "shipping"], "quality": ["sturdy", "flimsy"]}
TOPIC_CHANCE = {"price": 0.5, "delivery": 0.35, "quality": 0.25}
# A word per point of a 1-5 scale: it sets the likert rating and, 25 points a step, the slider's score.
LEVEL_WORDS = ["dreadful", "poor", "okay", "good", "superb"]
KIND_LABELS = {"tone": ["low", "mid", "high"], "topics": list(TOPIC_CUES), "rating": ["1", "2", "3", "4", "5"],
               "score": []}
KIND_ANSWERS = {"tone": {"type": "radio", "kind": "nominal"},
                "topics": {"type": "multiselect", "kind": "multilabel"},
                "rating": {"type": "likert", "kind": "ordinal", "values": [1, 2, 3, 4, 5]},
                "score": {"type": "slider", "kind": "continuous", "min": 0, "max": 100, "step": 1}}


def kinds_items(n: int = 160, *, unlabeled: int = 8, holdout_every: int = 5, seed: int = 0) -> List[Dict[str, Any]]:
    """``n`` items answered for a multiselect (``topics``: a cue word per topic), a likert (``rating``:
    its level word), a slider (``score``: 25 points per level, within 5 either way) and a radio (``tone``:
    low for levels 1-2, mid for 3, high for 4-5), every
    ``holdout_every``-th held out, plus ``unlabeled`` items without answers."""
    rng = random.Random(seed)
    items = []
    for i in range(n + unlabeled):
        topics = [t for t in TOPIC_CUES if rng.random() < TOPIC_CHANCE[t]]
        level = rng.randrange(5)
        # One slot per topic, in a fixed order: its cue word or a filler word; then the level word.
        fillers = rng.sample(FILLER, len(TOPIC_CUES) + 1)
        words = [rng.choice(TOPIC_CUES[t]) if t in topics else fillers.pop() for t in TOPIC_CUES]
        words += [LEVEL_WORDS[level], fillers.pop()]
        labelled = i < n
        items.append({
            "id": "k{}".format(i) if labelled else "u{}".format(i - n),
            "text": " ".join(words),
            "labels": {"tone": ("low", "low", "mid", "high", "high")[level], "topics": topics, "rating": str(level + 1),
                       "score": max(0, min(100, level * 25 + rng.randint(-5, 5)))} if labelled else {},
            "holdout": labelled and i % holdout_every == 0,
        })
    return items


# -- spans in short sentences, as a project's first days have them ----------------------------------------

PEOPLE = ["Omar", "Lena", "Priya", "Tomás", "Akira", "Fatima", "Jonas", "Chen", "Ines", "Kwame", "Sofia", "Ravi"]
FOODS = ["bagels", "ramen", "tacos", "pierogi", "falafel", "sushi", "paella", "dumplings", "croissants", "curry",
         "waffles", "kimchi", "lasagne", "empanadas", "pho", "couscous"]
CITIES = ["Lima", "Oslo", "Osaka", "Nairobi", "Lisbon", "Hanoi", "Quito", "Tunis", "Krakow", "Dakar", "Porto",
          "Seoul", "Cusco", "Bergen"]
FOOD_PLACE_TEMPLATES = ["{p} ate {f} in {c}.", "In {c}, {p} cooked {f} and {f2}.", "{p} loves the {f} of {c}.",
                        "{p} flew to {c} for {f} and {f2}.", "Nobody in {c} sells {f}, says {p}.",
                        "{p} had {f} twice.", "{p} moved to {c} last year.", "{f} and {f2} again, said {p}.",
                        "{p} brought {f} from {c} and {f2} from {c2}."]
FOOD_PLACE_SCHEMAS = {"entities": ["FOOD", "PLACE"]}
FOOD_PLACE_ANSWERS = {"entities": {"type": "span", "kind": "span"}}


def food_place_items(n: int = 80, *, unlabeled: int = 10, holdout_every: int = 6,
                     seed: int = 0) -> List[Dict[str, Any]]:
    """``n`` short sentences with their ``FOOD`` and ``PLACE`` spans ("Omar ate bagels in Lima."), every
    ``holdout_every``-th held out, plus ``unlabeled`` sentences: a span schema of a project's first days."""
    rng = random.Random(seed)
    items = []
    for i in range(n + unlabeled):
        template = rng.choice(FOOD_PLACE_TEMPLATES)
        food, food2 = rng.sample(FOODS, 2)
        city, city2 = rng.sample(CITIES, 2)
        fills = {"p": rng.choice(PEOPLE), "f": food, "f2": food2, "c": city, "c2": city2}
        text, spans = "", []  # type: str, List[Dict[str, Any]]
        for literal, field, _, _ in string.Formatter().parse(template):
            text += literal
            if field:
                start = len(text)
                text += fills[field]
                if field != "p":
                    spans.append({"start": start, "end": len(text), "label": "PLACE" if field[0] == "c" else "FOOD"})
        labelled = i < n
        items.append({"id": "e{}".format(i) if labelled else "u{}".format(i - n), "text": text,
                      "labels": {"entities": spans} if labelled else {},
                      "holdout": labelled and i % holdout_every == 0})
    return items


# -- comparisons: which of two replies annotators preferred ----------------------------------------------

# The hidden property: a reply that offers a remedy is preferred to one that brushes the customer off.
REMEDIES = ["refund", "replacement", "repair", "voucher", "credit", "exchange", "tracking", "callback"]
BRUSH_OFFS = ["whatever", "unfortunately", "impossible", "later", "nothing", "policy", "wait", "no"]
COMPLAINTS = ["My parcel never came.", "The kettle broke on day two.", "I was charged twice.",
              "The size is wrong.", "Nobody answers the phone.", "The screen arrived cracked."]
COMPARISON_SCHEMAS = {"pref": ["A", "B"]}
COMPARISON_ANSWERS = {"pref": {"type": "pairwise", "kind": "comparison", "mode": "binary", "items_key": "responses"}}


def comparison_items(n: int = 150, *, unlabeled: int = 10, holdout_every: int = 5, annotators: int = 3,
                     noise: float = 0.1, seed: int = 0, good_words: List[str] = REMEDIES,
                     bad_words: List[str] = BRUSH_OFFS, prompts: List[str] = COMPLAINTS) -> List[Dict[str, Any]]:
    """``n`` complaints (``prompts``) with two replies each, the one offering a remedy (a word of
    ``good_words``, the other one of ``bad_words``) preferred by each of ``annotators`` unless ``noise`` flips
    that one's choice, its place (A or B) drawn at random; every ``holdout_every``-th held out, plus
    ``unlabeled`` pairs nobody compared: a pairwise schema's bundle."""
    rng = random.Random(seed)
    items = []
    for i in range(n + unlabeled):
        good = " ".join(rng.sample(FILLER, 3) + [rng.choice(good_words)] + rng.sample(FILLER, 2))
        bad = " ".join(rng.sample(FILLER, 3) + [rng.choice(bad_words)] + rng.sample(FILLER, 2))
        good_side = rng.choice("AB")
        sides = [good, bad] if good_side == "A" else [bad, good]
        counts = {"A": 0, "B": 0, "tie": 0}
        for _ in range(annotators):
            counts[good_side if rng.random() >= noise else "AB".replace(good_side, "")] += 1
        labelled = i < n
        items.append({"id": "c{}".format(i) if labelled else "u{}".format(i - n), "text": rng.choice(prompts),
                      "sides": {"pref": sides}, "labels": {"pref": counts} if labelled else {},
                      "holdout": labelled and i % holdout_every == 0, "good": good_side})
    return items


# -- best-worst scaling ---------------------------------------------------------------------

BWS_SCHEMAS = {"quality": ["A", "B", "C", "D"]}
BWS_ANSWERS = {"quality": {"type": "bws", "kind": "best_worst", "tuple_size": 4}}


def bws_items(pool: int = 60, *, held_out: int = 30, unlabeled: int = 5, annotators: int = 3, noise: float = 0.1,
              seed: int = 0) -> List[Dict[str, Any]]:
    """A best-worst schema's bundle: reviews whose quality is one word of ``LEVEL_WORDS`` (low to high) among
    filler, in the tuples of four Potato 2.12 builds from ``pool`` of them (``potato.items.bws_tuples``);
    each of ``annotators`` picks the best and the worst by that word unless ``noise`` makes the pick random.
    ``held_out`` tuples and ``unlabeled`` more are of reviews no training tuple holds (a ``level`` list per
    tuple says each position's quality)."""
    from potato.items.bws_tuples import bws_tuples
    from potato.scheme_fields import BwsConfig

    rng = random.Random(seed)

    def reviews(n: int, prefix: str) -> List[Dict[str, Any]]:
        out = []
        for i in range(n):
            level = rng.randrange(len(LEVEL_WORDS))
            words = rng.sample(FILLER, 4) + [LEVEL_WORDS[level]] + rng.sample(FILLER, 2)
            out.append({"id": "{}{}".format(prefix, i), "text": " ".join(words), "level": level})
        return out

    def tuples(texts: List[Dict[str, Any]], config: Any, prefix: str, labelled: bool, holdout: bool):
        level = {t["id"]: t["level"] for t in texts}
        out = []
        for t in bws_tuples(texts, "id", "text", config):
            members = t["_bws_items"]
            levels = [level[m["source_id"]] for m in members]
            picks: Dict[str, Dict[str, int]] = {"best": {}, "worst": {}}
            for _ in range(annotators):
                order = sorted(range(4), key=lambda k: (levels[k], rng.random()))
                if rng.random() < noise:
                    rng.shuffle(order)
                best, worst = "ABCD"[order[-1]], "ABCD"[order[0]]
                picks["best"][best] = picks["best"].get(best, 0) + 1
                picks["worst"][worst] = picks["worst"].get(worst, 0) + 1
            out.append({"id": prefix + t["id"], "text": "", "sides": {"quality": [m["text"] for m in members]},
                        "labels": {"quality": picks} if labelled else {}, "holdout": holdout, "level": levels})
        return out

    train = tuples(reviews(pool, "r"), BwsConfig(), "", True, False)
    fresh = reviews(max(held_out, unlabeled) + 8, "h")
    held = tuples(fresh, BwsConfig(num_tuples=held_out, seed=seed + 1), "held_", True, True)
    rest = tuples(fresh, BwsConfig(num_tuples=unlabeled, seed=seed + 2), "new_", False, False)
    return train + held + rest


# -- ranking ---------------------------------------------------------------------------------

RANKING_LABELS = ["Response A", "Response B", "Response C", "Response D"]
RANKING_SCHEMAS = {"quality": RANKING_LABELS}
RANKING_ANSWERS = {"quality": {"type": "ranking", "kind": "ranking", "size": 4}}
RANKING_PROMPTS = ["Which reply helps most?", "Rank the replies to this customer.", "How good is each answer?"]


def ranking_items(n: int = 80, *, held_out: int = 30, unlabeled: int = 5, annotators: int = 3, noise: float = 0.1,
                  seed: int = 0) -> List[Dict[str, Any]]:
    """A ranking schema's bundle: items of a prompt and four responses, each of a quality one word of
    ``LEVEL_WORDS`` says (four different levels per item) among filler; each of ``annotators`` orders the
    responses by that word, best first, and swaps two neighbours of that order when ``noise`` says so. The
    ``held_out`` and ``unlabeled`` items' responses are new texts like any other (a ``level`` list per item
    says each label's quality)."""
    rng = random.Random(seed)
    items = []
    for i in range(n + held_out + unlabeled):
        levels = rng.sample(range(len(LEVEL_WORDS)), len(RANKING_LABELS))
        texts = [" ".join(rng.sample(FILLER, 4) + [LEVEL_WORDS[level]] + rng.sample(FILLER, 2)) for level in levels]
        orders = []
        for _ in range(annotators):
            order = sorted(range(len(levels)), key=lambda k: -levels[k])
            if rng.random() < noise:
                k = rng.randrange(len(order) - 1)
                order[k], order[k + 1] = order[k + 1], order[k]
            orders.append([RANKING_LABELS[k] for k in order])
        labelled = i < n + held_out
        items.append({"id": "k{}".format(i) if labelled else "u{}".format(i), "text": rng.choice(RANKING_PROMPTS),
                      "sides": {"quality": texts}, "labels": {"quality": orders} if labelled else {},
                      "holdout": n <= i < n + held_out, "level": levels})
    return items
