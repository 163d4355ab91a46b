"""A simulated annotation loop on a real corpus: does the model_review order save annotators' labels?

    .venv/bin/python bench/active_learning.py --data ~/corpora/sst2/train.tsv \\
        [--test PATH] [--pool 3000] [--seed-batch 50] [--batch 50] [--budget 500] [--seeds 3] \\
        [--strategies random,margin,entropy,least-confidence,diverse] [--rounds N] [--starts random,cold-start] \\
        [--no-baselines] [--plot curves.png] [--work DIR] [--model DIR]

``--data`` is a TSV with a header line and ``text<TAB>label`` rows (the
first two columns, whatever the header calls them); ``--test`` defaults to
``test.tsv`` beside it. The pool is ``--pool`` distinct sentences of six
words or more drawn from it per seed. Each curve starts from a seed batch,
random or the cold start's first ``--seed-batch`` items, and each round
labels the next ``--batch`` items in the strategy's order with their true
labels, retrains and scores on the test file, up to ``--budget`` labels.

Everything a real run does is the project's own code, not a copy:

- each round is a job directory (job.json and a bundle: the pool, its
  labelled items, and the test items as the holdout) run by the worker's
  ``run`` (``potato.training.worker``), in this process, so torch and the
  trainer's imports load once: the default trainer with **no options**, so
  it measures whatever its defaults are; the test accuracy is its own
  holdout score (``scores.json``), the pool's predictions come from its own
  prediction path;
- the next batch is the first of the order the writeback would give Potato
  2.12 (``potato.prefill.prediction_shapes.parse_line`` and
  ``potato.prefill.review_order.ReviewOrder``, the same ranks the payloads carry),
  ``diverse`` included (its order lines come from the worker, job.json's
  ``order``); ``random`` draws from the pool;
- the cold-start seed batch is the ``cold-start`` trainer's order;
- the baselines at every budget, on the random curve's labels: TF-IDF +
  logistic regression as Potato 2.12.1's ``sklearn-text`` does it (this
  project's ``sklearn-text`` with its defaults, which are 2.12.1's), and
  logistic regression on the frozen MiniLM's mean-pooled embeddings
  (``potato.training.trainers.diversity.mean_pooled``, computed once per process).

Shared to keep the cost down: round 0 of a seed and start is one training for
every strategy (it asks for the diverse order lines, which the other
strategies do not read); the frozen embeddings once. Printed: the cost
estimate first, then per round the accuracy of each strategy (mean over
seeds, and per seed), each curve's area (mean accuracy over the rounds,
trapezoids over the labels), the labels each strategy needs to reach
``random``'s accuracy at the final budget, and the baselines per budget. The
curves go to ``--plot`` (a PNG with matplotlib, else an SVG written here).

``--model`` points the trainers at another model (the tests' tiny one): a
smoke test, not a measurement. Run by hand; never part of CI's pass/fail.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from potato.prefill.prediction_shapes import OrderRank, parse_line  # noqa: E402
from potato.prefill.review_order import ReviewOrder  # noqa: E402
from potato.training.trainers.uncertainty import DIVERSE, STRATEGIES  # noqa: E402

RANDOM = "random"
SCHEMA = "label"
DEFAULT_TRAINER = "hf-text-classification"
# This machine's rates (2-core AMD EPYC, AVX2, fp32 training; prediction on the trainer's fast path), for the
# estimate printed before anything runs: the measured one follows round 0. The training rate is what makes
# the margin bench's 30 trainings (seeds 0-2, budget 500) come to the 2 640 s they took.
TRAIN_EXAMPLES_PER_S = 135.0
PREDICT_ITEMS_PER_S = 120.0
OVERHEAD_PER_TRAINING_S = 20.0  # loading the model, the ONNX export and its check, saving the model


# -- data ----------------------------------------------------------------------


def read_tsv(path: Path) -> list[tuple[str, str]]:
    """``(text, label)`` rows of a TSV with a header line (the first two columns)."""
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [(r[0].strip(), r[1].strip()) for r in rows[1:] if len(r) >= 2 and r[0].strip()]


def sample_pool(rows: list[tuple[str, str]], size: int, min_words: int, seed: int) -> list[tuple[str, str]]:
    """*size* distinct sentences of *min_words* words or more, drawn with *seed*."""
    seen, kept = set(), []
    for text, label in rows:
        if len(text.split()) >= min_words and text not in seen:
            seen.add(text)
            kept.append((text, label))
    if len(kept) < size:
        raise SystemExit(f"--data has only {len(kept)} distinct sentences of {min_words} words or more; "
                         f"lower --pool (asked for {size})")
    return random.Random(seed).sample(kept, size)


# -- one round: the worker's run, in this process --------------------------------


class Rounds:
    """Job directories under *work*, each run by the worker's own ``run``."""

    def __init__(self, work: Path, pool: list[tuple[str, str]], test: list[tuple[str, str]], labels: list[str],
                 model: str | None, batch: int):
        self.work, self.pool, self.test, self.labels, self.model, self.batch = work, pool, test, labels, model, batch
        self.ids = [f"p{i}" for i in range(len(pool))]
        self.count = 0
        self.seconds: list[float] = []

    def _job(self, trainer: str, labelled: set[int], order: str | None, options: dict) -> Path:
        self.count += 1
        job = self.work / f"job{self.count}"
        bundle = job / "bundle"
        bundle.mkdir(parents=True)
        items = [{"id": self.ids[i], "text": text, "labels": {SCHEMA: label} if i in labelled else {},
                  "holdout": False} for i, (text, label) in enumerate(self.pool)]
        items += [{"id": f"t{i}", "text": text, "labels": {SCHEMA: label}, "holdout": True}
                  for i, (text, label) in enumerate(self.test)]
        manifest = {"format": 1, "schemas": {SCHEMA: self.labels},
                    "answers": {SCHEMA: {"type": "radio", "kind": "nominal"}}, "id_key": "id", "text_key": "text",
                    "counts": {"items": len(items), "labeled": {SCHEMA: len(labelled) + len(self.test)},
                               "holdout": {SCHEMA: len(self.test)}, "ties": {SCHEMA: 0}}}
        (bundle / "manifest.json").write_text(json.dumps(manifest))
        with open(bundle / "items.jsonl", "w", encoding="utf-8") as f:
            for item in items:
                f.write(json.dumps(item, ensure_ascii=False) + "\n")
        spec = {"run_id": self.count, "trainer": trainer, "schemas": [SCHEMA], "bundle": "bundle",
                "options": options, "device": "auto", "include_unlabeled": True, "grace_seconds": 20}
        if order is not None:
            spec["order"] = {"strategy": order, "batch": self.batch}
        (job / "job.json").write_text(json.dumps(spec))
        return job

    def run(self, trainer: str, labelled: set[int], order: str | None = None,
            options: dict | None = None) -> tuple[float | None, list[Any]]:
        """Train on *labelled* (pool positions); ``(test accuracy, the predictions file's checked lines)``."""
        from potato.training.worker import run

        opts = dict(options or {})
        if self.model and trainer != "sklearn-text":
            opts["model"] = self.model
        job = self._job(trainer, labelled, order, opts)
        started = time.monotonic()
        code = run(str(job))
        self.seconds.append(time.monotonic() - started)
        if code != 0:
            events = (job / "events.jsonl").read_text().splitlines()
            raise SystemExit(f"the worker exited {code} in {job}: {events[-1] if events else ''}")
        scores = json.loads((job / "scores.json").read_text())
        lines = []
        with open(job / "predictions.jsonl", encoding="utf-8") as f:
            for line in f:
                lines.append(parse_line(line, {SCHEMA: "nominal"}, {SCHEMA: self.labels}))
        shutil.rmtree(job)
        return (scores.get(SCHEMA) or {}).get("accuracy"), lines


