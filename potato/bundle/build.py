"""The flow's build-bundle step: the items, the annotators' answers and the holdout split as one directory.

The bundle joins three readers: the items (``potato.items.read``), the
annotators' answers (``potato.annotations``) and the holdout split
(``potato.bundle.holdout``). Nothing here changes the project's files; media
a record names inside ``task_dir`` is copied to ``media/<same relative path>``.

Speed (the target: 1 M items, 1.5 M label entries in 3 annotators' files, in
4 s; ``bench/bundle_bench.py``). What costs is per-entry Python, and even
more, touching 500 k-entry dicts: 150-350 ns an operation, cache misses
whether the loop is in C or Python. So the hot paths run as C-level passes
(``map``, ``compress``, ``dict.update``, ``b"".join``) over batches and
touch each big dict once per entry, and the common case never builds a
per-entry object it can skip (the labels' part: ``potato.annotations.labels``):
a block of plain JSON lines (``potato.items.read``) is written whole
(``_block_lines``), and each labelled item's outcome (labels, held out) is a
few shared bytes objects computed in bulk (``_label_outcomes``). Anything
else goes the plain way, one item at a time, so what is accepted, every
error and warning stay as they were.
"""

from __future__ import annotations

import gc
import shutil
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import add, mul
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, NamedTuple, Sequence

import orjson

from potato.annotations.aggregation import Coded, aggregate
from potato.annotations.annotator_answers import AnswersBeside, needs_answers
from potato.annotations.labels import describe_not_items, drop_not_items, read_votes, read_votes_on
from potato.bundle.holdout import holdout_rule
from potato.config import ProjectConfig, Scheme
from potato.errors import ProjectDataError
from potato.items.bws_tuples import tuple_texts
from potato.items.data_warnings import GroupedWarnings, show_path
from potato.items.json_lines import dump_line
from potato.items.ranking_texts import ranking_texts
from potato.items.read import Block, Item, claim_ids, first_use, item_ids, item_parts, looks_like_media, media_path
from potato.items.rendered_text import DISPLAYED_TEXT_FIELD, renders_raw_text, spans_to_raw
from potato.scheme_fields import answer_spec
from potato.training import atomic_files
from potato.training.answer_kinds import (
    BEST,
    BEST_WORST,
    COMPARISON,
    CONTINUOUS,
    MULTILABEL,
    NOMINAL,
    ORDINAL,
    RANKING,
    SPAN,
    TEXT,
    TIE,
    UNSUPPORTED,
    borda_order,
    majority_side,
    most_picked,
)
from potato.training.escaping import json_bytes, quote

BUNDLE_FORMAT = 1


@dataclass(frozen=True)
class BundleInfo:
    """What ``build_bundle`` wrote, for the run log and the manifest."""

    bundle_dir: Path
    items: int
    labeled: dict[str, int]
    holdout: dict[str, int]
    ties: dict[str, int]
    label_counts: dict[str, dict[str, int]]
    users: tuple[str, ...]
    media_files: int
    unknown_item_labels: int
    skipped_annotations: int
    warnings: tuple[str, ...]
    # aggregation consensus: per schema, the items Dawid-Skene labelled otherwise than majority vote.
    changed_by_consensus: dict[str, int] | None = None
    # What each schema's answers are, beyond label counts (continuous: their range; text: how many).
    details: dict[str, str] = field(default_factory=dict)


def describe_bundle(info: BundleInfo) -> str:
    """One line for the run log: what the run trains on."""
    def labels(schema: str) -> str:
        if schema in info.details:
            return info.details[schema]
        return ", ".join(f"{label} {n}" for label, n in info.label_counts.get(schema, {}).items())

    per_schema = "; ".join(
        f"{schema}: {count} labelled ({labels(schema)}; {info.holdout.get(schema, 0)} held out, "
        f"{info.ties.get(schema, 0)} ties)"
        for schema, count in info.labeled.items()
    )
    annotators = f"{len(info.users)} annotator{'s' if len(info.users) != 1 else ''}"
    line = f"Bundle: {info.items} items from {annotators}; {per_schema}"
    if info.changed_by_consensus is not None:
        changed = ", ".join(f"{n} of {schema}" for schema, n in info.changed_by_consensus.items())
        line += f"; consensus (Dawid-Skene) labelled items otherwise than majority vote: {changed}"
    return line


