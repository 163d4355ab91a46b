"""A Potato project's data: items, annotators' labels, the holdout split, the run bundle.

Pure readers and builders on top, the one function that writes (``build_bundle``)
and the packer below. (The incremental JSON helpers could move to a sibling
module if this file grows further.) Nothing here changes the annotators' files: every
``user_state.json`` is opened read-only.

Formats read (mirroring real Potato, ``davidjurgens/potato``):

- items: ``data_files`` in JSON lines (one object per line), a JSON array file
  (any non-CSV/TSV file whose first character is ``[``), ``.csv`` or ``.tsv``
  with a header row. ``item_properties.id_key`` and ``text_key`` name the
  fields; ids become strings. All are streamed.
- labels: ``<output_annotation_dir>/<user>/user_state.json``. Potato's
  ``InMemoryUserState.to_json`` (``potato/user_state_management.py``) writes
  ``instance_id_to_label_to_value`` as ``{item_id: [[{"schema": S, "name": L}, VALUE], ...]}``
  where VALUE is what the form input posted: the label's own text for radio and
  multiselect (``generate_element_value`` in
  ``potato/server_utils/schemas/identifier_utils.py``), or ``"true"``/``true``/``1``
  in older files and tools. Older Potato wrote ``{item_id: {S: {L: VALUE}}}``.
  Both are read. A pair counts as a vote for L unless VALUE is a "not selected"
  value (``false``, ``"false"``, ``0``, ``""``, ``null``). The file is
  streamed member by member (a 500 k-item annotator's file parsed whole takes
  ~0.5 GB), and a file broken anywhere contributes nothing.

Aggregation: each annotator's selected label is one vote (multiselect: each
checked label); the label with the
most votes wins; a tie goes to the label listed first in the schema's
``labels`` (deterministic, and it does not depend on which annotator's file was
read first). Ties are counted per schema.

Holdout: an item is held out when ``sha256(id)`` read as a fraction of 2**64 is
below ``holdout_fraction`` — stable across Python processes and machines (unlike
``hash()``), independent of item order and of every other item.

Media: a string field naming a file with a media extension (image, audio,
video, pdf), relative to ``task_dir`` (or absolute but inside it), is copied to
``media/<same relative path>`` and named under the item's ``"fields"``. A path
that resolves outside ``task_dir`` (``..``, an absolute path elsewhere, a
symlink pointing out) is refused, because the bundle is shipped to other
machines and must not carry files the project does not own. URLs are left alone.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from potato.config import ProjectConfig, Scheme
from potato.errors import ProjectDataError

BUNDLE_FORMAT = 1

# Values Potato (or a tool writing its files) uses for "this label is not selected".
_NOT_SELECTED = (False, "false", "False", 0, "0", "", None)

MEDIA_EXTENSIONS = frozenset(
    ".png .jpg .jpeg .gif .webp .bmp .tif .tiff .svg "
    ".wav .mp3 .flac .ogg .m4a .aac .opus "
    ".mp4 .webm .mov .avi .mkv .pdf".split()
)

# How many individual warnings of one kind to list before summarising the rest;
# a misconfigured label on 500 k items must not flood the run log.
_WARNING_EXAMPLES = 5

# Characters read at a time from a JSON array data file (tests make it tiny to
# exercise elements split across chunks).
_ARRAY_CHUNK = 1 << 20
_USER_STATE_CHUNK = 1 << 20


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Item:
    """One item of a data file: its id, text, other fields and where it was read."""

    id: str
    text: str
    fields: Mapping[str, Any]
    file: Path
    line: int


# Vote counts are packed into one int per (schema, item): label i's count lives
# in bits [16*i, 16*i + 16). One flat dict per schema of str -> int costs about
# a tenth of nested dicts, which is what keeps 1 M items well under 1 GB.
_COUNT_BITS = 16
_COUNT_MASK = (1 << _COUNT_BITS) - 1


def unpack_counts(packed: int, n_labels: int) -> list[int]:
    """The vote count of each label (schema order) from a packed int."""
    return [(packed >> (_COUNT_BITS * i)) & _COUNT_MASK for i in range(n_labels)]


@dataclass
class Votes:
    """Annotators' votes: ``votes[schema][item_id]`` is the packed per-label counts.

    Use ``counts(schema, item_id)`` for a list of counts in the schema's label order.
    """

    schemes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    votes: dict[str, dict[str, int]] = field(default_factory=dict)
    users: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped_annotations: int = 0

    def counts(self, schema: str, item_id: str) -> list[int]:
        return unpack_counts(self.votes[schema].get(item_id, 0), len(self.schemes[schema]))

    def as_dict(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{item_id: {schema: {label: n}}}`` with zero counts left out (for tests and logs)."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for schema, per_item in self.votes.items():
            labels = self.schemes[schema]
            for item_id, packed in per_item.items():
                counts = {lab: n for lab, n in zip(labels, unpack_counts(packed, len(labels))) if n}
                if counts:
                    out.setdefault(item_id, {})[schema] = counts
        return out


@dataclass(frozen=True)
class Aggregated:
    """Majority labels: ``labels[schema][item_id]`` = label index; ties per schema."""

    schemes: dict[str, tuple[str, ...]]
    labels: dict[str, dict[str, int]]
    ties: dict[str, int]

    def labels_of(self, item_id: str) -> dict[str, str]:
        """``{schema: label}`` for one item (schemas without a label left out)."""
        out = {}
        for schema, per_item in self.labels.items():
            index = per_item.get(item_id)
            if index is not None:
                out[schema] = self.schemes[schema][index]
        return out

    def as_dict(self) -> dict[str, dict[str, str]]:
        """``{item_id: {schema: label}}`` (for tests and logs)."""
        out: dict[str, dict[str, str]] = {}
        for schema, per_item in self.labels.items():
            for item_id, index in per_item.items():
                out.setdefault(item_id, {})[schema] = self.schemes[schema][index]
        return out


@dataclass(frozen=True)
class BundleInfo:
    """What ``build_bundle`` wrote, for the run log and the manifest."""

    bundle_dir: Path
    items: int
    labeled: dict[str, int]
    holdout: dict[str, int]
    ties: dict[str, int]
    users: tuple[str, ...]
    media_files: int
    unknown_item_labels: int
    skipped_annotations: int
    warnings: tuple[str, ...]


def describe_bundle(info: BundleInfo) -> str:
    """One line for the run log: what the run trains on."""
    per_schema = "; ".join(
        f"{schema}: {count} labelled ({info.holdout.get(schema, 0)} held out, {info.ties.get(schema, 0)} ties)"
        for schema, count in info.labeled.items()
    )
    annotators = f"{len(info.users)} annotator{'s' if len(info.users) != 1 else ''}"
    return f"Bundle: {info.items} items from {annotators}; {per_schema}"


# --------------------------------------------------------------------------- items


def show_path(path: Path, base: Path | None) -> str:
    """*path* relative to *base* when it lies under it (as users wrote it in the config)."""
    if base is not None:
        try:
            return str(Path(path).relative_to(base))
        except ValueError:
            pass
    return str(path)


def _item_from_record(
    record: Any, id_key: str, text_key: str, path: Path, line: int, shown: str
) -> Item:
    if not isinstance(record, dict):
        raise ProjectDataError(
            f"{shown} line {line}: expected a JSON object per item, got "
            f"{type(record).__name__}; write one object per line, e.g. "
            f'{{"{id_key}": "1", "{text_key}": "..."}}'
        )
    item_id = record.get(id_key)
    if item_id is None or item_id == "":
        raise ProjectDataError(
            f"{shown} line {line}: the item has no {id_key!r} field "
            f"(item_properties.id_key); its fields are {sorted(record)!r}. Add the id, "
            f"or set item_properties.id_key to the field that holds it"
        )
    if text_key not in record or record[text_key] is None:
        raise ProjectDataError(
            f"{shown} line {line}: item {str(item_id)!r} has no {text_key!r} field "
            f"(item_properties.text_key); its fields are {sorted(record)!r}. Add the text, "
            f"or set item_properties.text_key to the field that holds it"
        )
    text = record[text_key]
    if not isinstance(text, str):
        # Potato displays non-string text (numbers, lists) via str(); do the same.
        text = json.dumps(text, ensure_ascii=False) if isinstance(text, (list, dict)) else str(text)
    return Item(id=str(item_id), text=text, fields=record, file=path, line=line)


def _read_json_lines(handle: io.TextIOBase, path: Path, shown: str) -> Iterator[tuple[int, Any]]:
    for line_no, raw in enumerate(handle, start=1):
        if not raw.strip():
            continue
        try:
            yield line_no, json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ProjectDataError(
                f"{shown} line {line_no}: not valid JSON: {exc.msg} (column {exc.colno}). "
                f"Each line must hold one complete JSON object"
            ) from exc


def _read_json_array(handle: io.TextIOBase, path: Path, shown: str) -> Iterator[tuple[int, Any]]:
    """Yield ``(line, element)`` of a top-level JSON array without loading it whole.

    Chunks are decoded with ``raw_decode``; an element cut by a chunk boundary
    is retried with more text, so memory stays at one element plus a chunk.
    """
    decoder = json.JSONDecoder()
    chunk_size = _ARRAY_CHUNK
    buf = handle.read(chunk_size)
    eof = len(buf) < chunk_size
    pos = 0
    line = 1

    def fail(msg: str) -> ProjectDataError:
        return ProjectDataError(f"{shown} line {line}: not valid JSON: {msg}")

    def skip_ws() -> None:
        nonlocal pos, line
        n = len(buf)
        while pos < n and buf[pos] in " \t\r\n":
            if buf[pos] == "\n":
                line += 1
            pos += 1

    def more() -> bool:
        nonlocal buf, pos, eof
        if eof:
            return False
        extra = handle.read(chunk_size)
        eof = len(extra) < chunk_size
        buf = buf[pos:] + extra
        pos = 0
        return bool(extra)

    skip_ws()
    if buf[pos : pos + 1] == "\ufeff":
        pos += 1
        skip_ws()
    if buf[pos : pos + 1] != "[":
        raise fail("expected '[' at the start of a JSON array file")
    pos += 1
    expect_value = True
    first = True
    while True:
        skip_ws()
        while pos >= len(buf) and more():
            skip_ws()
        if pos >= len(buf):
            raise fail("the array is not closed with ']'")
        ch = buf[pos]
        if ch == "]" and (first or not expect_value):
            return
        if not expect_value:
            if ch != ",":
                raise fail(f"expected ',' or ']' between items, found {ch!r}")
            pos += 1
            expect_value = True
            continue
        start_line = line
        while True:
            try:
                value, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as exc:
                # Maybe the element runs past this chunk: read on and retry.
                if more():
                    continue
                line = start_line + buf.count("\n", pos, exc.pos)
                raise fail(exc.msg) from exc
            if end >= len(buf) and not eof and not isinstance(value, (dict, list, str)):
                # A bare number at the buffer's edge may be cut short.
                if more():
                    continue
            break
        line = start_line + buf.count("\n", pos, end)
        yield start_line, value
        pos = end
        expect_value = False
        first = False


def _read_table(handle: io.TextIOBase, path: Path, shown: str, delimiter: str) -> Iterator[tuple[int, Any]]:
    reader = csv.DictReader(handle, delimiter=delimiter)
    if reader.fieldnames is None:
        return
    try:
        for row in reader:
            # reader.line_num is the physical line the row ended on (quoted newlines count).
            if None in row:
                raise ProjectDataError(
                    f"{shown} line {reader.line_num}: the row has more columns than the "
                    f"header ({len(reader.fieldnames)}); quote fields that contain "
                    f"{delimiter!r}"
                )
            yield reader.line_num, row
    except csv.Error as exc:
        raise ProjectDataError(f"{shown} line {reader.line_num}: not valid CSV: {exc}") from exc


def _file_kind(path: Path, handle: io.TextIOBase) -> str:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix == ".tsv":
        return "tsv"
    # .json / .jsonl / anything else: JSON lines, unless the file opens with '['.
    head = handle.read(4096)
    handle.seek(0)
    stripped = head.lstrip("\ufeff \t\r\n")
    return "array" if stripped.startswith("[") else "jsonl"


def read_items_file(path: Path, id_key: str, text_key: str, base: Path | None = None) -> Iterator[Item]:
    """Yield the items of one data file, streaming.

    Raises ``ProjectDataError`` naming the file (relative to *base*) and line
    for unreadable files, malformed JSON and missing id/text fields.
    """
    shown = show_path(path, base)
    try:
        handle = open(path, "r", encoding="utf-8-sig", newline="")
    except OSError as exc:
        raise ProjectDataError(
            f"{shown}: cannot read the data file: {exc.strerror}. Check data_files in the config"
        ) from exc
    with handle:
        try:
            kind = _file_kind(path, handle)
            if kind == "csv":
                records = _read_table(handle, path, shown, ",")
            elif kind == "tsv":
                records = _read_table(handle, path, shown, "\t")
            elif kind == "array":
                records = _read_json_array(handle, path, shown)
            else:
                records = _read_json_lines(handle, path, shown)
            for line, record in records:
                yield _item_from_record(record, id_key, text_key, path, line, shown)
        except UnicodeDecodeError as exc:
            raise ProjectDataError(f"{shown}: not UTF-8 text ({exc.reason}); save it as UTF-8") from exc


def iter_items(config: ProjectConfig) -> Iterator[Item]:
    """Yield every item of ``config.data_files`` in order (no duplicate check)."""
    for path in config.data_files:
        yield from read_items_file(Path(path), config.id_key, config.text_key, config.task_dir)


def _find_first(config: ProjectConfig, item_id: str) -> Item | None:
    # Only called on the error path: re-reading keeps the happy path to a set of ids.
    for item in iter_items(config):
        if item.id == item_id:
            return item
    return None


def read_items(config: ProjectConfig) -> Iterator[Item]:
    """Yield every item once, in data-file order; raise on a duplicate id.

    Keeps only a set of ids seen (the first occurrence is found again by
    re-reading when a duplicate turns up).
    """
    seen: set[str] = set()
    for item in iter_items(config):
        if item.id in seen:
            first = _find_first(config, item.id)
            here = f"{show_path(item.file, config.task_dir)} line {item.line}"
            there = (
                f"{show_path(first.file, config.task_dir)} line {first.line}" if first else "an earlier line"
            )
            raise ProjectDataError(
                f"{here}: duplicate item id {item.id!r}, first used at {there}. "
                f"Each item needs its own {config.id_key!r}"
            )
        seen.add(item.id)
        yield item


# --------------------------------------------------------------------------- labels


def find_user_states(annotation_dir: Path) -> list[tuple[str, Path]]:
    """``(user, path)`` of every ``<annotation_dir>/<user>/user_state.json``, sorted by user.

    A directory without ``user_state.json`` (``training/``, for one) is not a user.
    """
    if not annotation_dir.is_dir():
        return []
    found = []
    for entry in sorted(annotation_dir.iterdir(), key=lambda p: p.name):
        state = entry / "user_state.json"
        if entry.is_dir() and state.is_file():
            found.append((entry.name, state))
    return found


def _is_selected(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return value not in _NOT_SELECTED


def parse_label_entries(labels: Any) -> Iterator[tuple[str, str, Any]]:
    """Yield ``(schema, label, value)`` from one item's entry in either Potato format.

    New format: ``[[{"schema": S, "name": L}, VALUE], ...]``.
    Old format: ``{S: {L: VALUE}}``.
    Raises ``ValueError`` describing a shape that is neither.
    """
    if isinstance(labels, list):
        for pair in labels:
            if (
                not isinstance(pair, (list, tuple))
                or len(pair) != 2
                or not isinstance(pair[0], dict)
                or "schema" not in pair[0]
                or "name" not in pair[0]
            ):
                raise ValueError(f'expected [{{"schema": ..., "name": ...}}, value] pairs, found {pair!r:.80}')
            yield str(pair[0]["schema"]), str(pair[0]["name"]), pair[1]
    elif isinstance(labels, dict):
        for schema, by_label in labels.items():
            if not isinstance(by_label, dict):
                raise ValueError(f"expected {{label: value}} under schema {schema!r}, found {by_label!r:.80}")
            for label, value in by_label.items():
                yield str(schema), str(label), value
    else:
        raise ValueError(f"expected a list of pairs or a dict, found {type(labels).__name__}")


class _Grouped:
    """Collects repeated warnings of one kind and renders a few examples plus a count."""

    def __init__(self) -> None:
        self.groups: dict[tuple, list[str]] = {}
        self.counts: dict[tuple, int] = defaultdict(int)

    def add(self, key: tuple, example: str) -> None:
        self.counts[key] += 1
        examples = self.groups.setdefault(key, [])
        if len(examples) < _WARNING_EXAMPLES:
            examples.append(example)

    def render(self, make: Callable[[tuple, str], str]) -> list[str]:
        """One warning per key: ``make(key, "'a', 'b' and 7 more")``."""
        out = []
        for key, examples in self.groups.items():
            more = self.counts[key] - len(examples)
            listed = ", ".join(repr(e) for e in examples) + (f" and {more} more" if more else "")
            out.append(make(key, listed))
        return out


class UserStateError(ValueError):
    """A user_state.json that cannot be used; the message says why (for the warning)."""


_WS = re.compile(r"[ \t\n\r]*")
_LABELS_KEY = "instance_id_to_label_to_value"


class _JsonStream:
    """Just enough of an incremental JSON reader to walk one object's members.

    ``raw_decode`` does the real parsing on a buffer that grows when a value
    runs past it (doubling, so a big value costs linear time); consumed text is
    dropped. Memory is one member value plus a chunk, not the whole file.
    """

    def __init__(self, handle: io.TextIOBase, chunk: int) -> None:
        self.handle = handle
        self.chunk = chunk
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.lines_before = 0
        self.decoder = json.JSONDecoder()
        self.more()

    def more(self, at_least: int = 0) -> bool:
        if self.eof:
            return False
        extra = self.handle.read(max(self.chunk, at_least))
        if not extra:
            self.eof = True
            return False
        self.lines_before += self.buf.count("\n", 0, self.pos)
        self.buf = self.buf[self.pos :] + extra
        self.pos = 0
        return True

    def where(self, pos: int | None = None) -> str:
        pos = self.pos if pos is None else pos
        line = self.lines_before + self.buf.count("\n", 0, pos) + 1
        return f"line {line}"

    def peek(self) -> str:
        """The next non-whitespace character ('' at the end)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos : self.pos + 1]

    def ended_early(self) -> UserStateError:
        return UserStateError(f"not valid JSON: the file ends early at {self.where()} (cut off mid-write?)")

    def expect(self, char: str) -> None:
        found = self.peek()
        if not found:
            raise self.ended_early()
        if found != char:
            raise UserStateError(f"not valid JSON: expected {char!r} at {self.where()}, found {found or 'the end'!r}")
        self.pos += 1

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self.more(at_least=len(self.buf)):
                    continue
                raise UserStateError(f"not valid JSON: {exc.msg} at {self.where(exc.pos)}") from None
            if end >= len(self.buf) and not self.eof and not isinstance(value, (dict, list, str)):
                if self.more():
                    continue  # a number or literal cut at the buffer's edge
            self.pos = end
            return value

    def members(self) -> Iterator[tuple[str, "_JsonStream"]]:
        """Walk an object: yield each key with the stream positioned at its value.

        The consumer must read the value (``value()``) or walk it before the
        next member is asked for.
        """
        self.expect("{")
        if self.peek() == "}":
            self.pos += 1
            return
        while True:
            found = self.peek()
            if not found:
                raise self.ended_early()
            if found != '"':
                raise UserStateError(f"not valid JSON: expected a key at {self.where()}")
            key = self.value()
            self.expect(":")
            yield key, self
            sep = self.peek()
            if sep == "}":
                self.pos += 1
                return
            self.expect(",")


