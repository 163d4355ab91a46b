"""Annotators' labels: the ``user_state.json`` files, the votes in them, one label per item.

Nothing here changes the annotators' files: every ``user_state.json`` is
opened read-only. ``potato.bundle.build`` builds the bundle from what this reads.

Files: ``<output_annotation_dir>/<user>/user_state.json`` (mirroring real
Potato, ``davidjurgens/potato``). Potato's
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
checked label); the label with the most votes wins; a tie goes to the label listed first in the schema's
``labels`` (deterministic, and it does not depend on which annotator's file was
read first). Ties are counted per schema. ``aggregation: consensus`` weighs
annotators by reliability instead (Dawid-Skene, ``potato.annotations.consensus``).

Speed (``potato.bundle.build`` says why everything hot is a C-level
pass): a batch of entries holds a handful of distinct value texts (a radio
schema's differ only in the label), each interpreted once (``_tally_votes``);
``potato.annotations.json_chunks`` does not even parse the others. Votes go straight into
the totals; a file that fails half-way has its votes taken back. With a CPU to
spare, the next files are parsed in forked children meanwhile
(``_ParsedAhead``, ``potato.annotations.forked``).
"""

from __future__ import annotations

import heapq
import io
import json
import mmap
import os
import re
from collections import Counter, deque
from dataclasses import dataclass, field
from itertools import compress, filterfalse, groupby, islice, repeat
from operator import add, itemgetter, lshift, ne, neg, or_
from pathlib import Path
from typing import Any, Hashable, Iterable, Iterator, Mapping, NamedTuple, Protocol, Sequence

from potato.annotations.forked import Forked, ForkFailed, can_fork
from potato.annotations.json_chunks import WINDOW, Batch, GiveUp, members_batches
from potato.config import TRAINING_DIR, Scheme
from potato.items.data_warnings import GroupedWarnings, show_path
from potato.training.escaping import QUOTED, quote, quote_all

# Values Potato (or a tool writing its files) uses for "this label is not selected".
_NOT_SELECTED = (False, "false", "False", 0, "0", "", None)

# Characters the careful reader takes at a time; the fast reader's window (tests make both tiny).
_USER_STATE_CHUNK = 1 << 20
_USER_STATE_WINDOW = WINDOW


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
    # Each annotator's own votes, same shape (``read_votes(..., per_user=True)``; consensus needs them).
    by_user: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)

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
class ChosenLabels:
    """One label per item, by majority vote or by consensus: ``labels[schema][item_id]`` = label index; ties
    per schema."""

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


def find_user_states(annotation_dir: Path) -> list[tuple[str, Path]]:
    """``(user, path)`` of every ``<annotation_dir>/<user>/user_state.json``, sorted by user.

    A directory without ``user_state.json`` is not a user. ``training/`` never
    is: it is where training keeps its run store and runs, and an annotator
    Potato 2.12 let sign up as ``training`` must not have their file read
    from beside them (``potato validate`` and ``potato start`` warn about
    such a user).
    """
    if not annotation_dir.is_dir():
        return []
    found = []
    for entry in sorted(annotation_dir.iterdir(), key=lambda p: p.name):
        state = entry / "user_state.json"
        if entry.name != TRAINING_DIR and entry.is_dir() and state.is_file():
            found.append((entry.name, state))
    return found


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


class UserStateError(ValueError):
    """A user_state.json that cannot be used; the message says why (for the warning)."""


_WS = re.compile(r"[ \t\n\r]*")
# The members of user_state.json that hold answers: label entries, and spans.
LABELS_MEMBER = "instance_id_to_label_to_value"
SPANS_MEMBER = "instance_id_to_span_to_value"


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


def read_user_state_labels(path: Path, chunk: int = 1 << 20, member: str | None = None) -> Iterator[tuple[str, Any]]:
    """Yield ``(item_id, labels)`` of ``instance_id_to_label_to_value`` (or *member*) in one user_state.json.

    Streams: one item's entry at a time, so a 500 k-item annotator does not
    need the whole file parsed in memory. The file is opened read-only.
    Raises ``UserStateError`` (or ``OSError``, ``UnicodeDecodeError``) on a
    file that is not a JSON object or has a non-object labels member; the
    caller must treat entries already yielded as void then.
    """
    for _, item_id, value in read_user_state_members(path, (member or LABELS_MEMBER,), chunk):
        yield item_id, value