# Kinds whose answers are labels of the schema: they need labels, and their votes are counted by potato.annotations.labels.
LABEL_KINDS = (NOMINAL, ORDINAL, MULTILABEL, SPAN, COMPARISON, BEST_WORST, RANKING)
_VOTED_KINDS = (NOMINAL, ORDINAL, MULTILABEL)


def _resolve_schemes(config: ProjectConfig, schemas: Sequence[str]) -> list[Scheme]:
    known = [s.name for s in config.schemes]
    out = []
    for name in schemas:
        scheme = config.scheme(name)
        if scheme is None:
            raise ProjectDataError(
                f"{show_path(config.path, config.task_dir)}: no annotation scheme named {name!r}; "
                f"the config has {known!r}"
            )
        if scheme.kind == UNSUPPORTED:
            raise ProjectDataError(
                f"{show_path(config.path, config.task_dir)}: annotation scheme {name!r} "
                f"({scheme.annotation_type or 'no annotation_type'}) collects answers no trainer trains "
                f"(docs/answer-types.md lists the types that train)"
            )
        if scheme.kind in LABEL_KINDS and not scheme.labels:
            raise ProjectDataError(
                f"{show_path(config.path, config.task_dir)}: annotation scheme {name!r} "
                f"({scheme.annotation_type}) has no labels, so a classifier cannot be trained on it"
            )
        out.append(scheme)
    if not out:
        raise ProjectDataError("no schemas to train: name at least one annotation scheme")
    return out