def _decoded_members(stream: _JsonStream) -> Iterator[tuple[str, Any]]:
    """Walk an object, yielding ``(key, decoded value)`` — the hot loop for 1 M entries.

    Each member is first tried on the current buffer with local variables only;
    anything unusual (the buffer's edge, odd spacing, a malformed member) falls
    back to the general, refilling ``_JsonStream`` methods for that member.
    """
    stream.expect("{")
    if stream.peek() == "}":
        stream.pos += 1
        return
    decode = stream.decoder.raw_decode
    ws = _WS.match
    while True:
        buf = stream.buf
        start = ws(buf, stream.pos).end()
        try:
            if buf[start] != '"':
                raise IndexError
            key, pos = decode(buf, start)
            pos = ws(buf, pos).end()
            if buf[pos] != ":":
                raise IndexError
            value, pos = decode(buf, ws(buf, pos + 1).end())
            if type(value) is not list and type(value) is not dict:
                raise IndexError  # a scalar may be cut at the buffer's edge: go the careful way
            pos = ws(buf, pos).end()
            sep = buf[pos]
            if sep != "," and sep != "}":
                raise IndexError
            stream.pos = pos + 1
        except (IndexError, json.JSONDecodeError):
            stream.pos = start
            found = stream.peek()
            if not found:
                raise stream.ended_early() from None
            if found != '"':
                raise UserStateError(f"not valid JSON: expected a key at {stream.where()}") from None
            key = stream.value()
            stream.expect(":")
            value = stream.value()
            sep = stream.peek()
            if sep == "}":
                stream.pos += 1
            else:
                stream.expect(",")
        yield key, value
        if sep == "}":
            return


