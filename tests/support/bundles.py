"""Write small run bundles and job directories by hand, as docs/architecture.md describes them.

Independent of potato/project.py on purpose: the worker's tests check the
worker against the documented format, not against the bundle builder.
"""

from __future__ import annotations

import json
import random
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