def next_batch(strategy: str, lines: list[Any], ids: list[str], labels: list[str], labelled: set[int], size: int,
               rng: random.Random) -> list[int]:
    """The *size* unlabelled pool items served next: the writeback's order (``ReviewOrder``), or a random draw."""
    unlabelled = [i for i in range(len(ids)) if i not in labelled]
    if strategy == RANDOM:
        return rng.sample(unlabelled, min(size, len(unlabelled)))
    from potato.config import Scheme

    index = {item_id: i for i, item_id in enumerate(ids)}
    order = ReviewOrder(strategy, len(ids), {SCHEMA: Scheme(SCHEMA, "radio", tuple(labels))}, [SCHEMA], 1)
    for line in lines:
        i = index.get(line.item_id)
        if i is None or i in labelled:
            continue
        if isinstance(line, OrderRank):
            if strategy == DIVERSE:
                order.observe_rank(i, line.rank)
        else:
            order.observe(i, line)
    ranked = [i for i in order.ranked(ids) if i not in labelled]
    rest = [i for i in unlabelled if i not in set(ranked)]  # nothing to rank them by: after the others
    return (ranked + rest)[:size]


# -- the baselines -----------------------------------------------------------------


class FrozenEmbeddings:
    """The frozen MiniLM's mean-pooled embeddings of the pool and the test items, once; LR on a subset."""

    def __init__(self, pool: list[tuple[str, str]], test: list[tuple[str, str]], model: str | None):
        import torch
        from transformers import AutoModel, AutoTokenizer

        from potato.training.trainers.diversity import mean_pooled
        from potato.training.trainers.hf_common import default_model, resolve_model

        load_from, _ = resolve_model(model or default_model("bench"))
        tokenizer = AutoTokenizer.from_pretrained(load_from)
        encoder = AutoModel.from_pretrained(load_from).eval()

        def forward(ids: Any, mask: Any) -> Any:
            return encoder(input_ids=ids, attention_mask=mask).last_hidden_state

        self.pool = mean_pooled(torch, forward, tokenizer, [t for t, _ in pool], 128, "cpu").numpy()
        self.test = mean_pooled(torch, forward, tokenizer, [t for t, _ in test], 128, "cpu").numpy()
        self.pool_labels = [label for _, label in pool]
        self.test_labels = [label for _, label in test]

    def accuracy(self, labelled: set[int]) -> float | None:
        from sklearn.linear_model import LogisticRegression

        chosen = sorted(labelled)
        y = [self.pool_labels[i] for i in chosen]
        if len(set(y)) < 2:
            return None
        fit = LogisticRegression(max_iter=2000).fit(self.pool[chosen], y)
        predicted = fit.predict(self.test)
        return sum(p == g for p, g in zip(predicted, self.test_labels)) / len(self.test_labels)


