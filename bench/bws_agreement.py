"""Best–worst scaling on real sentences: hf-reward-model's held-out picks beside Potato 2.12.1's own scores.

2.12.1 scores the items annotators compared (``potato/bws_scoring.py``:
counting, ``(best - worst) / appearances``, and Bradley–Terry through
``choix``); it cannot score a text nobody compared. hf-reward-model learns a
scorer of any text. This bench measures both on the same answers:

- the corpus: sentences of six words or more from SST-2's ``train.tsv``
  (``sentence<TAB>label``, 1 positive), a path argument; ``--pool`` of them
  become the project's items, in the tuples of four 2.12.1 builds
  (``potato.items.bws_tuples``, ``bws_config`` defaults: each item in eight);
- the annotators (``--annotators``, 3): each picks a tuple's most and least
  positive sentence by its label plus a noise of its own per look
  (normal, ``--noise`` 0.5), a Thurstonian annotator: two positive
  sentences are a coin's toss, a positive and a negative one mostly not;
- held out: a random ``--holdout`` share (0.2) of the tuples, their texts
  also in training tuples (as in a project), and ``--unseen`` tuples (100) of
  sentences no training tuple holds (a project's new items);
- ours: the real worker, ``hf-reward-model`` with no option set (the shipped
  MiniLM), on the training tuples; its best and worst for each held-out
  tuple;
- 2.12.1's: ``BwsScorer`` run in 2.12.1's own virtualenv on the same
  training answers, its counting and (where ``choix`` is installed there)
  Bradley–Terry scores; a held-out tuple's best is its text of the highest
  score, its worst of the lowest. A text it never saw scores 0, as 2.12.1
  gives it; equal scores go to the first position.

Printed: each side's agreement with the held-out majority's best and worst
(``potato.training.trainers.metrics.best_worst``: tuples whose most-picked
best or worst is shared are left out of that one), on the seen and the
unseen tuples, and ours over 2.12.1's counting; beside them, picking by the
sentences' labels themselves, the ceiling the annotators' noise leaves.

    .venv/bin/python bench/bws_agreement.py /path/to/sst2/train.tsv [--pool 300] [--threads 2]
    # Bradley-Terry too: pip install --target /tmp/choix --no-deps choix; then --choix /tmp/choix

Measured on this project's 2-core CPU machine (``--pool 300``, 600 tuples,
480 trained on, 120 held out beside 100 unseen; 3 annotators, noise 0.5;
2 threads; 3 min 15 s), agreement with the held-out majority's best / worst:

    scorer                          seen best  seen worst  unseen best  unseen worst
    hf-reward-model (defaults)      0.580      0.465       0.506        0.506
    Potato 2.12.1 counting          0.560      0.545       0.272        0.271
    Potato 2.12.1 Bradley-Terry     0.610      0.554       0.272        0.271
    the hidden label (ceiling)      0.550      0.663       0.605        0.600

On tuples of texts it has counts for, 2.12.1's scores are as good or better
(mean 0.552 counting, 0.582 Bradley-Terry, against our 0.523: 0.95x): each
text was in about six training tuples, and a count of six picks knows that
text better than a model trained on 480 tuples knows sentiment. On texts
nobody compared, 2.12.1 has no score (each is 0: chance, 0.27) and ours
keeps 0.51, 84 % of the ceiling the annotators' noise leaves.

Run by hand; never part of CI's pass/fail.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench import _versus_trainer as vs  # noqa: E402
from potato.items.bws_tuples import bws_tuples  # noqa: E402
from potato.scheme_fields import BwsConfig  # noqa: E402
from potato.training.trainers.metrics import best_worst  # noqa: E402

SCHEMA = "quality"
POSITIONS = "ABCD"
_SCORER = """
import json, sys
from potato.bws_scoring import BwsScorer
job = json.load(open(sys.argv[1]))
scorer = BwsScorer(job["annotations"], job["pool"], "id")
out = {"counting": {i: s["score"] for i, s in scorer.counting().items()}}
try:
    import choix  # noqa: F401
    out["bradley_terry"] = {i: s["score"] for i, s in scorer.bradley_terry().items()}
except ImportError:
    pass
print(json.dumps(out))
"""


def sentences(path: Path, n: int, seed: int) -> list:
    """``n`` distinct sentences of six words or more, ``{"id", "text", "label"}``, drawn at random."""
    with open(path, encoding="utf-8") as f:
        rows = [(r[0].strip(), int(r[1])) for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
                if len(r) == 2 and r[1] in ("0", "1") and len(r[0].split()) >= 6]
    rows = sorted(set(rows))
    random.Random(seed).shuffle(rows)
    return [{"id": "s{}".format(i), "text": text, "label": label} for i, (text, label) in enumerate(rows[:n])]


def annotate(tuples: list, by_id: dict, annotators: int, noise: float, rng: random.Random) -> list:
    """Each tuple with each annotator's ``(best, worst)`` positions."""
    out = []
    for t in tuples:
        members = t["_bws_items"]
        picks = []
        for _ in range(annotators):
            seen = [by_id[m["source_id"]]["label"] + rng.gauss(0, noise) for m in members]
            picks.append((POSITIONS[seen.index(max(seen))], POSITIONS[seen.index(min(seen))]))
        out.append(dict(t, picks=picks))
    return out


def counts(picks: list) -> dict:
    out = {"best": {}, "worst": {}}
    for best, worst in picks:
        out["best"][best] = out["best"].get(best, 0) + 1
        out["worst"][worst] = out["worst"].get(worst, 0) + 1
    return out


