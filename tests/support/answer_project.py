"""A project with one schema of every answer type, its annotators' files written as Potato 2.12.1 writes them.

What 2.12.1 stores was checked against its own ``/updateinstance`` and its
page in a browser: a slider's number as text under ``<schema>:slider``, a
text box under ``<schema>:text_box``, a likert without ``labels:`` as its
point's number, spans under ``instance_id_to_span_to_value`` in both forms
2.12.1 writes (its page: id ``<schema>_<label>_<s>_<e>`` and value 1; its
``/updateinstance``: id ``<schema>_<label>___<s>_<e>`` and the covered text),
with offsets on the text its page renders.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from potato.config import ProjectConfig, Scheme
from tests.support.potato_project import make_project, project_config, user_state_dict

SENTIMENT = Scheme("sentiment", "radio", ("positive", "negative"))
TOPICS = Scheme("topics", "multiselect", ("food", "travel", "people"))
QUALITY = Scheme("quality", "likert", ("bad", "ok", "good"), size=3)
AGREE = Scheme("agree", "likert", ("1", "2", "3", "4", "5"), size=5)
SCORE = Scheme("score", "slider", (), min_value=0.0, max_value=100.0, step=5.0)
ENTITIES = Scheme("entities", "span", ("PER", "LOC"))
SUMMARY = Scheme("summary", "text", (), description="Summarize the item in one sentence.")
ALL = (SENTIMENT, TOPICS, QUALITY, AGREE, SCORE, ENTITIES, SUMMARY)


def pair(schema: str, name: str, value) -> list:
    """One entry of ``instance_id_to_label_to_value``."""
    return [{"schema": schema, "name": name}, value]


def span(schema: str, label: str, start: int, end: int, page: bool = True) -> list:
    """A span as 2.12.1's page stores it (page) or as its /updateinstance does."""
    if page:
        return [{"schema": schema, "name": label, "title": label, "start": start, "end": end,
                 "id": f"{schema}_{label}_{start}_{end}"}, 1]
    return [{"schema": schema, "name": label, "title": label, "start": start, "end": end,
             "id": f"{schema}_{label}___{start}_{end}"}, "covered text"]


def write_state(directory: Path, user: str, entries: dict, spans: dict | None = None) -> None:
    """``<directory>/<user>/user_state.json`` with *entries* (item -> pairs) and *spans* (item -> spans)."""
    state = user_state_dict(user, {})
    state["instance_id_ordering"] = list(entries)
    state["instance_id_to_label_to_value"] = entries
    state["instance_id_to_span_to_value"] = spans or {}
    path = directory / user / "user_state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=2, ensure_ascii=False), encoding="utf-8")


TEXTS = {
    "i0": "Alice met Bob in Paris.",
    "i1": "  Tom  &amp; Jerry <b>love</b>   cheese &lt;3 — café 😀 ok  ",
    "i2": "Plain text, nobody answered.",
    "i3": "  Caf&eacute; <i>Zoë</i>   met   Ann in  Zürich 😀 ",  # nobody answered; 2.12 renders it otherwise
}


def bundle_project(tmp_path: Path) -> ProjectConfig:
    """A project of ``TEXTS`` with every schema of ``ALL``, annotated by alice and bob (carol saved nothing)."""
    make_project(tmp_path, n_items=0)
    config = project_config(tmp_path / "config.yaml")
    data = tmp_path / "items.jsonl"
    data.write_text("".join(json.dumps({"id": k, "text": v}, ensure_ascii=False) + "\n" for k, v in TEXTS.items()),
                    encoding="utf-8")
    config = replace(config, schemes=ALL, data_files=(data,))
    out = config.output_annotation_dir
    # On i1, 2.12.1 renders "Tom & Jerry love cheese <3 — café 😀 ok": Jerry is 6-11, ok (after the emoji) 36-38.
    write_state(out, "alice", {
        "i0": [pair("topics", "people", "people"), pair("agree", "4", "4"), pair("score", "slider", "35"),
               pair("summary", "text_box", "Two people meet.")],
        "i1": [pair("sentiment", "positive", "positive"), pair("topics", "food", "food")],
    }, {"i0": [span("entities", "PER", 0, 5), span("entities", "PER", 10, 13), span("entities", "LOC", 17, 22)],
        "i1": [span("entities", "PER", 6, 11), span("entities", "LOC", 36, 38)]})
    write_state(out, "bob", {"i0": [pair("topics", "people", "people"), pair("agree", "5", "5"),
                                    pair("score", "slider", "45")]},
                {"i0": [span("entities", "PER", 0, 5, page=False), span("entities", "LOC", 17, 22, page=False)],
                 "i1": [span("entities", "PER", 6, 11, page=False)]})
    return config