def read_user_state_members(path: Path, members: tuple[str, ...], chunk: int = 1 << 20) -> Iterator[tuple[str, str, Any]]:
    """``(member, item_id, value)`` of each object member in *members*, in file order: one pass for several."""
    with open(path, "r", encoding="utf-8") as handle:
        stream = _JsonStream(handle, chunk)
        first = stream.peek()
        if first != "{":
            kind = {"[": "list", '"': "string", "": "nothing"}.get(first, "a value")
            raise UserStateError(f"expected a JSON object at the top, found {kind}")
        for key, value in stream.members():
            if key not in members:
                value.value()  # other keys (ordering, behavioural data): parsed, dropped
                continue
            if value.peek() != "{":
                found = value.value()
                if found is None:
                    continue
                raise UserStateError(f"{key} is a {type(found).__name__}, not an object")
            for item_id, entry in _decoded_members(value):
                yield key, item_id, entry
        if stream.peek() != "":
            raise UserStateError(f"not valid JSON: extra data after the object at {stream.where()}")


# The members of user_state.json whose keys are items an annotator annotated
# (Potato 2.12's UserState.get_all_annotations: labels, spans, links, events).
_ANNOTATED_KEYS = (LABELS_MEMBER, SPANS_MEMBER,
                   "instance_id_to_link_to_value", "instance_id_to_event_to_value")


def count_user_state_annotations(path: Path, chunk: int = 1 << 20) -> int:
    """How many items one annotator annotated, counted as Potato 2.12 counts for ``auto_retrain``."""
    return len(annotated_ids(path, chunk))


def annotated_ids(path: Path, chunk: int = 1 << 20) -> set[str]:
    """The items one annotator annotated: what Potato 2.12 counts for ``auto_retrain``.

    2.12's ``maybe_auto_retrain`` sums ``len(get_all_annotations())`` over
    users: the items with an entry in any of ``_ANNOTATED_KEYS``. A file as
    2.12 writes it (``indent=2``) is read by ``_pretty_annotated_ids``, which
    finds those members' keys without decoding anything else (a busy
    annotator's file is rewritten on every click); any other file is streamed
    by the careful reader (values walked, not kept). Raises
    ``UserStateError``, ``OSError`` or ``UnicodeDecodeError`` for a file that
    cannot be read.
    """
    with open(path, "rb") as raw:
        try:
            data = mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            data = None
        if data is not None:
            with data:
                found = _pretty_annotated_ids(data)
            if found is not None:
                return found
    annotated: set[str] = set()
    with open(path, "r", encoding="utf-8") as handle:
        stream = _JsonStream(handle, chunk)
        if stream.peek() != "{":
            raise UserStateError("expected a JSON object at the top")
        for key, member in stream.members():
            if key in _ANNOTATED_KEYS and member.peek() == "{":
                annotated.update(item_id for item_id, _ in _decoded_members(member))
            else:
                member.value()
    return annotated


# In an indent=2 file a line that opens with exactly two spaces and a quote is a
# member of the top-level object (a string holds no raw newline; deeper lines are
# indented further); inside such a member's object, a line with four spaces and a
# quote is one of its keys, and the first line of two spaces and "}" closes it.
_ANNOTATED_NEEDLES = tuple(b'\n  "%s": ' % key.encode() for key in _ANNOTATED_KEYS)
_SECOND_KEY = re.compile(rb'\n    "((?:[^"\\\n]|\\.)*)": ')


def _pretty_annotated_ids(data: Any) -> set[str] | None:
    """``annotated_ids`` of a whole file as ``json.dump(state, f, indent=2)`` writes it, by searching its
    bytes for the four members and their keys (C-level finds and one regex; the rest is never looked
    at); None for any other layout."""
    if data[:5] != b'{\n  "' or data[max(0, len(data) - 8):].rstrip()[-2:] != b"\n}":
        return None
    found: set[str] = set()
    for needle in _ANNOTATED_NEEDLES:
        at = data.find(needle)
        if at < 0:
            continue
        value = at + len(needle)
        if data[value:value + 2] == b"{}" or data[value:value + 4] == b"null":
            continue
        end = data.find(b"\n  }", value)
        if data[value:value + 2] != b"{\n" or end < 0:
            return None
        keys = _SECOND_KEY.findall(data, value, end)
        if b"\\" in b"".join(keys):
            found.update(json.loads(b'"' + k + b'"') for k in keys)
        else:
            found.update(map(bytes.decode, keys))
    return found


