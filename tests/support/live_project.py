"""A data_directory written the way real projects' files come, for the live writeback to keep byte for byte.

Items are spread over three files, each a hazard for anything that rewrites
records by a JSON round trip:

- ``a.jsonl``: a UTF-8 byte order mark, CRLF line ends, keys in odd orders
  (text before id), numbers a round trip rewrites (``1e5``, ``1.0``,
  ``-0.0``, an integer past 64 bits), ``\\u2028`` and a lone surrogate as
  escapes, raw non-ASCII, escaped quotes and backslashes, nested objects
  holding the field name, an integer id;
- ``b.json``: a pretty-printed JSON array (indent 4, a trailing newline);
- ``c.csv``: a CSV file, which Potato 2.12 reads as text cells (no
  predictions can live there).

Potato 2.12.1 reads all three (checked by tests/e2e/test_live_beside_potato212.py).

``tickets_config`` makes a project of twelve such items with the live
writeback on, and ``record_run`` records a run's predictions as the flow's
record-results step does (the real bundle and writeback).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import yaml

from potato.bundle.build import build_bundle
from potato.config import load_config
from potato.json_records import records, starts_array
from potato.results.live_writeback import publish
from potato.runs.paths import open_store, run_paths
from potato.runs.store import SUCCEEDED
from tests.support.potato_project import write_user_state

# Which file each item goes to, by its position: most to the JSON-lines file.
JSONL, ARRAY, CSV = "a.jsonl", "b.json", "c.csv"


def _jsonl_line(n: int, item_id: str, text: str, id_key: str, text_key: str) -> str:
    quoted_id = json.dumps(item_id, ensure_ascii=False)
    quoted_text = json.dumps(text, ensure_ascii=False)
    shapes = [
        f'{{"{text_key}": {quoted_text}, "{id_key}": {quoted_id}, "score": 1e5, "weight": 1.0}}',
        f'{{ "{id_key}" : {quoted_id} ,  "{text_key}" : {quoted_text} , "note": "line\\u2028sep \\ud83d", '
        f'"zero": -0.0 }}',
        f'{{"{id_key}":{quoted_id},"{text_key}":{quoted_text},"meta":{{"predictions":"theirs","q":"\\"\\\\"}},'
        f'"big":123456789012345678901234567890}}',
        f'{{"{id_key}": {quoted_id}, "{text_key}": {quoted_text}, "city": "Zürich 😀", "tags": ["a", "}}"]}}',
    ]
    return shapes[n % len(shapes)]


def write_hostile_directory(directory: Path, items: Sequence[tuple[str, str]], *, id_key: str = "id",
                            text_key: str = "text", in_array: int = 3, in_csv: int = 2) -> dict[str, list[str]]:
    """Write *items* (``(id, text)``) into *directory*: the last *in_csv* into c.csv, the *in_array* before
    them into b.json, the rest into a.jsonl. Returns each file's ids."""
    directory.mkdir(parents=True, exist_ok=True)
    items = list(items)
    cut_csv = len(items) - in_csv
    cut_array = cut_csv - in_array
    lines = [_jsonl_line(n, item_id, text, id_key, text_key) for n, (item_id, text) in enumerate(items[:cut_array])]
    (directory / JSONL).write_bytes(b"\xef\xbb\xbf" + "".join(line + "\r\n" for line in lines).encode("utf-8"))
    array = [{id_key: item_id, "source": "import", text_key: text} for item_id, text in items[cut_array:cut_csv]]
    (directory / ARRAY).write_text(json.dumps(array, indent=4, ensure_ascii=False) + "\n", encoding="utf-8")
    rows = "".join(f'{item_id},"{text}"\n' for item_id, text in items[cut_csv:])
    (directory / CSV).write_text(f"{id_key},{text_key}\n" + rows, encoding="utf-8")
    return {JSONL: [i for i, _ in items[:cut_array]], ARRAY: [i for i, _ in items[cut_array:cut_csv]],
            CSV: [i for i, _ in items[cut_csv:]]}


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file of *directory* (hidden ones too) and its bytes."""
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.is_file()}


ITEMS = [(f"t{i}", f"ticket {i} café") for i in range(12)]
LABELLED = ["t0", "t1"]  # trained on (no holdout)


def tickets_config(tmp_path: Path, *, strategy: str | None = None, data_files: bool = False, **writeback) -> Path:
    write_hostile_directory(tmp_path / "tickets", ITEMS)
    raw = {
        "annotation_task_name": "Tickets", "task_dir": ".", "data_directory": "tickets", "admin_api_key": "k",
        "watch_data_directory": True, "watch_poll_interval": 2, "output_annotation_dir": "annotations",
        "annotation_schemes": [
            {"annotation_type": "radio", "name": "tone", "labels": ["calm", "angry"]},
            {"annotation_type": "slider", "name": "urgency", "min_value": 0, "max_value": 10, "step": 1}],
        "pre_annotation": {"enabled": True},
        "model_training": {"holdout_fraction": 0.0, "writeback": {
            "schemas": ["tone"], "include_unlabeled": True, "min_confidence": 0.5, "live": True,
            **writeback}},
    }
    if strategy:
        raw["assignment_strategy"] = strategy
    if data_files:
        (tmp_path / "early.jsonl").write_text('{"id": "t3", "text": "read first from data_files"}\n')
        raw["data_files"] = ["early.jsonl"]
    write_user_state(tmp_path / "annotations", "alice", {i: {"tone": "calm"} for i in LABELLED})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def load_with_slider(config_path: Path):
    """The config, with the slider written back too (its kind's trainer comes with another branch of work:
    validation refuses it in writeback.schemas until then; the writeback itself needs no trainer)."""
    config = load_config(config_path)
    wb = replace(config.model_training.writeback, schemas=("tone", "urgency"))
    return replace(config, model_training=replace(config.model_training, writeback=wb))


def succeeded_run(tmp_path: Path, config, run_id: int, schemas, rows: list[dict], meanwhile=None):
    """Run *run_id* as record-results finds it: succeeded, its bundle built, its ``predictions.jsonl`` holding
    *rows*; *meanwhile()* runs after the bundle was made (while it would train). Returns the store, the
    predictions file and the bundle."""
    store = open_store(config)
    while store.count_runs() < run_id:
        store.create_run("hf-text-classification", list(schemas), "local")
    store.update_run(run_id, state=SUCCEEDED)
    bundle = tmp_path / f"bundle{run_id}"
    build_bundle(config, list(schemas), bundle)
    if meanwhile is not None:
        meanwhile()
    predictions = run_paths(config, run_id).predictions
    predictions.parent.mkdir(parents=True, exist_ok=True)
    predictions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return store, predictions, bundle


def record_run(tmp_path: Path, config_path: Path, run_id: int, tone: dict[str, tuple[str, float]],
               urgency: dict[str, float] | None = None, schemas=("tone", "urgency"), meanwhile=None):
    """Record run *run_id* as succeeded and write its predictions back, as the flow's record-results does;
    *meanwhile()* runs after the run's bundle was made (while it would train)."""
    config = load_with_slider(config_path)
    rows = [{"id": i, "schema": "tone", "label": label, "confidence": c} for i, (label, c) in tone.items()]
    rows += [{"id": i, "schema": "urgency", "value": v} for i, v in (urgency or {}).items()]
    store, predictions, bundle = succeeded_run(tmp_path, config, run_id, schemas, rows, meanwhile)
    return config, store, publish(config, run_id, list(schemas), predictions, bundle)


