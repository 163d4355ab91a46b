"""The model card: ``README.md`` with the Hub's YAML front matter, rendered from a run's facts (pure).

What the card says, and what it never says: the labels per schema, the
holdout scores and confusion matrices, what the model learned from **in
counts only** (items, labelled items, annotators, labels per class,
aggregation, the split), the trainer and its options, where it trained
(backend type and device, not the host) and how long, the run id and date.
No annotator name, no item text, no item id and no path of this server
appears: ``facts`` hands over counts and names of labels, never records.
The holdout scores are in the front matter's ``model-index`` too, where the
Hub shows them as the model's evaluation results.

Every value that comes from a config or a run is escaped for Markdown (a
label may hold ``|``), and the front matter is written by ``yaml.safe_dump``.

What the model is decides its metadata and the code that loads it
(``MODELS``): an encoder classifier (``hf-text-classification``) loads with
``AutoModelForSequenceClassification``, a span tagger (``hf-span-tagging``)
with ``AutoModelForTokenClassification``, an LLM's LoRA adapter
(``hf-llm-finetune``) with peft's ``AutoPeftModelForCausalLM`` on the base
model it names (``library_name: peft``, ``base_model``), a merged LLM with
``AutoModelForCausalLM``, a reward model (``hf-reward-model``) with
``AutoModelForSequenceClassification`` and the lines that score a response
and turn two scores into a preference, a ``sklearn-text`` model from its
pickle. The
card's metadata is what ``huggingface_hub.ModelCard`` reads.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import yaml

from potato.text.markdown_text import code, md, table
from potato.training.trainers import llm_preference, pooling
from potato.training.trainers.hf_reward_model import RANKING_SCORE_MEANING, SCORE_MEANING, TUPLE_SCORE_MEANING

PIPELINE_TAG = "text-classification"
CARD_FILE = "README.md"
SKLEARN_MODEL = "model.pkl"


@dataclass(frozen=True)
class ModelKind:
    """What one trainer's model is on the Hub: its pipeline tag, the transformers class that loads it (None:
    not a transformers model), and what the card calls it."""

    pipeline_tag: str
    auto_class: str | None
    noun: str


# Per trainer; a trainer not listed is an encoder classifier.
MODELS = {
    "hf-text-classification": ModelKind("text-classification", "AutoModelForSequenceClassification", "classifier"),
    "hf-span-tagging": ModelKind("token-classification", "AutoModelForTokenClassification", "span tagger"),
    "hf-llm-finetune": ModelKind("text-generation", "AutoModelForCausalLM", "language model"),
    "hf-reward-model": ModelKind("text-classification", "AutoModelForSequenceClassification", "reward model"),
    "sklearn-text": ModelKind("text-classification", None, "classifier"),
}


def model_kind(trainer: str | None) -> ModelKind:
    return MODELS.get(trainer or "", MODELS["hf-text-classification"])
CALIBRATION_FILE = "calibration.json"


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
    trainer: str | None = None         # the trainer of this schema's model (a run may have several)
    head: Sequence[str] | None = None  # the model's output labels when they are not the labels (a span tagger's tags)
    vectorizer: str | None = None      # sklearn-text: its sentence-transformers model (None: a vectorizer in the pickle)
    mean_pooled: bool = False          # a head on the mean of the token states, not a transformers class's


@dataclass(frozen=True)
class CardFacts:
    """Everything the card says (``facts.card_facts`` gathers it)."""

    project: str
    run_id: int
    trainer: str
    kind: str                          # "full", "lora", "merged" (an LLM's adapter merged in) or "sklearn"
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


def _number(value: Any) -> str:
    return "–" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = round(seconds)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s" if s < 3600 else f"{s // 3600} h {s % 3600 // 60:02d} min"


def _kinds(facts: CardFacts) -> list[ModelKind]:
    return [model_kind(s.trainer or facts.trainer) for s in facts.schemas]


# The dataset every result is on, as the Hub's model-index names one: the project's labels, its held-out share.
HOLDOUT_DATASET = "potato-project"


def _metrics(scores: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A schema's holdout numbers as model-index metrics (its counts and nested tables left out)."""
    return [{"type": key, "value": value, "name": f"holdout {key.replace('_', '-')}"}
            for key, value in scores.items()
            if key not in ("n", "kind") and isinstance(value, (int, float)) and not isinstance(value, bool)]