def skipped_file(shown: str, exc: Exception) -> str:
    """The warning for an annotator's file that is skipped because reading it raised *exc*."""
    if isinstance(exc, UserStateError):
        return f"{shown}: skipped, {exc}"
    return f"{shown}: skipped, it cannot be read ({exc})"


class FileReadBeside(Protocol):
    """One annotator's file as another reader sees it, in the pass that counts its votes."""

    def add(self, member: str, batch: Batch) -> None:
        """Take one batch of *member* (in file order)."""


class ReadBeside(Protocol):
    """A reader of the annotators' files that rides on ``read_votes``' one pass over each.

    ``members`` are the members of ``user_state.json`` it reads (the labels'
    included if it wants them). ``open_file`` starts one file: a file that
    fails half-way, or that the careful reader must read again, is opened
    afresh, so what the reader keeps is only what ``keep`` is given, for a
    file read whole.
    """

    members: tuple[str, ...]

    def open_file(self) -> FileReadBeside: ...

    def keep(self, user: str, shown: str, one: FileReadBeside) -> None: ...


def read_votes(
    annotation_dir: Path,
    schemes: Sequence[Scheme],
    base: Path | None = None,
    *,
    per_user: bool = False,
    beside: ReadBeside | None = None,
) -> Votes:
    """Read every annotator's votes for *schemes* from ``user_state.json`` files.

    Never raises on a bad file: an unparseable or oddly shaped file is skipped
    with a warning (path and reason), a label not among its schema's labels is
    skipped with a warning (file, item, schema, label). Labels for schemas not
    in *schemes* are ignored (they are not being trained). With *per_user*,
    ``by_user`` keeps each annotator's votes too (more memory; for consensus).
    *beside* reads what else it wants of each file in the same pass (the
    answers that are not votes: ``potato.annotations.annotator_answers``), so
    a bundle reads each file once.
    """
    index = {s.name: {label: i for i, label in enumerate(s.labels)} for s in schemes}
    members = tuple(dict.fromkeys((LABELS_MEMBER, *beside.members))) if beside is not None else (LABELS_MEMBER,)
    result = Votes(schemes={s.name: tuple(s.labels) for s in schemes}, votes={s.name: {} for s in schemes})
    unknown = GroupedWarnings()
    bad_entries = GroupedWarnings()
    states = find_user_states(annotation_dir)
    with _ParsedAhead([path for _, path in states], members) as parsed:
        for user, path in states:
            shown = show_path(path, base)
            into = {name: {} for name in index} if per_user else result.votes
            try:
                batches = parsed.take(path)
                one = beside.open_file() if beside is not None else None
                try:
                    file_unknown, file_bad = _tally_votes(
                        _labels_of(_fast_batches(path, members) if batches is None else batches, one), index, into)
                except GiveUp:  # odd or broken: the careful reader names the problem
                    one = beside.open_file() if beside is not None else None
                    file_unknown, file_bad = _tally_votes(_labels_of(_careful_batches(path, members), one), index,
                                                          into)
            except (OSError, UnicodeDecodeError, UserStateError) as exc:
                result.warnings.append(skipped_file(shown, exc))
                continue
            result.users.append(user)
            if one is not None:
                beside.keep(user, shown, one)
            if per_user:
                result.by_user[user] = into
                for schema, per_item in into.items():
                    _add_packed(result.votes[schema], list(per_item), per_item.values())
            for (schema, label), item_id in file_unknown:
                unknown.add((shown, schema, label), item_id)
            for problem, item_id in file_bad:
                bad_entries.add((shown, problem), item_id)
            result.skipped_annotations += len(file_unknown) + len(file_bad)
    result.warnings.extend(
        unknown.render(
            lambda key, listed: (
                f"{key[0]}: item(s) {listed} have label {quote(key[2])} for schema {key[1]!r}, which is "
                f"not one of its labels {list(index[key[1]])!r}; those annotations were skipped. "
                f"Fix the label in the config's annotation_schemes if {quote(key[2])} is meant to be one"
            )
        )
    )
    result.warnings.extend(bad_entries.render(lambda key, listed: f"{key[0]}: item(s) {listed} skipped: {key[1]}"))
    return result