def read_user_state_labels(path: Path, chunk: int = 1 << 20) -> Iterator[tuple[str, Any]]:
    """Yield ``(item_id, labels)`` of ``instance_id_to_label_to_value`` in one user_state.json.

    Streams: one item's entry at a time, so a 500 k-item annotator does not
    need the whole file parsed in memory. The file is opened read-only.
    Raises ``UserStateError`` (or ``OSError``, ``UnicodeDecodeError``) on a
    file that is not a JSON object or has a non-object labels member; the
    caller must treat entries already yielded as void then.
    """
    with open(path, "r", encoding="utf-8") as handle:
        stream = _JsonStream(handle, chunk)
        first = stream.peek()
        if first != "{":
            kind = {"[": "list", '"': "string", "": "nothing"}.get(first, "a value")
            raise UserStateError(f"expected a JSON object at the top, found {kind}")
        for key, member in stream.members():
            if key != _LABELS_KEY:
                member.value()  # other keys (ordering, spans, behavioural data): parsed, dropped
                continue
            if member.peek() != "{":
                found = member.value()
                if found is None:
                    continue
                raise UserStateError(f"{_LABELS_KEY} is a {type(found).__name__}, not an object")
            yield from _decoded_members(member)
        if stream.peek() != "":
            raise UserStateError(f"not valid JSON: extra data after the object at {stream.where()}")