def model_index(facts: CardFacts, repo: str | None) -> list[dict[str, Any]]:
    """The card's ``model-index``: per schema with holdout scores, its task, the project's held-out items as
    the dataset and the scores as metrics — what the Hub shows as evaluation results ([] when none)."""
    results = [{"task": {"type": model_kind(s.trainer or facts.trainer).pipeline_tag, "name": s.name},
                "dataset": {"type": HOLDOUT_DATASET, "name": facts.project or "Potato project", "split": "holdout"},
                "metrics": _metrics(s.scores)}
               for s in facts.schemas if _metrics(s.scores)]
    if not results:
        return []
    return [{"name": (repo or "").rpartition("/")[2] or f"potato-run-{facts.run_id}", "results": results}]


def front_matter(facts: CardFacts, repo: str | None = None) -> dict[str, Any]:
    library = {"lora": "peft", "sklearn": "sklearn"}.get(facts.kind, "transformers")
    meta: dict[str, Any] = {"library_name": library}
    if facts.base_model and facts.kind != "sklearn":
        meta["base_model"] = facts.base_model
    tags = list(dict.fromkeys(k.pipeline_tag for k in _kinds(facts)))
    if len(tags) == 1:
        meta["pipeline_tag"] = tags[0]
    if facts.license:
        meta["license"] = facts.license
    trainers = list(dict.fromkeys([facts.trainer, *(s.trainer for s in facts.schemas if s.trainer)]))
    meta["tags"] = ["potato", *trainers, *tags] + (["lora"] if facts.kind == "lora" else [])
    index = model_index(facts, repo)
    if index:
        meta["model-index"] = index
    return meta


def _labels(facts: CardFacts) -> list[str]:
    rows = [(md(s.name), ", ".join(code(label) for label in s.labels),
             code(f"{s.folder}/") if s.folder else "the repo's root") for s in facts.schemas]
    return ["## Labels", "", *table(("schema", "labels (in the model's order)", "model"), rows), ""]