# Each annotator's votes on ids that are not items of the project: {user: {schema: {id: packed counts}}}.
NotItems = dict[str, dict[str, dict[str, int]]]


def drop_not_items(votes: Votes, items: set[str] | frozenset[str]) -> NotItems:
    """Remove the votes on ids not in *items* from *votes* (read ``per_user``); return them per annotator."""
    removed: NotItems = {}
    if all(items.issuperset(per_item) for per_item in votes.votes.values()):
        return removed  # the common case: one pass over the labelled ids, not one per annotator
    for user, per_schema in votes.by_user.items():
        for schema, per_item in per_schema.items():
            gone = list(filterfalse(items.__contains__, per_item))
            if gone:
                removed.setdefault(user, {})[schema] = dict(zip(gone, map(per_item.pop, gone)))
    for per_item in votes.votes.values():
        for item_id in list(filterfalse(items.__contains__, per_item)):
            del per_item[item_id]
    return removed


def read_votes_on(annotation_dir: Path, schemes: Sequence[Scheme], ids: set[str]) -> NotItems:
    """Each annotator's votes on *ids* only, read again from their files.

    For naming, after the fact, who labelled ids that turned out not to be
    items (majority vote learns which ids are items only once the bundle's
    items are written). Costs a second read of the files, only when such ids
    exist. A file that cannot be read is left out: ``read_votes`` named it.
    """
    index = {s.name: {label: i for i, label in enumerate(s.labels)} for s in schemes}
    found: NotItems = {}
    for user, path in find_user_states(annotation_dir):
        into: dict[str, dict[str, int]] = {name: {} for name in index}
        try:
            try:
                _tally_votes(_only_ids(ids, _labels_of(_fast_batches(path, (LABELS_MEMBER,)))), index, into)
            except GiveUp:
                _tally_votes(_only_ids(ids, _labels_of(_careful_batches(path, (LABELS_MEMBER,)))), index, into)
        except (OSError, UnicodeDecodeError, UserStateError):
            continue
        into = {schema: per_item for schema, per_item in into.items() if per_item}
        if into:
            found[user] = into
    return found


def _only_ids(ids: set[str], batches: Iterable[Batch]) -> Iterator[Batch]:
    """The entries of *batches* whose item is one of *ids*."""
    for keys, texts, values in batches:
        wanted = list(map(ids.__contains__, keys))
        if any(wanted):
            yield list(compress(keys, wanted)), list(compress(texts, wanted)), values


def describe_not_items(not_items: NotItems, schemes: Mapping[str, Sequence[str]], annotation_dir: Path,
                       base: Path | None = None) -> list[str]:
    """One warning per annotator: how many labels on how many ids that are not items were ignored, and which.

    ``annotation_output/mallory/user_state.json: 3 labels by mallory on 2 ids
    that are not items of this project were ignored: '\\ud83d', 'xxxx…' (200000
    characters)``: ids quoted short, at most ``QUOTED`` of them, so a planted
    2 MB id costs a line of bounded length.
    """
    out = []
    for user, per_schema in sorted(not_items.items()):
        ids: set[str] = set()
        labels = 0
        for schema, per_item in per_schema.items():
            ids.update(per_item)
            n_labels = len(schemes[schema])
            labels += sum(sum(unpack_counts(packed, n_labels)) for packed in per_item.values())
        listed = quote_all(heapq.nsmallest(QUOTED, ids), total=len(ids))
        shown = show_path(annotation_dir / user / "user_state.json", base)
        many = len(ids) != 1
        out.append(f"{shown}: {labels} label{'s' if labels != 1 else ''} by {user} on {len(ids)} "
                   f"{'ids that are not items' if many else 'id that is not an item'} of this project "
                   f"{'were' if labels != 1 else 'was'} ignored: {listed}")
    return out