def build_bundle(
    config: ProjectConfig,
    schemas: Sequence[str],
    dest_dir: str | Path,
    *,
    holdout_fraction: float | None = None,
) -> BundleInfo:
    """Write the run bundle for *schemas* into *dest_dir* (docs/architecture.md).

    Streams the data files once: memory holds the labels (small ints per
    labelled item) and a set of item ids, never all items.

    Raises ``ProjectDataError`` for unreadable data files, malformed JSON,
    missing id/text, duplicate ids, unknown schema names and media paths outside
    ``task_dir``. Label problems become warnings in the returned ``BundleInfo``.
    """
    with _gc_paused():
        return _build_bundle(config, schemas, Path(dest_dir), holdout_fraction)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: a bundle allocates millions of short-lived
    containers and no cycles, and the collections they trigger cost half its time
    (measured: 4 MB of user_state parsed in 40 ms with it, 18 ms without)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _build_bundle(config: ProjectConfig, schemas: Sequence[str], dest: Path,
                  holdout_fraction: float | None) -> BundleInfo:
    schemes = _resolve_schemes(config, schemas)
    held_out, split = holdout_rule(config, holdout_fraction)
    dest.mkdir(parents=True, exist_ok=True)
    # A rebuilt bundle must not carry media an earlier build copied.
    shutil.rmtree(dest / "media", ignore_errors=True)
    base = config.task_dir

    consensus = config.model_training.aggregation == "consensus"
    voted = [s for s in schemes if s.kind in _VOTED_KINDS]
    # One pass over each annotator's file: the votes, and the other answers beside them.
    beside = AnswersBeside(schemes, per_user=consensus) if needs_answers(schemes) else None
    votes = read_votes(config.output_annotation_dir, voted, base, per_user=consensus, beside=beside)
    answers = beside.answers() if beside is not None else None
    # Dawid-Skene weighs each annotator by all their labels: labels on ids that are not
    # items (planted, say) must not count, so the items' ids are read first.
    not_items = drop_not_items(votes, item_ids(config)) if consensus else {}
    aggregated = aggregate(votes, answers, schemes, consensus)
    votes.votes.clear()  # the aggregated answers are all we need from here
    votes.by_user.clear()
    warnings = list(votes.warnings) + (answers.warnings if answers is not None else [])
    answers = None
    # Popped as items are written: what is left are labels for ids the data lacks.
    rich_ids = set().union(*aggregated.rich.values())
    outcome_of, outcomes = _label_outcomes(aggregated.coded, held_out, rich_ids)
    for coded in aggregated.coded.values():
        coded.per_item.clear()

    skipped_items = GroupedWarnings()
    with atomic_files.replacing(dest / "items.jsonl") as out:
        writer = _ItemsWriter(config, dest, out, outcome_of, outcomes, skipped_items,
                              _RichAnswers(config, schemes, aggregated.rich, rich_ids))
        for part in item_parts(config, skipped_items):
            writer.write(part)

    # What is left are answers on ids that are not items: majority vote learns which only now, and
    # reads the annotators' labels on them again to name who gave them (consensus dropped them before):
    # the one case a bundle reads a file twice, and only when the data lacks ids annotators labelled.
    left = set(outcome_of).union(*aggregated.rich.values())
    if outcome_of and voted and not consensus:
        not_items = read_votes_on(config.output_annotation_dir, voted, set(outcome_of))
    unknown_ids = len(left.union(*(per_item for per_schema in not_items.values() for per_item in per_schema.values())))
    warnings.extend(describe_not_items(not_items, {s.name: s.labels for s in voted}, config.output_annotation_dir,
                                       base))
    warnings.extend(skipped_items.render(lambda key, listed: f"{key[0]}: " + key[1].replace("{listed}", listed)))
    warnings.extend(
        writer.missing_media.render(
            lambda key, listed: (
                f"{key[0]}: field {key[1]!r} of item(s) {listed} names a media file that does "
                f"not exist under task_dir; left out of the bundle"
            )
        )
    )

    names = [s.name for s in schemes]
    kinds = {s.name: s.kind for s in schemes}
    labels_of = {s.name: s.labels for s in schemes}
    labeled = {n: 0 for n in names}
    holdout = {n: 0 for n in names}
    per_label = {s.name: dict.fromkeys((*s.labels, TIE) if s.kind in (COMPARISON, BEST_WORST, RANKING) else s.labels,
                                       0) for s in schemes}
    numbers: dict[str, list[tuple[float, int]]] = {}  # continuous: (answer, items with it)
    for outcome_json, n in writer.written.items():
        outcome = outcomes[outcome_json]
        for schema, answer in outcome.labels.items():
            labeled[schema] += n
            if kinds[schema] == MULTILABEL:
                for label in answer:
                    per_label[schema][label] += n
            elif kinds[schema] == CONTINUOUS:
                numbers.setdefault(schema, []).append((answer, n))
            elif kinds[schema] == COMPARISON:  # items by the side their majority preferred
                per_label[schema][majority_side(answer)] += n
            elif kinds[schema] == BEST_WORST:  # tuples by the position most picked as the best
                per_label[schema][most_picked(answer[BEST])] += n
            elif kinds[schema] == RANKING:  # items by the label their Borda count puts first
                per_label[schema][borda_order(answer, labels_of[schema])[1]] += n
            else:
                per_label[schema][answer] += n
            if outcome.holdout:
                holdout[schema] += n
    writer.rich.add_counts(labeled, holdout, per_label)
    details = {schema: _describe_numbers(numbers.get(schema, [])) for schema in names if kinds[schema] == CONTINUOUS}
    details.update({schema: _answers_count(writer.rich.answers.get(schema, 0)) for schema in names
                    if kinds[schema] == TEXT})
    warnings.extend(writer.rich.warnings())
    counts = {
        "items": sum(writer.written.values()),
        "labeled": labeled,
        "holdout": holdout,
        "ties": {n: aggregated.ties[n] for n in names},
        "labels": per_label,
    }
    manifest = {
        "format": BUNDLE_FORMAT,
        "schemas": {s.name: list(s.labels) if s.kind in LABEL_KINDS else [] for s in schemes},
        "answers": {s.name: answer_spec(s) for s in schemes},
        "id_key": config.id_key,
        "text_key": config.text_key,
        **split,
        "aggregation": config.model_training.aggregation,
        "counts": counts,
    }
    atomic_files.write_bytes(dest / "manifest.json", json_bytes(manifest, indent=2) + b"\n")

    return BundleInfo(
        bundle_dir=dest,
        items=counts["items"],
        labeled=labeled,
        holdout=holdout,
        ties=counts["ties"],
        label_counts=per_label,
        users=tuple(votes.users),
        media_files=len(writer.copied),
        unknown_item_labels=unknown_ids,
        skipped_annotations=votes.skipped_annotations,
        warnings=tuple(warnings),
        changed_by_consensus=aggregated.changed_by_consensus,
        details=details,
    )