# -- the loop ------------------------------------------------------------------------


def budgets_of(seed_batch: int, batch: int, budget: int, rounds: int | None) -> list[int]:
    out = [seed_batch]
    while out[-1] + batch <= budget and (rounds is None or len(out) < rounds):
        out.append(out[-1] + batch)
    return out


def cold_start_seed(rounds: Rounds, size: int) -> list[int]:
    """The cold start's first *size* items (its order lines, rank 0 first)."""
    _, lines = rounds.run("cold-start", set(), order="margin")
    index = {item_id: i for i, item_id in enumerate(rounds.ids)}
    ranked = sorted((line for line in lines if isinstance(line, OrderRank)), key=lambda line: line.rank)
    return [index[line.item_id] for line in ranked][:size]


def curves_for_seed(args: argparse.Namespace, seed: int, pool, test, labels, work: Path,
                    say: Callable[[str], None]) -> dict[str, Any]:
    """Every start's and strategy's accuracy per budget for one seed, and the baselines."""
    rounds = Rounds(work / f"seed{seed}", pool, test, labels, args.model, args.batch)
    budgets = budgets_of(args.seed_batch, args.batch, args.budget, args.rounds)
    found: dict[str, Any] = {"curves": {}, "baselines": {}}
    for start in args.starts:
        rng = random.Random(seed * 1000 + 1)
        seed_items = (cold_start_seed(rounds, args.seed_batch) if start == "cold-start"
                      else rng.sample(range(len(pool)), args.seed_batch))
        accuracy0, lines0 = rounds.run(DEFAULT_TRAINER, set(seed_items),
                                       order=DIVERSE if DIVERSE in args.strategies else None)
        say(f"seed {seed}, {start} start: {args.seed_batch} labels, accuracy {accuracy0:.4f} "
            f"({rounds.seconds[-1]:.0f} s)")
        if seed == args.first_seed and start == args.starts[0]:
            say(estimate(args, len(pool), len(test), measured=rounds.seconds[-1]))
        for strategy in args.strategies:
            labelled, lines, curve = set(seed_items), lines0, [accuracy0]
            pick_rng = random.Random(seed * 1000 + 7)
            for budget in budgets[1:]:
                labelled |= set(next_batch(strategy, lines, rounds.ids, labels, labelled, budget - len(labelled),
                                           pick_rng))
                accuracy, lines = rounds.run(DEFAULT_TRAINER, labelled, order=strategy if strategy == DIVERSE else None)
                curve.append(accuracy)
                say(f"seed {seed}, {start} start, {strategy}: {len(labelled)} labels, accuracy {accuracy:.4f} "
                    f"({rounds.seconds[-1]:.0f} s)")
            found["curves"][(start, strategy)] = curve
            if strategy == RANDOM and start == "random" and args.baselines:
                found["baselines"] = baselines(args, rounds, seed_items, budgets, pool, test, seed)
    return found