# Entries of the careful reader tallied at a time.
_CAREFUL_BATCH = 4096
# Distinct entry texts whose meaning is remembered across batches (a bound on memory
# when every entry differs, as free-text values would).
_MEANINGS = 1024


# Files at least this large are parsed in forked children (potato.annotations.forked), as
# many at once as there are CPUs, while this process counts the votes of the one
# before: the parse is 60 % of a file's cost. Smaller ones are not worth a fork.
_FORK_MIN_BYTES = 4 << 20
# A child gives up on a file with more distinct entry texts than this (free-text
# values): its result would be as large as the file.
_FORK_MAX_TEXTS = 4096


class _ParsedAhead:
    """The batches of the annotators' files, parsed ahead in forked children where that pays.

    ``take(path)`` (in file order) returns a file's batches, or None when this
    process must read the file itself (a small file, no fork here, a child
    that failed or gave up: the reading then names any problem).
    """

    def __init__(self, paths: list[Path], members: tuple[str, ...]) -> None:
        self.members = members
        self.waiting = deque(p for p in paths if _size(p) >= _FORK_MIN_BYTES) if _cpu_to_spare() else deque()
        self.running: dict[Path, Forked] = {}
        self.ahead = os.cpu_count() or 1

    def take(self, path: Path) -> list[tuple[str, Batch]] | None:
        self._start()
        child = self.running.pop(path, None)
        if child is None:
            return None
        try:
            return child.result()
        except ForkFailed:
            return None
        finally:
            child.close()
            self._start()

    def _start(self) -> None:
        while self.waiting and len(self.running) < self.ahead:
            path = self.waiting.popleft()
            try:
                self.running[path] = Forked(_parsed_members, path, self.members)
            except ForkFailed:
                return

    def __enter__(self) -> _ParsedAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        for child in self.running.values():
            child.close()
        self.running.clear()


def _cpu_to_spare() -> bool:
    """Whether children may help: a fork is possible and a CPU is idle besides this process's.

    A child costs CPU of its own (its pickle, the parent's unpickling: 1.1 s
    of children for 0.7 s saved here, at 1 M items). With a CPU idle that buys
    time; on a machine already busy it only adds work (measured at load 4 on
    2 CPUs: 5.9 s instead of 5.3). So, like ``make --load-average``, start
    none while the load average says the CPUs are taken.
    """
    if not can_fork():
        return False
    try:
        return os.getloadavg()[0] < (os.cpu_count() or 1) - 1
    except OSError:
        return False


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _parsed_members(path: Path, members: tuple[str, ...]) -> list[tuple[str, Batch]] | None:
    """In a forked child: the file's ``(member, batch)`` pairs, each distinct text numbered
    (a small pickle), or None for the parent to read it (any problem, too many texts)."""
    numbers: dict[Hashable, int] = {}
    out = []
    try:
        for member, (keys, texts, values) in _fast_batches(path, members):
            for text in values:
                numbers.setdefault(text, len(numbers))
            if len(numbers) > _FORK_MAX_TEXTS:
                return None
            out.append((member, (keys, list(map(numbers.__getitem__, texts)),
                                 {numbers[text]: value for text, value in values.items()})))
    except Exception:  # noqa: BLE001 - whatever it is, the parent's own reading names it
        return None
    return out


def _fast_batches(path: Path, members: tuple[str, ...]) -> Iterator[tuple[str, Batch]]:
    """*members* as ``potato.annotations.json_chunks`` batches; raises GiveUp for the careful reader."""
    return members_batches(path, members, window=_USER_STATE_WINDOW)


def _careful_batches(path: Path, members: tuple[str, ...]) -> Iterator[tuple[str, Batch]]:
    """The same from ``read_user_state_members`` (every entry, duplicates included).

    Texts by ``json.dumps``, which tells apart all that ``json`` parses (NaN from null).
    """
    entries = read_user_state_members(path, members, _USER_STATE_CHUNK)
    for member, run in groupby(entries, itemgetter(0)):
        while batch := list(islice(run, _CAREFUL_BATCH)):
            values = [entry for _, _, entry in batch]
            texts = list(map(json.dumps, values))
            yield member, ([item_id for _, item_id, _ in batch], texts, dict(zip(texts, values)))