def _scores(facts: CardFacts) -> list[str]:
    out = ["## Holdout scores", "",
           "Scored on labelled items held out of training (never trained on).", ""]
    rows = [(md(s.name), _number(s.scores.get("n", s.held_out)), _number(s.scores.get("accuracy")),
             _number(s.scores.get("macro_f1"))) for s in facts.schemas]
    out += [*table(("schema", "held-out items", "accuracy", "macro-F1"), rows), ""]
    for s in facts.schemas:
        if s.scores.get("kind") == "comparison":
            dpo = (s.trainer or facts.trainer) == "hf-llm-finetune"
            before = s.scores.get("agreement_before")
            out += [f"{md(s.name)}: prefers the annotators' majority on {_number(s.scores.get('agreement'))} of "
                    f"{_number(s.scores.get('decided'))} held-out comparisons with one; agrees with "
                    f"{_number(s.scores.get('annotator_agreement'))} of each annotator's choices."
                    + (f" Before training, the base model preferred the majority's response on {_number(before)}."
                       if before is not None else "")
                    + f" Its score: {llm_preference.SCORE_MEANING if dpo else SCORE_MEANING}.", ""]
        if s.scores.get("kind") == "best_worst":
            out += [f"{md(s.name)}: picks the annotators' best on {_number(s.scores.get('best_agreement'))} and "
                    f"their worst on {_number(s.scores.get('worst_agreement'))} of {_number(s.scores.get('n'))} "
                    f"held-out tuples; agrees with {_number(s.scores.get('annotator_agreement'))} of each "
                    f"annotator's picks. Its score: {TUPLE_SCORE_MEANING}.", ""]
        if s.scores.get("kind") == "ranking":
            base = s.scores.get("baseline_agreement")
            out += [f"{md(s.name)}: orders {_number(s.scores.get('agreement'))} of the pairs in held-out annotators' "
                    f"orders as they did, over {_number(s.scores.get('n'))} held-out items"
                    + (f" (one order for every item, the training answers' own, orders {_number(base)})"
                       if base is not None else "")
                    + f"; Kendall's tau with their Borda count {_number(s.scores.get('kendall_tau'))}. "
                    f"Its score: {RANKING_SCORE_MEANING}.", ""]
        if not s.confusion:
            continue
        out += [f"### Confusion matrix: {md(s.name)}", "",
                "Rows: the annotators' label; columns: the model's.", ""]
        out += table(("", *(f"**{md(label)}**" for label in s.labels)),
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
    return [*out, *table(("", "count"), rows), ""]


def _training(facts: CardFacts) -> list[str]:
    nouns = list(dict.fromkeys(k.noun for k in _kinds(facts)))
    base = code(facts.base_model) if facts.base_model else md(facts.base_model_note or "a local model")
    if facts.kind == "sklearn":
        what = (f"a scikit-learn model ({code(SKLEARN_MODEL)}: its vectorizer and classifier), one "
                f"{' or '.join(nouns)} per schema")
    else:
        kind = {"lora": "a LoRA adapter (peft)", "merged": "a LoRA fine-tune, merged into its base model,"}.get(
            facts.kind, "a full fine-tune")
        what = f"{kind} of {base}, one {' or '.join(nouns)} per schema"
    out = ["## Training", "", f"Trainer {code(facts.trainer)} of Potato: {what}.", ""]
    if facts.trainer == "hf-llm-finetune":
        out += [md(llm_preference.objective_words(facts.options)), ""]
    rows = [(code(k), code(v)) for k, v in sorted(facts.options.items())]
    if rows:
        out += [*table(("option", "value"), rows), ""]
    where = [("backend type", md(facts.backend_type or "–")), ("device", md(facts.device or "–")),
             ("training took", _duration(facts.duration_s))]
    out += ["### Where it trained", "", *table(("", ""), where), ""]
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
    out += [*table(("schema", "method", "map", "ECE", "log-loss", "threshold"), rows), ""]
    return out


def _loading_code(facts: CardFacts, s: SchemaFacts, where: str) -> list[str]:
    """The Python that loads schema *s*'s model from *where* (a Hub repo, or a folder)."""
    sub = f', subfolder="{s.folder}"' if s.folder else ""
    kind = model_kind(s.trainer or facts.trainer)
    if facts.kind == "sklearn":
        features = f'SentenceTransformer("{s.vectorizer}").encode(texts)' if s.vectorizer else "texts"
        return [
            "import json, pickle",
            "",
            "from huggingface_hub import hf_hub_download",
            *(["from sentence_transformers import SentenceTransformer"] if features != "texts" else []),
            "",
            f"# {SKLEARN_MODEL} is a pickle: loading it runs what it holds, so load only a repo you trust",
            f'with open(hf_hub_download("{where}", "{SKLEARN_MODEL}"{sub}), "rb") as f:',
            "    model = pickle.load(f)",
            f'with open(hf_hub_download("{where}", "labels.json"{sub}), encoding="utf-8") as f:',
            '    labels = json.load(f)["labels"]',
            'texts = ["a text to label"]',
            f"probabilities = model.predict_proba({features})  # one column per label, in the order of labels",
        ]
    if kind.auto_class == "AutoModelForCausalLM":
        if facts.kind == "lora":
            return [
                "from peft import AutoPeftModelForCausalLM",
                "from transformers import AutoTokenizer",
                "",
                f"# the adapter and, from the Hub, its base model {facts.base_model or '<base model>'}",
                f'model = AutoPeftModelForCausalLM.from_pretrained("{where}"{sub})',
                f'tokenizer = AutoTokenizer.from_pretrained("{where}"{sub})',
                "# labels.json holds the prompt it was trained with (prompt_template) and its labels",
            ]
        return [
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'model = AutoModelForCausalLM.from_pretrained("{where}"{sub})',
            f'tokenizer = AutoTokenizer.from_pretrained("{where}"{sub})',
            "# labels.json holds the prompt it was trained with (prompt_template) and its labels",
        ]
    if kind is MODELS["hf-reward-model"]:
        return _reward_loading_code(facts, where, sub)
    if s.mean_pooled:  # no transformers class holds this head: the card shows the few lines that apply it
        return pooling.usage_lines(where, sub, facts.base_model, facts.kind == "lora", list(s.labels))
    auto = kind.auto_class or "AutoModelForSequenceClassification"
    if facts.kind == "lora":
        head = list(s.head or s.labels)
        return [
            "from peft import PeftModel",
            f"from transformers import {auto}, AutoTokenizer",
            "",
            f"labels = {json.dumps(head, ensure_ascii=False)}",
            f'base = {auto}.from_pretrained("{facts.base_model or "<base model>"}", '
            "num_labels=len(labels), id2label=dict(enumerate(labels)), "
            "label2id={label: i for i, label in enumerate(labels)})",
            f'model = PeftModel.from_pretrained(base, "{where}"{sub})',
            f'tokenizer = AutoTokenizer.from_pretrained("{where}"{sub})',
        ]
    return [
        f"from transformers import {auto}, AutoTokenizer",
        "",
        f'model = {auto}.from_pretrained("{where}"{sub})',
        f'tokenizer = AutoTokenizer.from_pretrained("{where}"{sub})',
        "# model.config.id2label names the labels",
    ]


def _reward_loading_code(facts: CardFacts, where: str, sub: str) -> list[str]:
    """A reward model's loading code: one output, the score of ``(prompt, response)``."""
    if facts.kind == "lora":
        load = ["from peft import PeftModel",
                f'base = AutoModelForSequenceClassification.from_pretrained("{facts.base_model or "<base model>"}", '
                "num_labels=1)",
                f'model = PeftModel.from_pretrained(base, "{where}"{sub}).eval()']
    else:
        load = [f'model = AutoModelForSequenceClassification.from_pretrained("{where}"{sub}).eval()']
    return [
        "import math",
        "",
        "import torch",
        "from transformers import AutoModelForSequenceClassification, AutoTokenizer",
        "",
        *load,
        f'tokenizer = AutoTokenizer.from_pretrained("{where}"{sub})',
        "",
        "def reward(prompt, response):",
        "    batch = tokenizer(prompt, response, truncation=True, return_tensors=\"pt\")",
        "    with torch.no_grad():",
        "        return model(**batch).logits[0, 0].item()",
        "",
        "def prefers_b(prompt, a, b):  # the probability that annotators prefer response b",
        "    return 1 / (1 + math.exp(reward(prompt, a) - reward(prompt, b)))",
    ]


def _usage(facts: CardFacts, repo: str | None) -> list[str]:
    where = repo or "path/to/this/folder"
    out = ["## Use", ""]
    for s in facts.schemas:
        code = _loading_code(facts, s, where)
        if len(facts.schemas) > 1:
            out += [f"Schema {md(s.name)}:", ""]
        out += ["```python", *code, "```", ""]
    return out


def render_card(facts: CardFacts, repo: str | None = None) -> str:
    """The card's text; *repo* (``owner/name``) goes into the loading code (else a placeholder path)."""
    title = f"{md(facts.project)}: " if facts.project else ""
    names = ", ".join(md(s.name) for s in facts.schemas)
    when = time.strftime("%Y-%m-%d", time.gmtime(facts.finished_at)) if facts.finished_at else "–"
    nouns = list(dict.fromkeys(k.noun for k in _kinds(facts)))
    noun = nouns[0] if len(nouns) == 1 else "model"
    lines = [
        "---",
        yaml.safe_dump(front_matter(facts, repo), sort_keys=False, allow_unicode=True).rstrip("\n"),
        "---",
        "",
        f"# {title}{names} {noun}",
        "",
        f"A text {noun} trained by [Potato](https://github.com/davidjurgens/potato)'s model training on "
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