def read_votes(
    annotation_dir: Path,
    schemes: Sequence[Scheme],
    base: Path | None = None,
) -> Votes:
    """Read every annotator's votes for *schemes* from ``user_state.json`` files.

    Never raises on a bad file: an unparseable or oddly shaped file is skipped
    with a warning (path and reason), a label not among its schema's labels is
    skipped with a warning (file, item, schema, label). Labels for schemas not
    in *schemes* are ignored (they are not being trained).
    """
    index = {s.name: {label: i for i, label in enumerate(s.labels)} for s in schemes}
    result = Votes(schemes={s.name: tuple(s.labels) for s in schemes}, votes={s.name: {} for s in schemes})
    unknown = _Grouped()
    bad_entries = _Grouped()
    for user, path in find_user_states(annotation_dir):
        shown = show_path(path, base)
        # Stage this file's votes and problems; merge them only once the whole
        # file has been read, so a file broken half-way contributes nothing.
        staged: dict[str, dict[str, int]] = {name: {} for name in index}
        file_unknown: list[tuple[tuple, str]] = []
        file_bad: list[tuple[tuple, str]] = []
        try:
            for item_id, labels in read_user_state_labels(path, _USER_STATE_CHUNK):
                try:
                    entries = _fast_entries(labels)
                except ValueError as exc:
                    file_bad.append(((shown, str(exc)), item_id))
                    continue
                for schema, label, value in entries:
                    labels_of = index.get(schema)
                    if labels_of is None or not _is_selected(value):
                        continue
                    label_index = labels_of.get(label)
                    if label_index is None:
                        file_unknown.append(((shown, schema, label), item_id))
                        continue
                    per_schema = staged[schema]
                    per_schema[item_id] = per_schema.get(item_id, 0) + (1 << (_COUNT_BITS * label_index))
        except (OSError, UnicodeDecodeError) as exc:
            result.warnings.append(f"{shown}: skipped, it cannot be read ({exc})")
            continue
        except UserStateError as exc:
            result.warnings.append(f"{shown}: skipped, {exc}")
            continue
        result.users.append(user)
        for schema, per_item in staged.items():
            into = result.votes[schema]
            if not into:
                result.votes[schema] = per_item
                continue
            for item_id, packed in per_item.items():
                into[item_id] = into.get(item_id, 0) + packed
        for key, item_id in file_unknown:
            unknown.add(key, item_id)
        for key, item_id in file_bad:
            bad_entries.add(key, item_id)
        result.skipped_annotations += len(file_unknown) + len(file_bad)
    result.warnings.extend(
        unknown.render(
            lambda key, listed: (
                f"{key[0]}: item(s) {listed} have label {key[2]!r} for schema {key[1]!r}, which is "
                f"not one of its labels {list(index[key[1]])!r}; those annotations were skipped. "
                f"Fix the label in the config's annotation_schemes if {key[2]!r} is meant to be one"
            )
        )
    )
    result.warnings.extend(bad_entries.render(lambda key, listed: f"{key[0]}: item(s) {listed} skipped: {key[1]}"))
    return result