def _answers_count(n: int) -> str:
    return "1 answer" if n == 1 else f"{n} answers"


def _describe_numbers(pairs: list[tuple[float, int]]) -> str:
    """``from 5 to 95, mean 42.5``: a continuous schema's answers in the run log."""
    if not pairs:
        return "no answers"
    total = sum(n for _, n in pairs)
    mean = sum(value * n for value, n in pairs) / total
    return f"from {min(v for v, _ in pairs):g} to {max(v for v, _ in pairs):g}, mean {mean:.4g}"


class _RichAnswers:
    """The answers items.jsonl takes one by one (spans, text): looked up as each item is written.

    Spans arrive on 2.12's rendered text and leave on the item's own text
    (``potato.items.rendered_text``), which only the item being written has.
    """

    def __init__(self, config: ProjectConfig, schemes: Sequence[Scheme], rich: dict[str, dict[str, Any]],
                 ids: set[str]):
        self.ids = ids
        self.rich = rich
        self.kinds = {s.name: s.kind for s in schemes}
        self.highlight_linebreaks = bool(config.raw.get("highlight_linebreaks", False))
        self.text_key = config.text_key
        self.spans = SPAN in self.kinds.values()
        # Every item of a run with a comparison carries its two responses (prediction needs them all),
        # every tuple its texts, every item of a ranking the text of each of its labels.
        self.compared = {s.name: s.items_key for s in schemes if s.kind == COMPARISON}
        self.tupled = {s.name: len(s.labels) for s in schemes if s.kind == BEST_WORST}
        self.ranked = {s.name: s.labels for s in schemes if s.kind == RANKING}
        self.no_sides = GroupedWarnings()
        self.counted: dict[str, list[int]] = {}  # schema -> [labelled, held out]
        self.per_label: dict[str, Counter[str]] = {}
        self.answers: dict[str, int] = {}
        self.unrendered = GroupedWarnings()

    def labels_of(self, item: Item, holdout: bool) -> dict[str, Any]:
        """The item's span and text answers, as items.jsonl holds them."""
        out: dict[str, Any] = {}
        for schema, per_item in self.rich.items():
            answer = per_item.pop(item.id, None)
            if answer is None:
                continue
            if self.kinds[schema] == SPAN:
                if not renders_raw_text(item.fields, self.text_key):
                    if answer:
                        self.unrendered.add((schema,), item.id)
                    continue
                answer = spans_to_raw(item.text, answer, self.highlight_linebreaks)
                self.per_label.setdefault(schema, Counter()).update(span["label"] for span in answer)
            else:
                self.answers[schema] = self.answers.get(schema, 0) + len(answer)
            counted = self.counted.setdefault(schema, [0, 0])
            counted[0] += 1
            counted[1] += holdout
            out[schema] = answer
        return out

    def needs_lines(self, block: Block) -> bool:
        """Whether *block* must be written item by item: it holds rich answers, or (a run with spans) an
        item 2.12 shows from ``displayed_text``, which items.jsonl marks."""
        if self.compared or self.tupled or self.ranked or (self.ids and not self.ids.isdisjoint(block.ids)):
            return True
        return self.spans and any(map(dict.__contains__, block.records, repeat(DISPLAYED_TEXT_FIELD)))

    def add_counts(self, labeled: dict[str, int], holdout: dict[str, int], per_label: dict[str, dict[str, int]]) -> None:
        for schema, (n, held) in self.counted.items():
            labeled[schema] += n
            holdout[schema] += held
        for schema, counts in self.per_label.items():
            for label, n in counts.items():
                per_label[schema][label] += n

    def sides_of(self, item: Item) -> tuple[dict[str, list[str]], dict[str, str]]:
        """``(sides, prompts)``: each comparison's two responses in *item* (its ``items_key`` field, a list of
        two texts), each best–worst schema's texts of the tuple in position order, each ranking's text of each
        label (``potato.items.ranking_texts``); and each ranking's prompt where it is not the item's text."""
        out, prompts = {}, {}
        for schema, labels in self.ranked.items():
            found = ranking_texts(item.fields, item.text, labels)
            out[schema] = found.texts
            if found.prompt != item.text:
                prompts[schema] = found.prompt
        for schema, size in self.tupled.items():
            texts = tuple_texts(item.fields, size)
            if texts is not None:
                out[schema] = texts
        for schema, key in self.compared.items():
            sides = item.fields.get(key)
            if isinstance(sides, list) and len(sides) == 2 and all(isinstance(side, str) for side in sides):
                out[schema] = sides
            else:
                self.no_sides.add((schema, key), item.id)
        return out, prompts

    def warnings(self) -> list[str]:
        return self.no_sides.render(lambda key, listed: (
            f"item(s) {listed} have no two responses to compare for schema {key[0]!r}: their field {key[1]!r} "
            f"is not a list of two texts (the schema's items_key); no comparison of them is trained or predicted"
        )) + self.unrendered.render(lambda key, listed: (
            f"span answers of schema {key[0]!r} on item(s) {listed} were left out: Potato 2.12 shows those "
            f"items from a list, a mapping or a displayed_text field, and their spans' offsets count that "
            f"text, not the item's {self.text_key!r}"))