def _labels_of(pairs: Iterable[tuple[str, Batch]], beside: FileReadBeside | None = None) -> Iterator[Batch]:
    """The labels member's batches of *pairs*; every batch goes to *beside* first (``read_votes``' one pass)."""
    for member, batch in pairs:
        if beside is not None:
            beside.add(member, batch)
        if member == LABELS_MEMBER:
            yield batch


class _EntryVotes(NamedTuple):
    """What one item's entry (``[[{"schema": S, "name": L}, VALUE], ...]`` or ``{S: {L: VALUE}}``) counts for."""

    packed: dict[str, int]  # schema -> its packed vote counts, only schemas with a vote
    unknown: tuple[tuple[str, str], ...]  # (schema, label) of labels the schema lacks
    bad: str | None  # why the entry is unreadable


def _entry_votes(labels: Any, index: Mapping[str, Mapping[str, int]]) -> _EntryVotes:
    try:
        pairs = _fast_entries(labels)
    except ValueError as exc:
        return _EntryVotes({}, (), str(exc))
    packed: dict[str, int] = {}
    unknown = []
    for schema, label, value in pairs:
        labels_of = index.get(schema)
        if labels_of is None or value in _NOT_SELECTED:
            continue
        position = labels_of.get(label)
        if position is None:
            unknown.append((schema, label))
        else:
            packed[schema] = packed.get(schema, 0) + (1 << (_COUNT_BITS * position))
    return _EntryVotes(packed, tuple(unknown), None)


def _tally_votes(batches: Iterable[Batch], index: Mapping[str, Mapping[str, int]],
                 into: dict[str, dict[str, int]]) -> tuple[list, list]:
    """Add one file's packed votes to *into* (per schema, ids in file order); return its
    unknown labels and unreadable entries.

    The hot loop of a bundle: 1.5 M entries for 1 M items, but a handful of
    distinct ones (a radio schema's entries differ only in the label). Each
    distinct entry text is interpreted once (``_entry_votes``); the per-entry
    work is C-level passes over the batch (``map``, ``compress``,
    ``dict.update``). A file that fails half-way (any exception) has the votes
    it added taken back before the exception goes on, so it contributes
    nothing.
    """
    meaning: dict[Hashable, _EntryVotes] = {}
    added: list[tuple[str, list[str], list[int]]] = []
    file_unknown: list[tuple[tuple[str, str], str]] = []
    file_bad: list[tuple[str, str]] = []
    try:
        for keys, texts, values in batches:
            packed_of: dict[str, dict[Hashable, int]] = {name: {} for name in index}
            troubled = set()
            for text, value in values.items():
                entry = meaning.get(text)
                if entry is None:
                    if len(meaning) >= _MEANINGS:
                        meaning.clear()
                    entry = meaning[text] = _entry_votes(value, index)
                for schema, packed in entry.packed.items():
                    packed_of[schema][text] = packed
                if entry.unknown or entry.bad:
                    troubled.add(text)
            for schema, of_text in packed_of.items():
                if len(of_text) == len(values):  # every entry votes here: no selection needed
                    voters, packed = keys, list(map(of_text.__getitem__, texts))
                elif of_text:
                    voted = list(map(of_text.__contains__, texts))
                    voters, packed = list(compress(keys, voted)), list(map(of_text.__getitem__, compress(texts, voted)))
                else:
                    continue
                _add_packed(into[schema], voters, packed)
                added.append((schema, voters, packed))
            if troubled:
                for item_id, text in zip(keys, texts):
                    if text in troubled:
                        entry = meaning.get(text) or _entry_votes(values[text], index)
                        file_unknown.extend((pair, item_id) for pair in entry.unknown)
                        if entry.bad:
                            file_bad.append((entry.bad, item_id))
    except BaseException:
        _take_back(into, added)
        raise
    return file_unknown, file_bad


def _add_packed(into: dict[str, int], keys: list[str], packed: Iterable[int]) -> None:
    """``into[key] += packed`` for each pair, in order, at C speed; a key may repeat."""
    # The map reads into[key] lazily, after the pairs before it are written.
    into.update(zip(keys, map(add, map(into.get, keys, repeat(0)), packed)))