def _fast_entries(labels: Any) -> list[tuple[str, str, Any]]:
    # The common case (current Potato, well-formed) without a generator per item;
    # anything unusual goes through parse_label_entries for its error message.
    if type(labels) is list:
        out = []
        try:
            for meta, value in labels:
                out.append((meta["schema"], meta["name"], value))
        except (TypeError, ValueError, KeyError):
            return list(parse_label_entries(labels))
        if all(type(schema) is str and type(name) is str for schema, name, _ in out):
            return out
    return list(parse_label_entries(labels))


def aggregate_votes(votes: Votes) -> Aggregated:
    """Majority label per item and schema; ties go to the earliest label in the schema.

    Returns the labels and the number of tied (item, schema) pairs per schema.
    """
    labels: dict[str, dict[str, int]] = {}
    ties: dict[str, int] = {}
    for schema, per_item in votes.votes.items():
        n_labels = len(votes.schemes[schema])
        out: dict[str, int] = {}
        tied = 0
        for item_id, packed in per_item.items():
            if packed < (1 << _COUNT_BITS):
                out[item_id] = 0  # only label 0 has votes: the common fast case
                continue
            counts = unpack_counts(packed, n_labels)
            best = max(counts)
            winner = counts.index(best)  # first in schema order: the tie-break
            if counts.count(best) > 1:
                tied += 1
            out[item_id] = winner
        labels[schema] = out
        ties[schema] = tied
    return Aggregated(schemes=dict(votes.schemes), labels=labels, ties=ties)