_FROZEN: dict[int, FrozenEmbeddings] = {}


def baselines(args, rounds: Rounds, seed_items, budgets, pool, test, seed: int) -> dict[str, list]:
    """TF-IDF + LR (sklearn-text's defaults, 2.12.1's) and frozen-MiniLM + LR on the random curve's labels."""
    pick_rng = random.Random(seed * 1000 + 7)
    labelled, sets = set(seed_items), [set(seed_items)]
    for budget in budgets[1:]:
        labelled |= set(next_batch(RANDOM, [], rounds.ids, rounds.labels, labelled, budget - len(labelled), pick_rng))
        sets.append(set(labelled))
    if seed not in _FROZEN:
        _FROZEN[seed] = FrozenEmbeddings(pool, test, args.model)
    return {"tfidf+LR (sklearn-text)": [rounds.run("sklearn-text", s)[0] for s in sets],
            "frozen MiniLM+LR": [_FROZEN[seed].accuracy(s) for s in sets]}


def estimate(args: argparse.Namespace, pool: int, test: int, measured: float | None = None) -> str:
    """How long the whole bench takes: trainings, and seconds from this machine's rates (or round 0's)."""
    from potato.training.trainers.hf_text_classification import effective_options
    from potato.training.trainers.schedule import make_plan, split_validation

    opts = effective_options({})

    def examples_at(labels: int) -> int:
        """The examples the defaults train on at most with *labels* labels (early stopping ends most sooner)."""
        train, validation = split_validation(range(labels), opts)
        plan = make_plan(len(train), opts["batch_size"], 1, opts, bool(validation))
        return plan.total_steps * opts["batch_size"]

    budgets = budgets_of(args.seed_batch, args.batch, args.budget, args.rounds)
    per_curve = len(budgets) - 1
    trainings = args.seeds * len(args.starts) * (1 + per_curve * len(args.strategies))
    examples = args.seeds * len(args.starts) * (examples_at(budgets[0])
                                                + len(args.strategies) * sum(map(examples_at, budgets[1:])))
    predicted = trainings * (pool + test)
    seconds = examples / TRAIN_EXAMPLES_PER_S + predicted / PREDICT_ITEMS_PER_S + trainings * OVERHEAD_PER_TRAINING_S
    text = (f"Cost: {trainings} trainings ({args.seeds} seeds x {len(args.starts)} starts x (1 shared round 0 + "
            f"{per_curve} rounds x {len(args.strategies)} strategies)), at most {examples} training examples "
            f"(the trainer's defaults: at least {opts.get('min_steps') or 300} steps a training, fewer where early "
            f"stopping ends it), {predicted} predictions")
    if measured is None:
        return text + (f"; at {TRAIN_EXAMPLES_PER_S:g} examples/s, {PREDICT_ITEMS_PER_S:g} predictions/s and "
                       f"{OVERHEAD_PER_TRAINING_S:g} s a training (this machine, 2 cores, quiet): about "
                       f"{seconds / 3600:.1f} h, plus the baselines")
    first = (examples_at(budgets[0]) / TRAIN_EXAMPLES_PER_S + (pool + test) / PREDICT_ITEMS_PER_S
             + OVERHEAD_PER_TRAINING_S)
    return text + (f"; round 0 took {measured:.0f} s against {first:.0f} s estimated, so the whole bench about "
                   f"{seconds * measured / max(first, 1e-9) / 3600:.1f} h")


# -- what it prints ----------------------------------------------------------------------


def area(curve: list[float | None], budgets: list[int]) -> float | None:
    """Mean accuracy over the labels (trapezoids between budgets)."""
    if any(a is None for a in curve) or len(curve) < 2:
        return curve[0] if curve and curve[0] is not None else None
    total = sum((curve[k] + curve[k + 1]) / 2 * (budgets[k + 1] - budgets[k]) for k in range(len(curve) - 1))
    return total / (budgets[-1] - budgets[0])