class _ItemsWriter:
    """Writes items.jsonl: a clean block (``Block``) in C-level passes, any other item
    alone, as before; counts the outcomes written and copies media."""

    def __init__(self, config: ProjectConfig, dest: Path, out: BinaryIO, outcome_of: dict[str, bytes],
                 outcomes: dict[bytes, _Outcome], skipped: GroupedWarnings, rich: _RichAnswers) -> None:
        self.config, self.dest, self.out = config, dest, out
        self.rich = rich
        self.outcome_of, self.outcomes = outcome_of, outcomes
        self.skipped = skipped
        self.written: Counter[bytes] = Counter()  # outcome JSON -> items written with it
        self.seen: set[str] = set()
        self.copied: set[Path] = set()
        self.missing_media = GroupedWarnings()

    def write(self, part: Item | Block) -> None:
        if (type(part) is Block and not part.may_name_media and not self.rich.needs_lines(part)
                and claim_ids(self.seen, part.ids)):
            self.out.write(_block_lines(part, self.outcome_of, self.written))
            return
        for item in part.items() if type(part) is Block else (part,):
            if first_use(self.config, item, self.seen, self.skipped):
                self.out.write(self._line(item))

    def _line(self, item: Item) -> bytes:
        config = self.config
        outcome_json = self.outcome_of.pop(item.id, _UNLABELLED)
        self.written[outcome_json] += 1
        outcome = self.outcomes[outcome_json]
        record = {"id": item.id, "text": item.text, "labels": outcome.labels, "holdout": outcome.holdout}
        if item.id in self.rich.ids:
            record["labels"] = {**outcome.labels, **self.rich.labels_of(item, outcome.holdout)}
        if self.rich.compared or self.rich.tupled or self.rich.ranked:
            sides, prompts = self.rich.sides_of(item)
            if sides:
                record["sides"] = sides
            if prompts:
                record["prompts"] = prompts
        if self.rich.spans and not renders_raw_text(item.fields, config.text_key):
            record["span_offsets"] = False  # 2.12 shows another text: span offsets cannot be moved to it
        media_fields = _media_fields(item, config.task_dir, config, self.missing_media)
        if media_fields:
            for rel in media_fields.values():
                if rel not in self.copied:
                    target = self.dest / "media" / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(config.task_dir / rel, target)
                    self.copied.add(rel)
            record["fields"] = {k: v.as_posix() for k, v in media_fields.items()}
        return dump_line(record)


