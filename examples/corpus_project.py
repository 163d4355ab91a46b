"""Turn a TSV or CSV corpus into a Potato project that serves the items the model is least sure of first.

    python examples/corpus_project.py CORPUS PROJECT_DIR [--text-column text] [--label-column label]
        [--labels a,b,c] [--limit N] [--per-file 1000] [--batch 25] [--order margin] [--start]

CORPUS is a ``.tsv`` or ``.csv`` file with a header line (the repository
ships none; e.g. SST-2's ``train.tsv``, whose columns are ``sentence`` and
``label``). Its text column becomes the items and its label column (when
there is one) the schema's labels; the corpus's own labels are **not**
written as answers: annotators give those. PROJECT_DIR gets:

- ``data/items-001.jsonl`` … (JSON lines, ``--per-file`` items each): the
  ``data_directory`` Potato 2.12 watches, into whose records the live
  writeback puts each run's predictions;
- ``config.yaml``: one radio schema ``label``; ``assignment_strategy:
  model_review`` (2.12 serves the items in the order ``--order`` ranks them,
  ``margin`` by default); ``model_training.writeback`` with ``live: true``;
  ``auto_retrain`` after every ``--batch`` annotations; an admin key of its own.

Then the loop (docs/real-corpus.md): Potato 2.12.1 serves
annotators, and this project's ``potato start`` beside it first queues the
cold start (a first batch spread over the corpus by the shipped MiniLM, so
that 2.12 serves from item one), then retrains after every ``--batch``
annotations and writes the new order back live. ``--start`` runs
``potato validate`` and then that ``potato start`` (Ctrl-C stops it).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import yaml

SCHEMA = "label"
ID_KEY, TEXT_KEY = "id", "text"


def read_corpus(path: Path, text_column: str | None, label_column: str | None,
                limit: int | None) -> tuple[list[str], list[str]]:
    """The corpus's texts and labels (``""`` where it has none), header by header."""
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter=delimiter,
                                quoting=csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL)
        columns = reader.fieldnames or []
        text_column = text_column or next((c for c in ("text", "sentence") if c in columns), columns[0] if columns
                                          else None)
        if text_column not in columns:
            raise SystemExit(f"{path} has no column {text_column!r}; its columns: {', '.join(columns)}")
        if label_column is None and "label" in columns:
            label_column = "label"
        if label_column is not None and label_column not in columns:
            raise SystemExit(f"{path} has no column {label_column!r}; its columns: {', '.join(columns)}")
        texts, labels = [], []
        for row in reader:
            text = (row.get(text_column) or "").strip()
            if text:
                texts.append(text)
                labels.append((row.get(label_column) or "").strip() if label_column else "")
            if limit and len(texts) >= limit:
                break
    if not texts:
        raise SystemExit(f"{path} has no text in column {text_column!r}")
    return texts, labels


def make_config(name: str, labels: list[str], batch: int, order: str) -> dict:
    """The project's config: read by Potato 2.12.1 (its annotators) and by this project (its training)."""
    return {
        "annotation_task_name": name,
        "task_dir": ".",
        "data_directory": "data",
        "watch_data_directory": True,  # 2.12 re-reads a changed data file: the live writeback's predictions
        "watch_poll_interval": 5,
        "item_properties": {"id_key": ID_KEY, "text_key": TEXT_KEY},
        "output_annotation_dir": "annotation_output",
        "admin_api_key": secrets.token_urlsafe(16),
        "user_config": {"allow_all_users": True},
        "assignment_strategy": "model_review",  # 2.12 serves the items in the order the writeback ranks them
        "pre_annotation": {"enabled": True},
        "annotation_schemes": [{"annotation_type": "radio", "name": SCHEMA,
                                "description": "Which label fits this text?", "labels": labels}],
        "model_training": {
            "enabled": False,  # 2.12 neither trains nor auto-retrains; this project does both
            "writeback": {"schemas": [SCHEMA], "include_unlabeled": True, "live": True, "order": order,
                          "order_batch": batch},
            "auto_retrain": {"enabled": True, "schemas": [SCHEMA], "update_frequency": batch,
                             "min_interval_s": 60},
        },
    }


def write_project(corpus: Path, project: Path, args: argparse.Namespace) -> Path:
    """Write PROJECT_DIR (module docstring); return its config's path."""
    texts, corpus_labels = read_corpus(corpus, args.text_column, args.label_column, args.limit)
    labels = [label.strip() for label in args.labels.split(",")] if args.labels else sorted(set(corpus_labels) - {""})
    if len(labels) < 2:
        raise SystemExit("A radio schema needs two labels or more: name them with --labels a,b or point "
                         "--label-column at the corpus's labels")
    data = project / "data"
    if data.exists() and any(data.iterdir()):
        raise SystemExit(f"{data} already holds files; choose a new PROJECT_DIR")
    data.mkdir(parents=True, exist_ok=True)
    width = len(str(len(texts)))
    for start in range(0, len(texts), args.per_file):
        with open(data / f"items-{start // args.per_file + 1:03d}.jsonl", "w", encoding="utf-8") as f:
            for n in range(start, min(start + args.per_file, len(texts))):
                f.write(json.dumps({ID_KEY: f"item-{n:0{width}d}", TEXT_KEY: texts[n]}, ensure_ascii=False) + "\n")
    config = project / "config.yaml"
    config.write_text(yaml.safe_dump(make_config(corpus.stem, labels, args.batch, args.order), sort_keys=False,
                                     allow_unicode=True), encoding="utf-8")
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("corpus", type=Path, help="a .tsv or .csv file with a header line")
    parser.add_argument("project", type=Path, help="the project directory to create")
    parser.add_argument("--text-column", help="default: text, else sentence, else the first column")
    parser.add_argument("--label-column", help="default: label, when the corpus has one")
    parser.add_argument("--labels", help="the schema's labels, comma-separated (default: the corpus's)")
    parser.add_argument("--limit", type=int, help="at most this many items")
    parser.add_argument("--per-file", type=int, default=1000, help="items per data file (default 1000)")
    parser.add_argument("--batch", type=int, default=25, help="annotations between two runs (default 25)")
    parser.add_argument("--order", default="margin", help="margin, entropy, least-confidence or diverse")
    parser.add_argument("--start", action="store_true", help="then run potato validate and potato start")
    args = parser.parse_args(argv)
    config = write_project(args.corpus, args.project, args)
    here = Path(sys.executable).parent
    print(f"Wrote {config} and {config.parent / 'data'}/. Annotators (Potato 2.12.1, in its own virtualenv):\n"
          f"  ~/potato-2.12/bin/potato start {config} -p 8000\n"
          f"Training beside it (this project; its first run is the cold start):\n"
          f"  {here / 'potato'} start {config} --port 8001")
    if not args.start:
        return 0
    potato = [str(here / "potato")] if (here / "potato").exists() else [sys.executable, "-m", "potato.cli"]
    checked = subprocess.run(potato + ["validate", str(config)])
    if checked.returncode != 0:
        return checked.returncode
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return subprocess.run(potato + ["start", str(config), "--port", "8001"]).returncode


if __name__ == "__main__":
    sys.exit(main())