# --------------------------------------------------------------------------- holdout


def is_holdout(item_id: str, fraction: float) -> bool:
    """Whether *item_id* is held out: ``sha256(id) / 2**64 < fraction`` (first 8 bytes).

    Depends on the id alone, so the split is the same in every process, on
    every machine, whatever the order of items or which others exist.
    """
    if fraction <= 0:
        return False
    digest = hashlib.sha256(item_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


def split_holdout(item_ids: Iterable[str], fraction: float) -> set[str]:
    """The ids of *item_ids* that are held out (see ``is_holdout``)."""
    return {i for i in item_ids if is_holdout(i, fraction)}


# --------------------------------------------------------------------------- media


def looks_like_media(value: Any) -> bool:
    """Whether *value* is a string that names a file with a media extension (not a URL).

    Cheap on purpose: it runs on every field of every item.
    """
    if type(value) is not str:
        return False
    # The extension must sit in the last 6 characters ('.jpeg', '.tiff'): one C
    # call settles most text fields without building a Path.
    dot = value.rfind(".", -6)
    if dot < 0 or value[dot:].lower() not in MEDIA_EXTENSIONS:
        return False
    return len(value) <= 4096 and "\n" not in value and "://" not in value and not value.startswith("data:")


def media_path(value: Any, task_dir: Path) -> Path | None:
    """The relative path under *task_dir* that *value* names as media, or None.

    None when *value* is not a string naming a file with a media extension, is
    a URL, or names no existing file. Raises ``ValueError`` when the path
    resolves outside *task_dir*.
    """
    if not looks_like_media(value):
        return None
    root = task_dir.resolve()
    target = (root / value).resolve()
    try:
        rel = target.relative_to(root)
    except ValueError:
        raise ValueError(
            f"{value!r} resolves to {str(target)!r}, outside task_dir {str(root)!r}"
        ) from None
    if not target.is_file():
        return None
    return rel


# --------------------------------------------------------------------------- the bundle


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
        if not scheme.labels:
            raise ProjectDataError(
                f"{show_path(config.path, config.task_dir)}: annotation scheme {name!r} "
                f"({scheme.annotation_type}) has no labels, so a classifier cannot be trained on it"
            )
        out.append(scheme)
    if not out:
        raise ProjectDataError("no schemas to train: name at least one annotation scheme")
    return out


# One encoder for all lines: json.dumps with options builds a new one per call.
_dump = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


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
    schemes = _resolve_schemes(config, schemas)
    fraction = config.model_training.holdout_fraction if holdout_fraction is None else holdout_fraction
    if not 0 <= fraction < 1:
        raise ProjectDataError(f"holdout_fraction must be at least 0 and below 1, got {fraction!r}")
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    # A rebuilt bundle must not carry media an earlier build copied.
    shutil.rmtree(dest / "media", ignore_errors=True)
    base = config.task_dir

    votes = read_votes(config.output_annotation_dir, schemes, base)
    aggregated = aggregate_votes(votes)
    votes.votes.clear()  # the aggregated labels are all we need from here
    warnings = list(votes.warnings)
    label_maps = [(name, aggregated.labels[name], aggregated.schemes[name]) for name in aggregated.labels]

    names = [s.name for s in schemes]
    labeled = {n: 0 for n in names}
    holdout = {n: 0 for n in names}
    n_items = 0
    copied: set[Path] = set()
    missing_media = _Grouped()
    media_dir = dest / "media"
    task_dir = config.task_dir

    tmp_items = dest / "items.jsonl.tmp"
    with open(tmp_items, "w", encoding="utf-8", newline="\n") as out:
        write = out.write
        for item in read_items(config):
            n_items += 1
            # pop: what is left afterwards are labels for ids the data lacks.
            item_labels = {}
            for name, per_item, schema_labels in label_maps:
                index = per_item.pop(item.id, None)
                if index is not None:
                    item_labels[name] = schema_labels[index]
            record: dict[str, Any] = {"id": item.id, "text": item.text}
            if item_labels:
                held = is_holdout(item.id, fraction)
                for schema in item_labels:
                    labeled[schema] += 1
                    if held:
                        holdout[schema] += 1
                record["labels"] = item_labels
                record["holdout"] = held
            else:
                record["labels"] = {}
                record["holdout"] = False
            media_fields = _media_fields(item, task_dir, config, missing_media)
            if media_fields:
                for rel in media_fields.values():
                    if rel not in copied:
                        target = media_dir / rel
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(task_dir / rel, target)
                        copied.add(rel)
                record["fields"] = {k: v.as_posix() for k, v in media_fields.items()}
            write(_dump(record))
            write("\n")
    os.replace(tmp_items, dest / "items.jsonl")

    left = set().union(*(per_item for _, per_item, _ in label_maps))
    unknown_ids = len(left)
    if unknown_ids:
        examples = ", ".join(repr(i) for i in sorted(left)[:_WARNING_EXAMPLES])
        warnings.append(
            f"{show_path(config.output_annotation_dir, base)}: {unknown_ids} labelled item id(s) "
            f"are not in the data files and were ignored (e.g. {examples}); were items "
            f"removed from data_files, or ids changed?"
        )
    warnings.extend(
        missing_media.render(
            lambda key, listed: (
                f"{key[0]}: field {key[1]!r} of item(s) {listed} names a media file that does "
                f"not exist under task_dir; left out of the bundle"
            )
        )
    )

    counts = {
        "items": n_items,
        "labeled": labeled,
        "holdout": holdout,
        "ties": {n: aggregated.ties[n] for n in names},
    }
    manifest = {
        "format": BUNDLE_FORMAT,
        "schemas": {s.name: list(s.labels) for s in schemes},
        "id_key": config.id_key,
        "text_key": config.text_key,
        "holdout_fraction": fraction,
        "counts": counts,
    }
    tmp_manifest = dest / "manifest.json.tmp"
    tmp_manifest.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp_manifest, dest / "manifest.json")

    return BundleInfo(
        bundle_dir=dest,
        items=n_items,
        labeled=labeled,
        holdout=holdout,
        ties=counts["ties"],
        users=tuple(votes.users),
        media_files=len(copied),
        unknown_item_labels=unknown_ids,
        skipped_annotations=votes.skipped_annotations,
        warnings=tuple(warnings),
    )