class _Outcome(NamedTuple):
    """What items.jsonl says of an item besides its id and text."""

    labels: dict[str, Any]
    holdout: bool


def _outcome_json(outcome: _Outcome) -> bytes:
    """``"labels":{...},"holdout":false``: an items.jsonl line's end, as orjson writes the whole line."""
    return orjson.dumps({"labels": outcome.labels, "holdout": outcome.holdout})[1:-1]


_UNLABELLED = _outcome_json(_Outcome({}, False))
# An items.jsonl line from the JSON of its id, text and outcome (orjson's compact form).
_LINE = b'{"id":%b,"text":%b,%b}\n'


def _label_outcomes(coded: dict[str, Coded], held_out: Callable[[list[str]], list[bool]],
                    more_ids: set[str] = frozenset()) -> tuple[dict[str, bytes], dict[bytes, _Outcome]]:
    """``({labelled item id: its outcome's JSON}, {outcome JSON: _Outcome})``, unlabelled items' included.

    Half a million labelled items share a handful of outcomes (an answer per
    schema, held out or not). Each item's is computed as an integer code in
    C-level passes (per schema the answer's code + 1, or 0, in mixed radix;
    then times 2 plus held out), each distinct code's JSON is built once, and
    the items share those bytes objects. *more_ids* (items with answers
    written one by one) get an outcome too, for their holdout mark.
    """
    schemas = [(name, c.per_item, c.radix, c.decode) for name, c in coded.items()]
    if len(schemas) == 1 and not more_ids:  # the common case: no union of ids, no lookups
        ids = list(schemas[0][1])
        codes: Iterable[int] = map(_plus_one, schemas[0][1].values())
    else:
        ids = list(dict.fromkeys(chain(chain.from_iterable(per_item for _, per_item, _, _ in schemas), more_ids)))
        codes = repeat(0)
        for _, per_item, radix, _ in schemas:
            codes = map(add, map(mul, codes, repeat(radix + 1)),
                        map(_plus_one, map(per_item.get, ids, repeat(-1))))
    codes = list(map(add, map(mul, codes, repeat(2)), held_out(ids)))
    json_of_code = {}
    outcomes = {_UNLABELLED: _Outcome({}, False)}
    for code in set(codes):
        rest, labels_of = code >> 1, []
        for name, _, radix, decode in reversed(schemas):
            rest, index = divmod(rest, radix + 1)
            if index:
                labels_of.append((name, decode(index - 1)))
        outcome = _Outcome(dict(reversed(labels_of)), bool(code & 1))
        json_of_code[code] = _outcome_json(outcome)
        outcomes[json_of_code[code]] = outcome
    return dict(zip(ids, map(json_of_code.__getitem__, codes))), outcomes


_plus_one = (1).__add__


def _block_lines(block: Block, outcome_of: dict[str, bytes], written: Counter[bytes]) -> bytes:
    """A block's items.jsonl lines: the same bytes as ``dump_line`` of each item's record, built in C-level passes."""
    outcome_json = list(map(outcome_of.pop, block.ids, repeat(_UNLABELLED)))
    written.update(outcome_json)
    dumps = orjson.dumps
    return b"".join(map(_LINE.__mod__, zip(map(dumps, block.ids), map(dumps, block.texts), outcome_json)))


def _media_fields(item: Item, task_dir: Path, config: ProjectConfig, missing: GroupedWarnings) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for key, value in item.fields.items():
        if key == config.id_key or not looks_like_media(value):
            continue
        try:
            rel = media_path(value, task_dir)
        except ValueError as exc:
            raise ProjectDataError(
                f"{show_path(item.file, config.task_dir)} line {item.line}: field {key!r} of item "
                f"{quote(item.id)} names a media file outside task_dir: {exc}. Move the file under "
                f"task_dir and name it by a path relative to task_dir"
            ) from None
        if rel is not None:
            found[key] = rel
        else:
            missing.add((show_path(item.file, config.task_dir), key), item.id)
    return found