def _take_back(into: dict[str, dict[str, int]], added: list[tuple[str, list[str], list[int]]]) -> None:
    """Undo ``_add_packed`` calls: subtract, then drop the ids they created (back to no votes)."""
    for schema, keys, packed in added:
        _add_packed(into[schema], keys, map(neg, packed))
    for schema, keys, _ in added:
        per_item = into[schema]
        for key in keys:
            if per_item.get(key) == 0:
                del per_item[key]


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


def aggregate_votes(votes: Votes) -> ChosenLabels:
    """Majority label per item and schema; ties go to the earliest label in the schema.

    Returns the labels and the number of tied (item, schema) pairs per schema.
    Items share a handful of distinct vote counts: each is decided once.
    """
    labels: dict[str, dict[str, int]] = {}
    ties: dict[str, int] = {}
    for schema, per_item in votes.votes.items():
        n_labels = len(votes.schemes[schema])
        winner: dict[int, int] = {}
        tied: set[int] = set()
        for packed in set(per_item.values()):
            counts = unpack_counts(packed, n_labels)
            best = max(counts)
            winner[packed] = counts.index(best)  # first in schema order: the tie-break
            if counts.count(best) > 1:
                tied.add(packed)
        labels[schema] = dict(zip(per_item, map(winner.__getitem__, per_item.values())))
        ties[schema] = sum(map(tied.__contains__, per_item.values())) if tied else 0
    return ChosenLabels(schemes=dict(votes.schemes), labels=labels, ties=ties)


def consensus_votes(votes: Votes) -> ChosenLabels:
    """Dawid-Skene labels per schema (``potato.annotations.consensus``) from ``read_votes(..., per_user=True)``.

    Each label an annotator selected is one observation (a multiselect item
    gives several). With fewer than two annotators it is majority vote, as in
    Potato 2.12. Items are grouped by what each annotator said (their packed
    counts side by side, in C-level passes): EM runs over the distinct groups.
    """
    from potato.annotations.consensus import decide_patterns

    if len(votes.by_user) < 2:
        return aggregate_votes(votes)
    users = list(votes.by_user)
    labels: dict[str, dict[str, int]] = {}
    ties: dict[str, int] = {}
    for schema, names in votes.schemes.items():
        columns = [votes.by_user[user].get(schema, {}) for user in users]
        ids = list(votes.votes[schema])  # every id some annotator labelled
        width = _COUNT_BITS * len(names)
        seen = Counter(_answers(columns, ids, width))
        pattern_of = {code: _observed(code, len(users), width, len(names)) for code in seen}
        patterns: Counter = Counter()
        for code, n in seen.items():
            patterns[pattern_of[code]] += n
        decided, tied = decide_patterns(patterns)
        label_of = {code: decided[pattern] for code, pattern in pattern_of.items()}
        labels[schema] = dict(zip(ids, map(label_of.__getitem__, _answers(columns, ids, width))))
        ties[schema] = sum(n for code, n in seen.items() if pattern_of[code] in tied)
    return ChosenLabels(schemes=dict(votes.schemes), labels=labels, ties=ties)


def _answers(columns: list[dict[str, int]], ids: list[str], width: int) -> Iterator[int]:
    """Each item's answers as one int: annotator u's packed counts in bits [u * width, (u + 1) * width).

    C-level passes; an int hashes and compares faster than a tuple of them."""
    codes: Iterator[int] = map(columns[0].get, ids, repeat(0))
    for u, column in enumerate(columns[1:], start=1):
        codes = map(or_, codes, map(lshift, map(column.get, ids, repeat(0)), repeat(u * width)))
    return codes


def _observed(code: int, n_users: int, width: int, n_labels: int) -> tuple[tuple[int, int], ...]:
    """``((annotator number, label index), ...)`` of one item from its ``_answers`` code."""
    mask = (1 << width) - 1
    return tuple((user, label) for user in range(n_users) if (packed := (code >> (user * width)) & mask)
                 for label, n in enumerate(unpack_counts(packed, n_labels)) if n)


def changed_labels(chosen: ChosenLabels, majority: ChosenLabels) -> dict[str, int]:
    """Per schema, how many items *chosen* labels otherwise than *majority* does."""
    return {schema: sum(map(ne, map(majority.labels[schema].get, per_item), per_item.values()))
            for schema, per_item in chosen.labels.items()}
