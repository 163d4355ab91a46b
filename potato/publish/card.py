"""The model card: ``README.md`` with the Hub's YAML front matter, rendered from a run's facts (pure).

What the card says, and what it never says: the labels per schema, the
holdout scores and confusion matrices, what the model learned from **in
counts only** (items, labelled items, annotators, labels per class,
aggregation, the split), the trainer and its options, where it trained
(backend type and device, not the host) and how long, the run id and date.
No annotator name, no item text, no item id and no path of this server
appears: ``facts`` hands over counts and names of labels, never records.

Every value that comes from a config or a run is escaped for Markdown (a
label may hold ``|``), and the front matter is written by ``yaml.safe_dump``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import yaml

PIPELINE_TAG = "text-classification"
CARD_FILE = "README.md"
CALIBRATION_FILE = "calibration.json"
_MARKDOWN = str.maketrans({c: "\\" + c for c in "\\`*_[]<>|#"} | {"\n": " ", "\r": " "})


@dataclass(frozen=True)
class SchemaFacts:
    """One schema's model: where it is in the repo and how it did."""

    name: str
    labels: Sequence[str]
    folder: str                       # "" when the model is at the repo's root
    scores: Mapping[str, Any] = field(default_factory=dict)
    confusion: Sequence[Sequence[int]] | None = None
    labelled: int | None = None
    held_out: int | None = None
    per_label: Mapping[str, int] | None = None
    ties: int | None = None
    calibration: Mapping[str, Any] | None = None   # decision-calibrate's scores for the schema


@dataclass(frozen=True)
class CardFacts:
    """Everything the card says (``facts.card_facts`` gathers it)."""

    project: str
    run_id: int
    trainer: str
    kind: str                          # "full" or "lora"
    base_model: str | None             # a Hub id, or None
    base_model_note: str | None        # what the base was when it has no Hub id
    license: str | None
    options: Mapping[str, Any]
    schemas: Sequence[SchemaFacts]
    items: int | None = None
    annotators: int | None = None
    aggregation: str | None = None
    split: str | None = None
    backend_type: str | None = None
    device: str | None = None
    duration_s: float | None = None
    finished_at: float | None = None
    calibrated_by: int | None = None   # the decision-calibrate run published with the model
    calibrated_later_by: int | None = None  # a calibration of this model published elsewhere


def md(value: Any) -> str:
    """*value* as Markdown text that renders as written."""
    return str(value).translate(_MARKDOWN)