def item_fields(directory: Path, field: str = "predictions") -> dict[str, object]:
    """What each item's record in the JSON files holds under *field* (absent ones left out)."""
    found = {}
    for name in (JSONL, ARRAY):
        data = (directory / name).read_bytes()
        for record in records(data, array=starts_array(data)):
            if field in record.value:
                found[str(record.value["id"])] = record.value[field]
    return found


def written_back_project(root: Path, files: dict[str, Sequence[str]], *, label: str = "calm") -> Path:
    """A project whose data_directory ``items/`` holds *files* (name -> item ids, JSON lines) and whose
    writeback file already holds a prediction of *label* (run 1) for every item, as after a run whose live
    writeback has not happened yet; its config's path."""
    items = root / "items"
    items.mkdir(parents=True)
    lines = []
    for name, ids in files.items():
        (items / name).write_text("".join(json.dumps({"id": i, "text": f"ticket {i}"}) + "\n" for i in ids))
        lines += [json.dumps({"id": i, "predictions": {"tone": {"label": label, "confidence": 0.9, "run_id": 1}}})
                  for i in ids]
    training = root / "annotations" / "training"
    training.mkdir(parents=True)
    (training / "predictions.jsonl").write_text("".join(line + "\n" for line in lines))
    raw = {
        "annotation_task_name": "Tickets", "task_dir": ".", "data_directory": "items", "admin_api_key": "k",
        "watch_data_directory": True, "watch_poll_interval": 2, "output_annotation_dir": "annotations",
        "annotation_schemes": [{"annotation_type": "radio", "name": "tone", "labels": ["calm", "angry"]}],
        "pre_annotation": {"enabled": True},
        "model_training": {"writeback": {"schemas": ["tone"], "include_unlabeled": True, "live": True}},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path
