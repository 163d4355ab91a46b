"""Which aggregation rule per kind of answer: ours against the alternative a user might pick, on simulated annotators.

Run by hand::

    .venv/bin/python bench/answer_aggregation.py

Annotators are simulated against a known truth (seeded, so the numbers are
the same every run), and each rule's agreed answer is scored against it:

- ordinal (5-point likert, 3 annotators; an answer is off by one point 30 %
  of the time, by two 10 %): our median point against the most-voted point
  (nominal majority) and the rounded mean — exact-match accuracy and MAE;
- continuous (slider 0–100 on steps of 5, 3 annotators, Gaussian noise of 8;
  with 0 %, 10 % and 20 % careless answers anywhere on the scale): our median
  against the mean — MAE;
- multilabel (5 labels, each true 30 % of the time; an annotator misses a
  true label 15 % of the time and ticks a false one 5 %): our "at least half"
  against a strict majority — exact-set accuracy and micro-F1, 1–4 annotators;
- span (30-word texts, spans of 1–3 words; an annotator misses a span 15 % of
  the time, moves one boundary by a word 15 %, adds a stray span 5 %): our
  character-level majority (``potato.annotations.aggregation.majority_spans``) against
  span-level voting — exact-match F1, 2–5 annotators.

docs/answer-types.md quotes these numbers.
"""

from __future__ import annotations

import random
import statistics

from potato.annotations.aggregation import majority_label_sets, majority_spans, median_points

N = 20_000


def _pack(counts: list[int]) -> int:
    return sum(c << (16 * i) for i, c in enumerate(counts))


def ordinal(rng: random.Random, k: int = 5, annotators: int = 3) -> dict[str, tuple[float, float]]:
    hits = {"median (ours)": [0, 0.0], "most votes": [0, 0.0], "rounded mean": [0, 0.0]}
    for _ in range(N):
        truth = rng.randint(1, k)
        answers = []
        for _ in range(annotators):
            r = rng.random()
            off = 0 if r < .6 else 1 if r < .75 else -1 if r < .9 else 2 if r < .95 else -2
            answers.append(min(k, max(1, truth + off)))
        counts = [answers.count(p) for p in range(1, k + 1)]
        median = median_points({"x": _pack(counts)}, k)[0]["x"] + 1
        for name, value in (("median (ours)", median), ("most votes", counts.index(max(counts)) + 1),
                            ("rounded mean", int(statistics.mean(answers) + 0.5))):
            hits[name][0] += value == truth
            hits[name][1] += abs(value - truth)
    return {name: (a / N, b / N) for name, (a, b) in hits.items()}


def continuous(rng: random.Random, careless: float) -> dict[str, float]:
    errors = {"median (ours)": 0.0, "mean": 0.0}
    for _ in range(N):
        truth = rng.uniform(0, 100)
        answers = [rng.uniform(0, 100) if rng.random() < careless
                   else min(100, max(0, round((truth + rng.gauss(0, 8)) / 5) * 5)) for _ in range(3)]
        errors["median (ours)"] += abs(statistics.median(answers) - truth)
        errors["mean"] += abs(statistics.mean(answers) - truth)
    return {name: e / N for name, e in errors.items()}


def multilabel(rng: random.Random, annotators: int, labels: int = 5) -> dict[str, tuple[float, float]]:
    out = {}
    seed = rng.random()
    for name in ("at least half (ours)", "strict majority"):
        r = random.Random(seed)  # both rules see the same annotators
        exact = tp = fp = fn = 0
        for _ in range(N // 4):
            truth = {lab for lab in range(labels) if r.random() < .3}
            sets = [{lab for lab in range(labels) if (lab in truth and r.random() > .15)
                     or (lab not in truth and r.random() < .05)} for _ in range(annotators)]
            counts = [sum(lab in s for s in sets) for lab in range(labels)]
            if name.startswith("at least"):
                mask = majority_label_sets({"x": _pack(counts)}, {"x": annotators}, labels)[0]["x"]
                chosen = {lab for lab in range(labels) if mask >> lab & 1}
            else:
                chosen = {lab for lab in range(labels) if 2 * counts[lab] > annotators}
            exact += chosen == truth
            tp, fp, fn = tp + len(chosen & truth), fp + len(chosen - truth), fn + len(truth - chosen)
        out[name] = (exact / (N // 4), 2 * tp / (2 * tp + fp + fn))
    return out


def spans(rng: random.Random, annotators: int, words: int = 30) -> dict[str, float]:
    def truth_spans() -> set:
        found, i = set(), 0
        while i < words:
            if rng.random() < .15:
                n = rng.randint(1, 3)
                if i + n <= words:
                    found.add((i, i + n, rng.choice("AB")))
                    i += n + 1
                    continue
            i += 1
        return found

    def annotate(truth: set) -> list:
        marked = []
        for start, end, label in truth:
            if rng.random() < .15:
                continue
            if rng.random() < .15:
                if rng.random() < .5:
                    start = max(0, start + rng.choice((-1, 1)))
                else:
                    end = min(words, end + rng.choice((-1, 1)))
                if start >= end:
                    continue
            marked.append((start, end, label))
        if rng.random() < .05:
            start = rng.randint(0, words - 2)
            marked.append((start, start + 1, rng.choice("AB")))
        return marked

    scores = {"character majority (ours)": [0, 0, 0], "span voting": [0, 0, 0]}
    for _ in range(N // 5):
        truth = truth_spans()
        sets = [annotate(truth) for _ in range(annotators)]
        flat = [(str(a), s, e, lab) for a, marked in enumerate(sets) for s, e, lab in marked]
        ours = set(majority_spans(flat, annotators, {"A": 0, "B": 1}))
        votes: dict = {}
        for marked in sets:
            for span in set(marked):
                votes[span] = votes.get(span, 0) + 1
        voted = {span for span, n in votes.items() if 2 * n >= annotators}
        for name, chosen in (("character majority (ours)", ours), ("span voting", voted)):
            scores[name][0] += len(chosen & truth)
            scores[name][1] += len(chosen - truth)
            scores[name][2] += len(truth - chosen)
    return {name: 2 * tp / (2 * tp + fp + fn) for name, (tp, fp, fn) in scores.items()}


def main() -> None:
    rng = random.Random(17)
    print("ordinal, 5 points, 3 annotators: exact-match accuracy, MAE (points)")
    for name, (acc, mae) in ordinal(rng).items():
        print(f"  {name:22} {acc:.3f}  {mae:.3f}")
    print("continuous, 0-100 on steps of 5, 3 annotators: MAE")
    for careless in (0.0, 0.1, 0.2):
        row = continuous(rng, careless)
        print(f"  {careless:4.0%} careless: " + ", ".join(f"{name} {mae:.2f}" for name, mae in row.items()))
    print("multilabel, 5 labels: exact-set accuracy, micro-F1")
    for annotators in (1, 2, 3, 4):
        row = multilabel(rng, annotators)
        print(f"  {annotators} annotator(s): " + ", ".join(f"{name} {a:.3f} / {f:.3f}" for name, (a, f) in row.items()))
    print("span, exact-match F1")
    for annotators in (2, 3, 4, 5):
        row = spans(rng, annotators)
        print(f"  {annotators} annotators: " + ", ".join(f"{name} {f:.3f}" for name, f in row.items()))


if __name__ == "__main__":
    main()
