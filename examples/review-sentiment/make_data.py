"""Regenerate this example's data and annotations (deterministic; no downloads).

    python examples/review-sentiment/make_data.py

Writes ``data/reviews.json`` (JSON lines: ``id``, ``text``; 320 short product
reviews built from templates, clearly positive or negative) and
``annotation_output/<annotator>/user_state.json`` for three annotators in the
format real Potato saves (``InMemoryUserState.to_json`` in
``potato/user_state_management.py`` of davidjurgens/potato, ``indent=2``):

- alice and carol: the current format, ``[[{"schema": S, "name": L}, L], ...]``;
- bob: an older file, ``{S: {L: "true"}}``.

Annotators overlap and sometimes disagree (each gets about 5 % of their items
wrong); about 40 items are labelled by nobody, so ``include_unlabeled: true``
has something to predict. Running it again produces the same bytes.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 20261129
N_ITEMS = 320

PRODUCTS = [
    "headphones", "blender", "backpack", "phone case", "desk lamp", "coffee maker",
    "keyboard", "water bottle", "pair of running shoes", "tent", "vacuum cleaner",
    "charger", "toaster", "office chair", "rain jacket", "smart watch",
]
ASPECTS = [
    "sound", "battery", "build quality", "design", "fit", "screen", "motor",
    "zipper", "handle", "cable", "lid", "padding",
]
POSITIVE_OPENERS = [
    "Absolutely love this {p}.", "This {p} exceeded my expectations.",
    "Best {p} I have bought in years.", "Really happy with this {p}.",
    "Five stars for this {p}.", "What a great {p}!", "I am impressed by this {p}.",
    "This {p} is worth every penny.", "My new {p} is wonderful.",
    "Fantastic {p}, would buy again.",
]
POSITIVE_DETAILS = [
    "The {a} is excellent.", "The {a} is superb and it arrived early.",
    "Works perfectly, highly recommend it.", "Great value for the money.",
    "Sturdy, comfortable and easy to use.", "The {a} feels premium.",
    "It does exactly what I wanted.", "Setup took two minutes and it just works.",
    "My whole family loves it.", "Quality is outstanding.",
]
POSITIVE_CLOSERS = ["", "", " Thank you!", " Delighted.", " A pleasure to use every day."]
NEGATIVE_OPENERS = [
    "Very disappointed with this {p}.", "This {p} stopped working after a week.",
    "Do not buy this {p}.", "Worst {p} I have ever owned.",
    "I regret buying this {p}.", "What a useless {p}.", "This {p} is a waste of money.",
    "Sadly my {p} broke on day two.", "Terrible {p}, avoid it.",
    "The {p} arrived damaged.",
]
NEGATIVE_DETAILS = [
    "The {a} is awful.", "The {a} feels cheap and flimsy.",
    "Customer support never answered.", "I returned it for a refund.",
    "It overheats and smells of burnt plastic.", "The {a} fell apart immediately.",
    "Nothing works as advertised.", "Poor quality and far too expensive.",
    "It is noisy, slow and unreliable.", "The {a} cracked within days.",
]
NEGATIVE_CLOSERS = ["", "", " Never again.", " Very annoying.", " Complete junk."]

# Who labels which items (by index), and in which format.
ANNOTATORS = {
    "alice": {"fmt": "pairs", "items": range(0, 200)},
    "bob": {"fmt": "dict", "items": range(120, 280)},
    "carol": {"fmt": "pairs", "items": [i for i in range(0, 280) if i % 3 == 0]},
}
ERROR_RATE = 0.05


def make_reviews(rng: random.Random) -> list[dict]:
    """The items: ``{"id": "rNNN", "text": ..., "_label": "positive"|"negative"}``."""
    reviews = []
    for i in range(N_ITEMS):
        positive = rng.random() < 0.5
        openers, details, closers = (
            (POSITIVE_OPENERS, POSITIVE_DETAILS, POSITIVE_CLOSERS)
            if positive
            else (NEGATIVE_OPENERS, NEGATIVE_DETAILS, NEGATIVE_CLOSERS)
        )
        product = rng.choice(PRODUCTS)
        aspect = rng.choice(ASPECTS)
        text = (
            rng.choice(openers).format(p=product)
            + " "
            + rng.choice(details).format(a=aspect, A=aspect.capitalize())
            + rng.choice(closers)
        )
        reviews.append({"id": f"r{i + 1:03d}", "text": text, "_label": "positive" if positive else "negative"})
    return reviews


def user_state(user: str, labels: dict[str, str], fmt: str) -> dict:
    """A user_state.json dict with the top-level keys real Potato writes."""
    if fmt == "pairs":
        per_item = {iid: [[{"schema": "sentiment", "name": lab}, lab]] for iid, lab in labels.items()}
    else:
        per_item = {iid: {"sentiment": {lab: "true"}} for iid, lab in labels.items()}
    ordering = list(labels)
    return {
        "user_id": user,
        "instance_id_ordering": ordering,
        "current_instance_index": len(ordering) - 1,
        "current_phase_and_page": ["annotation", "annotation"],
        "completed_phase_and_pages": [],
        "max_assignments": -1,
        "instance_id_to_behavioral_data": {},
        "instance_id_to_label_to_value": per_item,
        "instance_id_to_span_to_value": {},
        "phase_to_page_to_label_to_value": {},
        "phase_to_page_to_span_to_value": {},
        "training_state": {
            "completed_questions": {}, "total_correct": 0, "total_attempts": 0,
            "total_mistakes": 0, "passed": False, "failed": False,
            "current_question_index": 0, "training_instances": [], "show_feedback": False,
            "feedback_message": "", "allow_retry": False, "max_mistakes": -1,
            "max_mistakes_per_question": -1, "category_scores": {},
        },
        "qualified_categories": [],
        "category_qualification_scores": {},
        "instance_id_to_keyword_highlight_state": {},
        "instance_id_to_link_to_value": {},
        "instance_id_to_event_to_value": {},
    }


def main() -> None:
    rng = random.Random(SEED)
    reviews = make_reviews(rng)
    data = HERE / "data" / "reviews.json"
    data.parent.mkdir(parents=True, exist_ok=True)
    with open(data, "w", encoding="utf-8", newline="\n") as f:
        for review in reviews:
            f.write(json.dumps({"id": review["id"], "text": review["text"]}) + "\n")
    for user, spec in ANNOTATORS.items():
        user_rng = random.Random(f"{SEED}-{user}")
        labels = {}
        for i in spec["items"]:
            truth = reviews[i]["_label"]
            wrong = user_rng.random() < ERROR_RATE
            labels[reviews[i]["id"]] = ("negative" if truth == "positive" else "positive") if wrong else truth
        path = HERE / "annotation_output" / user / "user_state.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            json.dump(user_state(user, labels, spec["fmt"]), f, indent=2)
            f.write("\n")
    print(f"wrote {data.relative_to(HERE)} ({len(reviews)} items) and {len(ANNOTATORS)} user_state.json files")


if __name__ == "__main__":
    main()