def code(value: Any) -> str:
    """*value* as a code span in a table cell (escapes do not work inside one; a pipe still ends a cell)."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
    return "`" + " ".join(text.replace("`", "'").replace("|", "\\|").split()) + "`"


def _number(value: Any) -> str:
    return "–" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = round(seconds)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s" if s < 3600 else f"{s // 3600} h {s % 3600 // 60:02d} min"


def front_matter(facts: CardFacts) -> dict[str, Any]:
    meta: dict[str, Any] = {"library_name": "peft" if facts.kind == "lora" else "transformers"}
    if facts.base_model:
        meta["base_model"] = facts.base_model
    meta["pipeline_tag"] = PIPELINE_TAG
    if facts.license:
        meta["license"] = facts.license
    meta["tags"] = ["potato", facts.trainer, PIPELINE_TAG] + (["lora"] if facts.kind == "lora" else [])
    return meta


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def _labels(facts: CardFacts) -> list[str]:
    rows = [(md(s.name), ", ".join(code(label) for label in s.labels),
             code(f"{s.folder}/") if s.folder else "the repo's root") for s in facts.schemas]
    return ["## Labels", "", *_table(("schema", "labels (in the model's order)", "model"), rows), ""]


def _scores(facts: CardFacts) -> list[str]:
    out = ["## Holdout scores", "",
           "Scored on labelled items held out of training (never trained on).", ""]
    rows = [(md(s.name), _number(s.scores.get("n", s.held_out)), _number(s.scores.get("accuracy")),
             _number(s.scores.get("macro_f1"))) for s in facts.schemas]
    out += [*_table(("schema", "held-out items", "accuracy", "macro-F1"), rows), ""]
    for s in facts.schemas:
        if not s.confusion:
            continue
        out += [f"### Confusion matrix: {md(s.name)}", "",
                "Rows: the annotators' label; columns: the model's.", ""]
        out += _table(("", *(f"**{md(label)}**" for label in s.labels)),
                      [(f"**{md(label)}**", *row) for label, row in zip(s.labels, s.confusion)])
        out.append("")
    return out


def _data(facts: CardFacts) -> list[str]:
    out = ["## Data", "",
           "What the model learned from, in counts: no item, annotator or answer leaves the project.", ""]
    rows: list[tuple[str, str]] = []
    if facts.items is not None:
        rows.append(("items in the project", str(facts.items)))
    if facts.annotators is not None:
        rows.append(("annotators", str(facts.annotators)))
    for s in facts.schemas:
        if s.labelled is not None:
            trained = s.labelled - (s.held_out or 0)
            rows.append((f"labelled items ({md(s.name)})", f"{s.labelled}: {trained} trained on, {s.held_out or 0} held out"))
        if s.per_label:
            rows.append((f"labels per class ({md(s.name)})",
                         ", ".join(f"{code(label)} {n}" for label, n in s.per_label.items())))
        if s.ties:
            rows.append((f"ties ({md(s.name)})", f"{s.ties} (annotators split evenly; the label listed first won)"))
    if facts.aggregation:
        rows.append(("aggregation of several annotators' labels", md(facts.aggregation)))
    if facts.split:
        rows.append(("held-out split", md(facts.split)))
    if facts.items is None:
        rows.append(("items, annotators", "not recorded for this run"))
    return [*out, *_table(("", "count"), rows), ""]


def _training(facts: CardFacts) -> list[str]:
    kind = "a LoRA adapter (peft)" if facts.kind == "lora" else "a full fine-tune"
    base = code(facts.base_model) if facts.base_model else md(facts.base_model_note or "a local model")
    out = ["## Training", "", f"Trainer {code(facts.trainer)} of Potato: {kind} of {base}, one classifier per schema.", ""]
    rows = [(code(k), code(v)) for k, v in sorted(facts.options.items())]
    if rows:
        out += [*_table(("option", "value"), rows), ""]
    where = [("backend type", md(facts.backend_type or "–")), ("device", md(facts.device or "–")),
             ("training took", _duration(facts.duration_s))]
    out += ["### Where it trained", "", *_table(("", ""), where), ""]
    return out


def _calibration(facts: CardFacts) -> list[str]:
    calibrated = [s for s in facts.schemas if s.calibration]
    if facts.calibrated_by is None or not calibrated:
        if facts.calibrated_later_by is not None:
            return ["## Calibration", "",
                    f"Potato run {facts.calibrated_later_by} recalibrated this model's confidences after it "
                    f"was trained; publishing run {facts.calibrated_later_by} publishes this model with that "
                    f"calibration.", ""]
        return []
    out = ["## Calibration", "",
           f"Potato run {facts.calibrated_by} (`decision-calibrate`) recalibrated the confidences; "
           f"{code(CALIBRATION_FILE)} holds the map per schema. A map changes the top label's confidence `c` to "
           "`sigmoid(a * logit(c) + b)` and never the label; it was kept only where it lowered both the "
           "held-out log-loss and the expected calibration error (ECE), judged out of fold.", ""]
    rows = []
    for s in calibrated:
        c = s.calibration
        threshold = ("–" if c.get("threshold") is None else
                     f"confidence ≥ {c['threshold']} gives {round(100 * c.get('target_precision', 0))} % precision")
        rows.append((md(s.name), md(c.get("method", "–")), "kept" if c.get("kept") else "backed out",
                     f"{_number(c.get('ece_before'))} → {_number(c.get('ece_after'))}",
                     f"{_number(c.get('log_loss_before'))} → {_number(c.get('log_loss_after'))}", threshold))
    out += [*_table(("schema", "method", "map", "ECE", "log-loss", "threshold"), rows), ""]
    return out


def _usage(facts: CardFacts, repo: str | None) -> list[str]:
    where = repo or "path/to/this/folder"
    out = ["## Use", ""]
    for s in facts.schemas:
        sub = f', subfolder="{s.folder}"' if s.folder else ""
        if facts.kind == "lora":
            code = [
                "from peft import PeftModel",
                "from transformers import AutoModelForSequenceClassification, AutoTokenizer",
                "",
                f"labels = {json.dumps(list(s.labels), ensure_ascii=False)}",
                f'base = AutoModelForSequenceClassification.from_pretrained("{facts.base_model or "<base model>"}", '
                "num_labels=len(labels), id2label=dict(enumerate(labels)), "
                "label2id={label: i for i, label in enumerate(labels)})",
                f'model = PeftModel.from_pretrained(base, "{where}"{sub})',
                f'tokenizer = AutoTokenizer.from_pretrained("{where}"{sub})',
            ]
        else:
            code = [
                "from transformers import AutoModelForSequenceClassification, AutoTokenizer",
                "",
                f'model = AutoModelForSequenceClassification.from_pretrained("{where}"{sub})',
                f'tokenizer = AutoTokenizer.from_pretrained("{where}"{sub})',
                "# model.config.id2label names the labels",
            ]
        if len(facts.schemas) > 1:
            out += [f"Schema {md(s.name)}:", ""]
        out += ["```python", *code, "```", ""]
    return out


def render_card(facts: CardFacts, repo: str | None = None) -> str:
    """The card's text; *repo* (``owner/name``) goes into the loading code (else a placeholder path)."""
    title = f"{md(facts.project)}: " if facts.project else ""
    names = ", ".join(md(s.name) for s in facts.schemas)
    when = time.strftime("%Y-%m-%d", time.gmtime(facts.finished_at)) if facts.finished_at else "–"
    lines = [
        "---",
        yaml.safe_dump(front_matter(facts), sort_keys=False, allow_unicode=True).rstrip("\n"),
        "---",
        "",
        f"# {title}{names} classifier",
        "",
        f"A text classifier trained by [Potato](https://github.com/davidjurgens/potato)'s model training on "
        f"the labels annotators gave for the schema{'s' if len(facts.schemas) > 1 else ''} {names}: "
        f"Potato run {facts.run_id}, finished {when} (UTC).",
        "",
        *_labels(facts),
        *_scores(facts),
        *_data(facts),
        *_training(facts),
        *_calibration(facts),
        *_usage(facts, repo),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"
