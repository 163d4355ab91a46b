"""Write a realistic Potato project into a directory, for tests and benchmarks.

The files look like the ones real Potato writes (``davidjurgens/potato``):
``user_state.json`` mirrors ``InMemoryUserState.to_json`` in
``potato/user_state_management.py`` — all its top-level keys, ``indent=2``,
``instance_id_to_label_to_value`` as ``[[{"schema": S, "name": L}, VALUE], ...]``
with VALUE the label's text (what a radio input posts), and phases written as
their string values. ``fmt="dict"`` writes the older ``{S: {L: "true"}}`` form.

Typical use::

    config_yaml = make_project(tmp_path, n_items=30)
    config = project_config(config_yaml)        # a ProjectConfig, no load_config needed
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

from potato.config import ModelTrainingConfig, ProjectConfig, Scheme

DEFAULT_LABELS = ("positive", "negative")
# The admin key of every generated project (not the example's placeholder, which validate warns about).
ADMIN_API_KEY = "test-admin-key"

# The VALUE Potato itself writes: the label's text (pairs) or "true" (dict).
POTATO_VALUE: Any = object()
DEFAULT_ANNOTATORS = ("alice", "bob", "carol")

_POSITIVE = ["Great product, works as promised.", "I love it, five stars.", "Excellent value."]
_NEGATIVE = ["Broke after two days.", "Terrible, I want a refund.", "Worst purchase ever."]


def item_text(i: int, label: str) -> str:
    """A short review whose wording matches *label* (deterministic in *i*)."""
    pool = _POSITIVE if label == DEFAULT_LABELS[0] else _NEGATIVE
    return f"{pool[i % len(pool)]} (review {i})"


def true_label(i: int, labels: Sequence[str] = DEFAULT_LABELS) -> str:
    return labels[i % len(labels)]


def user_state_dict(
    user: str,
    labels: Mapping[str, Mapping[str, str | Sequence[str]]],
    fmt: str = "pairs",
    value: Any = POTATO_VALUE,
) -> dict[str, Any]:
    """The dict real Potato saves as ``user_state.json`` for *user*.

    *labels* maps item id -> schema -> label (or a list of labels, multiselect).
    *fmt*: ``"pairs"`` (current Potato) or ``"dict"`` (older files).
    *value*: the VALUE written beside each label; by default what Potato
    writes, the label's text (pairs) or ``"true"`` (dict).
    """
    ordering = list(labels)
    per_item: dict[str, Any] = {}
    for item_id, by_schema in labels.items():
        if fmt == "pairs":
            pairs = []
            for schema, chosen in by_schema.items():
                for label in [chosen] if isinstance(chosen, str) else chosen:
                    pairs.append([{"schema": schema, "name": label}, label if value is POTATO_VALUE else value])
            per_item[item_id] = pairs
        elif fmt == "dict":
            per_item[item_id] = {
                schema: {label: ("true" if value is POTATO_VALUE else value) for label in ([chosen] if isinstance(chosen, str) else chosen)}
                for schema, chosen in by_schema.items()
            }
        else:
            raise ValueError(f"fmt must be 'pairs' or 'dict', not {fmt!r}")
    return {
        "user_id": user,
        "instance_id_ordering": ordering,
        "current_instance_index": max(len(ordering) - 1, 0),
        "current_phase_and_page": ["annotation", "annotation"],
        "completed_phase_and_pages": [["consent", "consent"], ["instructions", "instructions"]],
        "max_assignments": -1,
        "instance_id_to_behavioral_data": {
            item_id: {"instance_id": item_id, "session_start": 1764400000.0, "total_time_ms": 4200, "interactions": []}
            for item_id in ordering[:3]
        },
        "instance_id_to_label_to_value": per_item,
        "instance_id_to_span_to_value": {},
        "phase_to_page_to_label_to_value": {"consent": {"consent": [[{"schema": "consent", "name": "Yes"}, "true"]]}},
        "phase_to_page_to_span_to_value": {},
        "training_state": {
            "completed_questions": {}, "total_correct": 0, "total_attempts": 0, "total_mistakes": 0,
            "passed": False, "failed": False, "current_question_index": 0, "training_instances": [],
            "show_feedback": False, "feedback_message": "", "allow_retry": False,
            "max_mistakes": -1, "max_mistakes_per_question": -1, "category_scores": {},
        },
        "qualified_categories": [],
        "category_qualification_scores": {},
        "instance_id_to_keyword_highlight_state": {},
        "instance_id_to_link_to_value": {},
        "instance_id_to_event_to_value": {},
    }


def write_user_state(
    annotation_dir: Path,
    user: str,
    labels: Mapping[str, Mapping[str, str | Sequence[str]]],
    fmt: str = "pairs",
    value: Any = POTATO_VALUE,
    indent: int | None = 2,
) -> Path:
    """Write ``<annotation_dir>/<user>/user_state.json`` as Potato does; return its path."""
    path = Path(annotation_dir) / user / "user_state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(user_state_dict(user, labels, fmt, value), f, indent=indent)
    return path


def write_items(path: Path, items: Iterable[Mapping[str, Any]], data_format: str = "jsonl") -> Path:
    """Write *items* as JSON lines, a JSON array, CSV or TSV (with a header row)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if data_format == "jsonl":
        with open(path, "w", encoding="utf-8") as f:
            for item in items:
                f.write(json.dumps(item, ensure_ascii=False) + "\n")
    elif data_format == "array":
        with open(path, "w", encoding="utf-8") as f:
            json.dump(list(items), f, indent=2, ensure_ascii=False)
    elif data_format in ("csv", "tsv"):
        rows = list(items)
        with open(path, "w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="," if data_format == "csv" else "\t")
            writer.writeheader()
            writer.writerows(rows)
    else:
        raise ValueError(f"unknown data_format {data_format!r}")
    return path


_SUFFIX = {"jsonl": ".json", "array": ".json", "csv": ".csv", "tsv": ".tsv"}


def make_project(
    root: Path,
    n_items: int = 20,
    annotators: Sequence[str] = DEFAULT_ANNOTATORS,
    fmt: str | Sequence[str] = "pairs",
    *,
    data_format: str = "jsonl",
    schema: str = "sentiment",
    labels: Sequence[str] = DEFAULT_LABELS,
    labeled_fraction: float = 0.5,
    disagree_every: int = 7,
    user_labels: Mapping[str, Mapping[str, str]] | None = None,
    model_training: Mapping[str, Any] | None = None,
    id_key: str = "id",
    text_key: str = "text",
    indent: int | None = 2,
) -> Path:
    """Write a Potato project under *root* and return the path of its ``config.yaml``.

    Items ``r0 … r{n-1}`` in ``data/reviews.<ext>``; item i's true label is
    ``labels[i % len(labels)]`` and its text says so. About *labeled_fraction*
    of the items are labelled, each by one to all annotators (annotator
    ``i % len(annotators)`` always labels item i); annotator k gives the wrong label
    on items where ``(i + k) % disagree_every == 0`` (0 = never). *fmt* is one
    format for all annotators, or one per annotator. *user_labels* (user ->
    item id -> label) replaces the generated labels entirely. A ``training/``
    directory without ``user_state.json`` is created too, as on a real server.
    """
    root = Path(root)
    data_path = root / "data" / f"reviews{_SUFFIX[data_format]}"
    write_items(
        data_path,
        ({id_key: f"r{i}", text_key: item_text(i, true_label(i, labels))} for i in range(n_items)),
        data_format,
    )
    out_dir = root / "annotation_output"
    (out_dir / "training").mkdir(parents=True, exist_ok=True)
    fmts = [fmt] * len(annotators) if isinstance(fmt, str) else list(fmt)
    for k, user in enumerate(annotators):
        if user_labels is not None:
            given = {iid: {schema: lab} for iid, lab in user_labels.get(user, {}).items()}
        else:
            given = {}
            for i in range(n_items):
                # About labeled_fraction of the items are labelled at all; annotator
                # i % n always labels item i, the others two times in three.
                if ((i * 7919) % 1000) / 1000 >= labeled_fraction:
                    continue
                if k != i % len(annotators) and (i * 31 + k * 17) % 3 == 0:
                    continue
                lab = true_label(i, labels)
                if disagree_every and (i + k) % disagree_every == 0:
                    lab = labels[(labels.index(lab) + 1) % len(labels)]
                given[f"r{i}"] = {schema: lab}
        write_user_state(out_dir, user, given, fmts[k], indent=indent)
    config: dict[str, Any] = {
        "annotation_task_name": "Review Sentiment",
        "task_dir": ".",
        "data_files": [str(data_path.relative_to(root))],
        "item_properties": {"id_key": id_key, "text_key": text_key},
        "output_annotation_dir": "annotation_output",
        "admin_api_key": ADMIN_API_KEY,
        "annotation_schemes": [
            {"annotation_type": "radio", "name": schema, "description": "Is this review positive or negative?", "labels": list(labels)}
        ],
        "model_training": dict(model_training or {"enabled": True}),
    }
    config_path = root / "config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return config_path


def project_config(config_path: Path, **model_training: Any) -> ProjectConfig:
    """A ``ProjectConfig`` for a project written by ``make_project`` (no ``load_config``).

    Only the keys ``potato.project`` reads are typed; *model_training* sets
    ``ModelTrainingConfig`` fields (e.g. ``holdout_fraction=0.3``).
    """
    config_path = Path(config_path).resolve()
    raw = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    task_dir = (config_path.parent / raw.get("task_dir", ".")).resolve()
    props = raw.get("item_properties") or {}
    schemes = tuple(
        Scheme(
            name=s["name"],
            annotation_type=s.get("annotation_type", "radio"),
            labels=tuple(lab if isinstance(lab, str) else lab["name"] for lab in s.get("labels", [])),
            description=s.get("description", ""),
        )
        for s in raw.get("annotation_schemes", [])
    )
    return ProjectConfig(
        path=config_path,
        task_dir=task_dir,
        data_files=tuple(task_dir / p for p in raw.get("data_files", [])),
        id_key=props.get("id_key", "id"),
        text_key=props.get("text_key", "text"),
        output_annotation_dir=task_dir / raw.get("output_annotation_dir", "annotation_output"),
        admin_api_key=raw.get("admin_api_key"),
        schemes=schemes,
        model_training=ModelTrainingConfig(**model_training),
        annotation_task_name=raw.get("annotation_task_name", ""),
        raw=raw,
    )