def _media_fields(item: Item, task_dir: Path, config: ProjectConfig, missing: _Grouped) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for key, value in item.fields.items():
        if key == config.id_key or not looks_like_media(value):
            continue
        try:
            rel = media_path(value, task_dir)
        except ValueError as exc:
            raise ProjectDataError(
                f"{show_path(item.file, config.task_dir)} line {item.line}: field {key!r} of item "
                f"{item.id!r} names a media file outside task_dir: {exc}. Move the file under "
                f"task_dir and name it by a path relative to task_dir"
            ) from None
        if rel is not None:
            found[key] = rel
        else:
            missing.add((show_path(item.file, config.task_dir), key), item.id)
    return found


# --------------------------------------------------------------------------- packing

# A fixed timestamp (2020-01-01) so the same bundle always packs to the same bytes.
_PACK_MTIME = 1577836800


def _bundle_members(bundle_dir: Path) -> list[Path]:
    members = []
    for root, dirs, files in os.walk(bundle_dir):
        dirs.sort()
        rel_root = Path(root).relative_to(bundle_dir)
        for d in dirs:
            members.append(rel_root / d)
        for f in sorted(files):
            if f.endswith(".tmp"):
                continue
            members.append(rel_root / f)
    return sorted(members, key=lambda p: p.as_posix())