def run_ours(work: Path, train: list, held: dict, threads: int) -> dict:
    """Our picks for every held-out tuple: ``{tuple id: (best, worst)}``."""
    items = [{"id": t["id"], "text": "", "sides": {SCHEMA: [m["text"] for m in t["_bws_items"]]},
              "labels": {SCHEMA: counts(t["picks"])}, "holdout": False} for t in train]
    items += [{"id": t["id"], "text": "", "sides": {SCHEMA: [m["text"] for m in t["_bws_items"]]},
               "labels": {SCHEMA: counts(t["picks"])}, "holdout": True} for ts in held.values() for t in ts]
    vs.run_worker(work, items, threads, {"trainer": "hf-reward-model", "schemas": [SCHEMA], "options": {}},
                  {"schemas": {SCHEMA: list(POSITIONS)},
                   "answers": {SCHEMA: {"type": "bws", "kind": "best_worst", "tuple_size": 4}}})
    lines = [json.loads(line) for line in (work / "predictions.jsonl").read_text().splitlines()]
    return {line["id"]: (line["label"], line["worst"]) for line in lines}


def run_212(work: Path, train: list, pool: list, python: Path, choix: str) -> dict:
    """2.12.1's scores of the pool's items from the training answers: ``{method: {item id: score}}``."""
    annotations = [{"instance_id": t["id"], "bws_items": t["_bws_items"], "best": best, "worst": worst,
                    "annotator": "a{}".format(k)} for t in train for k, (best, worst) in enumerate(t["picks"])]
    job = work / "scorer.json"
    job.write_text(json.dumps({"annotations": annotations, "pool": [{"id": p["id"], "text": p["text"]} for p in pool]}))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **({"PYTHONPATH": choix} if choix else {})}
    done = subprocess.run([str(python), "-c", _SCORER, str(job)], capture_output=True, text=True, env=env,
                          cwd=str(work))  # not the repository: its own potato would shadow 2.12.1's
    if done.returncode != 0:
        raise SystemExit("2.12.1's scorer failed:\n" + done.stderr[-3000:])
    return json.loads(done.stdout)


def picks_by_score(tuples: list, scores: dict) -> dict:
    out = {}
    for t in tuples:
        values = [scores.get(m["source_id"], 0.0) for m in t["_bws_items"]]
        out[t["id"]] = (POSITIONS[values.index(max(values))], POSITIONS[values.index(min(values))])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("corpus", type=Path, help="SST-2's train.tsv (sentence<TAB>label)")
    parser.add_argument("--pool", type=int, default=300)
    parser.add_argument("--unseen", type=int, default=100, help="held-out tuples of sentences no training tuple holds")
    parser.add_argument("--holdout", type=float, default=0.2)
    parser.add_argument("--annotators", type=int, default=3)
    parser.add_argument("--noise", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--potato212-python", type=Path, default=ROOT / ".venv-potato212" / "bin" / "python")
    parser.add_argument("--choix", default="", help="a folder holding choix, for 2.12.1's Bradley-Terry")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    texts = sentences(args.corpus, args.pool + args.unseen, args.seed)
    pool, fresh = texts[:args.pool], texts[args.pool:]
    by_id = {t["id"]: t for t in texts}
    tuples = annotate(bws_tuples(pool, "id", "text", BwsConfig()), by_id, args.annotators, args.noise, rng)
    rng.shuffle(tuples)
    cut = int(round(len(tuples) * args.holdout))
    held = {"seen": tuples[:cut]}
    train = tuples[cut:]
    unseen = bws_tuples(fresh, "id", "text", BwsConfig(num_tuples=args.unseen, seed=args.seed + 1))
    held["unseen"] = annotate([dict(t, id="new_" + t["id"]) for t in unseen], by_id, args.annotators, args.noise, rng)
    print("{} sentences in {} tuples of four, {} trained on; held out: {} tuples of the same sentences, {} of {} "
          "sentences never in a training tuple; {} annotators, noise {}; {} threads".format(
              len(pool), len(tuples), len(train), len(held["seen"]), len(held["unseen"]), len(fresh),
              args.annotators, args.noise, args.threads), flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sides = {"hf-reward-model (defaults)": run_ours(work / "ours", train, held, args.threads)}
        every_held = [t for ts in held.values() for t in ts]
        for method, scores in run_212(work, train, pool, args.potato212_python, args.choix).items():
            sides["Potato 2.12.1 " + method] = picks_by_score(every_held, scores)
        # The ceiling: what the annotators' own noise leaves to any scorer (equal labels: the first position).
        sides["the hidden label itself (ceiling)"] = picks_by_score(every_held, {t["id"]: t["label"] for t in texts})
    results = {}
    print("| scorer | seen: best | seen: worst | unseen: best | unseen: worst |")
    print("|---|---|---|---|---|")
    for name, picked in sides.items():
        row = []
        for which in ("seen", "unseen"):
            gold = [counts(t["picks"]) for t in held[which]]
            scores = best_worst(gold, [picked[t["id"]] for t in held[which]])
            results[(name, which)] = scores
            row += ["{:.3f}".format(scores["best_agreement"]), "{:.3f}".format(scores["worst_agreement"])]
        print("| {} | {} |".format(name, " | ".join(row)), flush=True)
    ours, theirs = results[("hf-reward-model (defaults)", "seen")], results[("Potato 2.12.1 counting", "seen")]
    print("Seen tuples, mean of best and worst agreement: ours {:.3f}, 2.12.1's counting {:.3f} ({:.2f}x)".format(
        ours["agreement"], theirs["agreement"], ours["agreement"] / theirs["agreement"]))


if __name__ == "__main__":
    main()
