"""examples/corpus_project.py: a TSV or CSV corpus becomes a project that ``potato validate`` passes and a
run's bundle reads, served by model_review with a live writeback (docs/real-corpus.md).

Generated corpora (the repository ships none). Cost: about 2 s.
"""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from potato.bundle.build import build_bundle
from potato.config import load_config
from potato.validate import validate_config_file

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("corpus_project", ROOT / "examples" / "corpus_project.py")
corpus_project = importlib.util.module_from_spec(spec)
spec.loader.exec_module(corpus_project)


def _corpus(path: Path, rows: list[tuple[str, str]], header=("sentence", "label")) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t" if path.suffix == ".tsv" else ",")
        writer.writerow(header)
        writer.writerows(rows)
    return path


ROWS = [(f"a {'good' if n % 2 else 'bad'} film, number {n}, naïve “quotes”", str(n % 2)) for n in range(25)]


def test_a_tsv_corpus_becomes_a_model_review_project_that_validates(tmp_path, capsys):
    corpus = _corpus(tmp_path / "train.tsv", ROWS)
    project = tmp_path / "project"
    assert corpus_project.main([str(corpus), str(project), "--per-file", "10", "--batch", "5"]) == 0
    assert sorted(p.name for p in (project / "data").iterdir()) == ["items-001.jsonl", "items-002.jsonl",
                                                                     "items-003.jsonl"]
    first = json.loads((project / "data" / "items-001.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert first == {"id": "item-00", "text": ROWS[0][0]}  # the corpus's label is not an answer
    raw = yaml.safe_load((project / "config.yaml").read_text())
    assert raw["assignment_strategy"] == "model_review" and raw["annotation_schemes"][0]["labels"] == ["0", "1"]
    assert raw["model_training"]["writeback"] == {"schemas": ["label"], "include_unlabeled": True, "live": True,
                                                  "order": "margin", "order_batch": 5}
    report = validate_config_file(project / "config.yaml", read_items=True)
    assert (report.errors, report.warnings) == ((), ())
    config = load_config(project / "config.yaml")
    assert build_bundle(config, ["label"], tmp_path / "bundle").items == 25
    assert "Training beside it (this project; its first run is the cold start):" in capsys.readouterr().out


def test_a_csv_corpus_with_named_columns_and_labels(tmp_path):
    corpus = _corpus(tmp_path / "c.csv", [(t, "x") for t, _ in ROWS[:4]], header=("body", "kind"))
    project = tmp_path / "p"
    corpus_project.main([str(corpus), str(project), "--text-column", "body", "--labels", "pos,neg,mixed"])
    raw = yaml.safe_load((project / "config.yaml").read_text())
    assert raw["annotation_schemes"][0]["labels"] == ["pos", "neg", "mixed"]
    with pytest.raises(SystemExit, match=r"has no column 'text'; its columns: body, kind"):
        corpus_project.main([str(corpus), str(tmp_path / "q"), "--text-column", "text", "--labels", "a,b"])
    with pytest.raises(SystemExit, match="already holds files; choose a new PROJECT_DIR"):
        corpus_project.main([str(corpus), str(project), "--text-column", "body", "--labels", "a,b"])