def labels_to_reach(curve: list[float | None], budgets: list[int], target: float) -> int | None:
    """The first budget at which *curve* reaches *target* (None: it never does)."""
    return next((b for a, b in zip(curve, budgets) if a is not None and a >= target - 1e-12), None)


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _f(value: float | None, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def report(args: argparse.Namespace, per_seed: dict[int, dict[str, Any]], budgets: list[int]) -> list[str]:
    out = []
    seeds = sorted(per_seed)
    for start in args.starts:
        out.append(f"\nAccuracy on the test file per round ({start} seed batch), mean over seeds {seeds} "
                   "[per seed]:")
        out.append("labels  " + "  ".join(f"{s:>22}" for s in args.strategies))
        for k, budget in enumerate(budgets):
            cells = []
            for strategy in args.strategies:
                values = [per_seed[s]["curves"][(start, strategy)][k] for s in seeds]
                cells.append(f"{_f(_mean(values))} [{' '.join(_f(v, 3) for v in values)}]".rjust(22))
            out.append(f"{budget:>6}  " + "  ".join(cells))
        out.append(f"Area under the curve ({start} start; mean accuracy over {budgets[0]}..{budgets[-1]} labels), "
                   "and the labels to reach random's final accuracy (mean curve; per seed):")
        random_curves = {s: per_seed[s]["curves"].get((start, RANDOM)) for s in seeds}
        random_mean = [_mean([random_curves[s][k] for s in seeds if random_curves[s]]) for k in range(len(budgets))]
        for strategy in args.strategies:
            curves = {s: per_seed[s]["curves"][(start, strategy)] for s in seeds}
            areas = {s: area(curves[s], budgets) for s in seeds}
            mean_curve = [_mean([curves[s][k] for s in seeds]) for k in range(len(budgets))]
            line = f"  {strategy:<17} area {_f(_mean(list(areas.values())))} [{' '.join(_f(a) for a in areas.values())}]"
            if random_mean[-1] is not None:
                reach = labels_to_reach(mean_curve, budgets, random_mean[-1])
                per = [labels_to_reach(curves[s], budgets, random_curves[s][-1]) if random_curves[s] else None
                       for s in seeds]
                line += (f"; reaches random's {budgets[-1]}-label accuracy {random_mean[-1]:.4f} at "
                         f"{reach if reach is not None else f'>{budgets[-1]}'} labels "
                         f"[{' '.join(str(p) if p is not None else f'>{budgets[-1]}' for p in per)}]")
                if strategy != RANDOM and random_curves[seeds[0]]:
                    wins = sum(1 for s in seeds if areas[s] is not None and area(random_curves[s], budgets) is not None
                               and areas[s] > area(random_curves[s], budgets))
                    line += f"; area beats random's on {wins} of {len(seeds)} seeds"
            out.append(line)
    if args.baselines and all(per_seed[s]["baselines"] for s in seeds):
        out.append(f"\nThe three trainers per budget on the random curve's labels, mean over seeds [per seed]:")
        names = [f"{DEFAULT_TRAINER} (defaults)"] + list(per_seed[seeds[0]]["baselines"])
        out.append("labels  " + "  ".join(f"{n:>30}" for n in names))
        start = "random" if "random" in args.starts else args.starts[0]
        for k, budget in enumerate(budgets):
            columns = [[per_seed[s]["curves"][(start, RANDOM)][k] for s in seeds]] if RANDOM in args.strategies else [[None]]
            columns += [[per_seed[s]["baselines"][n][k] for s in seeds] for n in names[1:]]
            out.append(f"{budget:>6}  " + "  ".join(
                f"{_f(_mean(c))} [{' '.join(_f(v, 3) for v in c)}]".rjust(30) for c in columns))
    return out


def plot(path: Path, args: argparse.Namespace, per_seed: dict[int, dict[str, Any]], budgets: list[int]) -> Path:
    """The mean curves, as a PNG with matplotlib where it is installed, else as an SVG written here."""
    seeds = sorted(per_seed)
    series = {f"{strategy} ({start} start)": [_mean([per_seed[s]["curves"][(start, strategy)][k] for s in seeds])
                                              for k in range(len(budgets))]
              for start in args.starts for strategy in args.strategies}
    if args.baselines and all(per_seed[s]["baselines"] for s in seeds):
        for name in per_seed[seeds[0]]["baselines"]:
            series[name] = [_mean([per_seed[s]["baselines"][name][k] for s in seeds]) for k in range(len(budgets))]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        svg = path.with_suffix(".svg")
        svg.write_text(_svg(series, budgets), encoding="utf-8")
        return svg
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, values in series.items():
        ax.plot(budgets, [math.nan if v is None else v for v in values], marker="o", label=name,
                linestyle="--" if "LR" in name else "-")
    ax.set_xlabel("labels")
    ax.set_ylabel("test accuracy")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def _svg(series: dict[str, list[float | None]], budgets: list[int]) -> str:
    width, height, pad = 720, 420, 50
    values = [v for vs in series.values() for v in vs if v is not None] or [0.0, 1.0]
    low, high = min(values), max(values)
    high = high if high > low else low + 0.01
    x = lambda b: pad + (b - budgets[0]) / max(budgets[-1] - budgets[0], 1) * (width - 2 * pad - 160)  # noqa: E731
    y = lambda a: height - pad - (a - low) / (high - low) * (height - 2 * pad)  # noqa: E731
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
               "#17becf", "#393b79", "#637939"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             'font-size="11">', f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad - 160}" y2="{height - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
             f'<text x="{(width - 160) / 2}" y="{height - 12}">labels</text>',
             f'<text x="8" y="{pad - 12}">test accuracy ({low:.3f}–{high:.3f})</text>']
    for b in budgets:
        parts.append(f'<text x="{x(b):.1f}" y="{height - pad + 14}" text-anchor="middle">{b}</text>')
    for k, (name, vs) in enumerate(series.items()):
        colour = colours[k % len(colours)]
        points = " ".join(f"{x(b):.1f},{y(v):.1f}" for b, v in zip(budgets, vs) if v is not None)
        dash = ' stroke-dasharray="4 3"' if "LR" in name else ""
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{points}"/>')
        parts.append(f'<text x="{width - pad - 150}" y="{pad + 14 * k}" fill="{colour}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="TSV with a header: text<TAB>label")
    parser.add_argument("--test", type=Path, help="the test TSV (default: test.tsv beside --data)")
    parser.add_argument("--pool", type=int, default=3000)
    parser.add_argument("--min-words", type=int, default=6)
    parser.add_argument("--seed-batch", type=int, default=50)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--budget", type=int, default=500)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, help="at most this many rounds per curve (round 0 included)")
    parser.add_argument("--strategies", default=",".join([RANDOM, "margin", "entropy", "least-confidence", DIVERSE]))
    parser.add_argument("--starts", default="random,cold-start", help="seed batches: random, cold-start")
    parser.add_argument("--no-baselines", dest="baselines", action="store_false")
    parser.add_argument("--plot", type=Path, default=Path("active_learning.png"))
    parser.add_argument("--work", type=Path, help="where the job directories go (default: a temporary one)")
    parser.add_argument("--model", help="another model for every trainer (a smoke test, not a measurement)")
    args = parser.parse_args(argv)
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    args.starts = [s.strip() for s in args.starts.split(",") if s.strip()]
    for s in args.strategies:
        if s != RANDOM and s not in STRATEGIES:
            parser.error(f"--strategies: {s!r} is not random or one of {', '.join(STRATEGIES)}")
    for s in args.starts:
        if s not in ("random", "cold-start"):
            parser.error(f"--starts: {s!r} is not random or cold-start")
    args.test = args.test or args.data.with_name("test.tsv")
    return args


def main(argv: list[str] | None = None) -> int:
    import os

    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    rows, test = read_tsv(args.data), read_tsv(args.test)
    labels = sorted({label for _, label in rows} | {label for _, label in test})
    budgets = budgets_of(args.seed_batch, args.batch, args.budget, args.rounds)
    say = lambda line: print(line, flush=True)  # noqa: E731
    say(f"Settings: pool {args.pool} (sentences of {args.min_words}+ words from {args.data}), test {len(test)} "
        f"({args.test}), seed batch {args.seed_batch}, batches of {args.batch}, budgets {budgets}, seeds "
        f"{list(range(args.first_seed, args.first_seed + args.seeds))}, strategies {args.strategies}, starts "
        f"{args.starts}, trainer {DEFAULT_TRAINER} with its defaults" + (f", model {args.model}" if args.model else ""))
    say(estimate(args, args.pool, len(test)))
    work = args.work or Path(tempfile.mkdtemp(prefix="potato-al-"))
    started = time.monotonic()
    per_seed = {}
    try:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            pool = sample_pool(rows, args.pool, args.min_words, seed)
            per_seed[seed] = curves_for_seed(args, seed, pool, test, labels, work, say)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    for line in report(args, per_seed, budgets):
        say(line)
    say(f"\nCurves: {plot(args.plot, args, per_seed, budgets)}")
    say(f"Whole bench: {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
