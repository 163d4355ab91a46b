"""Synthetic tasks a tiny causal LM learns in seconds, and the session's tiny models trained on their text.

- sentiment (radio): :func:`tests.support.bundles.easy_items`, the label decided
  by a keyword (``great`` ... ``awful``);
- customer (text): the same reviews, answered ``a happy customer`` or
  ``an unhappy customer`` by the same keyword;
- topics (multiselect): short restaurant reviews naming a dish, a waiter or
  the bill; the set of topics named is the answer.

The fixtures build each tiny model once per test session (tests/support/tiny_llm.py):
``tiny_llama`` (chat template, pad token) and ``tiny_gpt2`` (neither).
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List

import pytest

from tests.support.bundles import FILLER, NEGATIVE, POSITIVE, easy_items

TOPICS = {"food": ["pizza", "pasta", "soup"], "service": ["waiter", "staff", "host"],
          "price": ["cheap", "pricey", "bill"]}
CUSTOMER = {"positive": "a happy customer", "negative": "an unhappy customer"}
TOPIC_FILLER = ["the", "was", "and", "we", "had", "a", "visit", "tonight", "really", "very"]


def customer_items(n: int = 120, *, unlabeled: int = 6, seed: int = 0) -> List[Dict[str, Any]]:
    """:func:`easy_items` reviews whose ``customer`` answer (a list: every annotator's) follows their keyword."""
    items = easy_items(n, unlabeled=unlabeled, seed=seed)
    for item in items:
        sentiment = item["labels"].pop("sentiment", None)
        if sentiment:
            item["labels"]["customer"] = [CUSTOMER[sentiment]]
    return items


def topic_items(n: int = 160, *, unlabeled: int = 6, seed: int = 0) -> List[Dict[str, Any]]:
    """Reviews naming 0-3 topics; ``topics`` answer: the topics named, in schema order; every 5th held out."""
    rng = random.Random(seed)
    items = []
    for i in range(n + unlabeled):
        chosen = [topic for topic in TOPICS if rng.random() < 0.5]
        words = rng.sample(TOPIC_FILLER, 4) + [rng.choice(TOPICS[topic]) for topic in chosen]
        rng.shuffle(words)
        labelled = i < n
        items.append({"id": "t{}".format(i) if labelled else "v{}".format(i), "text": " ".join(words),
                      "labels": {"topics": chosen} if labelled else {}, "holdout": labelled and i % 5 == 0})
    return items


def customer_and_topic_items(n: int = 100, *, unlabeled: int = 4) -> List[Dict[str, Any]]:
    """Items with both answers: a review's words (its ``customer``) followed by a visit's (its ``topics``)."""
    items = customer_items(n, unlabeled=unlabeled)
    for item, visit in zip(items, topic_items(n, unlabeled=unlabeled)):
        item["text"] += " " + visit["text"]
        item["labels"].update(visit["labels"])
    return items


def corpus() -> List[str]:
    """The texts the tiny models' tokenizers are trained on: the tasks' words, labels and prompts."""
    words = POSITIVE + NEGATIVE + FILLER + TOPIC_FILLER + [w for ws in TOPICS.values() for w in ws]
    prompt = "Text: Answer with one of: positive, negative. For each of these labels, say yes or no: " \
             "food, service, price. " + " ".join(CUSTOMER.values())
    return [" ".join(words), prompt] * 20 + [it["text"] for it in easy_items(200, unlabeled=0)]


def _built(family: str, request: Any) -> str:
    directory = Path(tempfile.mkdtemp(prefix="potato-tiny-{}-".format(family)))
    request.addfinalizer(lambda: shutil.rmtree(directory, ignore_errors=True))
    from tests.support.tiny_llm import build_tiny_causal_lm

    return str(build_tiny_causal_lm(directory, corpus(), family))


@pytest.fixture(scope="session")
def tiny_llama(request) -> str:
    """A tiny Llama with a chat template and a pad token, as a model directory."""
    return _built("llama", request)


@pytest.fixture(scope="session")
def tiny_gpt2(request) -> str:
    """A tiny GPT-2 without a chat template or a pad token, as a model directory."""
    return _built("gpt2", request)