def pack_bundle(bundle_dir: str | Path, dest_tar_gz: str | Path, *, compresslevel: int = 1) -> Path:
    """Pack *bundle_dir* into *dest_tar_gz*, byte-for-byte reproducibly.

    Members are relative to the bundle directory, sorted by path, with a fixed
    mtime, owner 0/0 and modes 0644/0755; the gzip header has no name and a
    fixed mtime. Level 1 compression: bundles are mostly text and speed matters
    more than the last 10 %. Written to a temp file and renamed.
    """
    src = Path(bundle_dir)
    dest = Path(dest_tar_gz)
    # A name of its own per call: the flow and an agent's claim may pack the same bundle at once.
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    with os.fdopen(fd, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=compresslevel, mtime=_PACK_MTIME) as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for rel in _bundle_members(src):
                    path = src / rel
                    info = tarfile.TarInfo(rel.as_posix())
                    info.mtime = _PACK_MTIME
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    if path.is_dir():
                        info.type = tarfile.DIRTYPE
                        info.mode = 0o755
                        tar.addfile(info)
                    else:
                        info.mode = 0o644
                        info.size = path.stat().st_size
                        with open(path, "rb") as fh:
                            tar.addfile(info, fh)
    os.replace(tmp, dest)
    return dest


def read_manifest(bundle_dir: str | Path) -> dict[str, Any]:
    """The bundle's ``manifest.json`` as a dict."""
    return json.loads((Path(bundle_dir) / "manifest.json").read_text(encoding="utf-8"))
