"""A Potato project's data: items, annotators' labels, the holdout split, the run bundle.

Pure readers and builders on top, the one function that writes (``build_bundle``)
and the packer below. Nothing here changes the annotators' files: every
``user_state.json`` is opened read-only.

Formats read (mirroring real Potato, ``davidjurgens/potato``):

- items: ``data_files`` in JSON lines (one object per line), a JSON array file
  (any non-CSV/TSV file whose first character is ``[``), ``.csv`` or ``.tsv``
  with a header row (TSV unquoted, as in Potato 2.12), each in its entry's
  encoding; then the files of ``data_directory`` that Potato 2.12 reads there
  (``config.data_directory_files``), whose bad records are skipped with a
  warning as 2.12 skips them. ``item_properties.id_key`` and ``text_key`` name
  the fields; ids become strings. All are streamed.
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
read first). Ties are counted per schema. ``aggregation: consensus`` weighs
annotators by reliability instead (Dawid-Skene, ``potato.consensus``).

Holdout: an item is held out when ``sha256(id)`` read as a fraction of 2**64 is
below ``holdout_fraction`` — stable across Python processes and machines (unlike
``hash()``), independent of item order and of every other item. With Potato
2.12's ``splits``/``split_seed``, its seeded split decides instead, and its
``test`` items are held out (``split_of``), as 2.12 would hold them out.

Media: a string field naming a file with a media extension (image, audio,
video, pdf), relative to ``task_dir`` (or absolute but inside it), is copied to
``media/<same relative path>`` and named under the item's ``"fields"``. A path
that resolves outside ``task_dir`` (``..``, an absolute path elsewhere, a
symlink pointing out) is refused, because the bundle is shipped to other
machines and must not carry files the project does not own. URLs are left alone.

Speed (issue 11: 1 M items, 1.5 M label entries in 3 annotators' files, in
4 s; ``bench/bundle_bench.py``). What costs is per-entry Python, and even
more, touching 500 k-entry dicts: 150-350 ns an operation, cache misses
whether the loop is in C or Python. So the hot paths run as C-level passes
(``map``, ``compress``, ``dict.update``, ``b"".join``) over batches and
touch each big dict once per entry, and the common case never builds a
per-entry object it can skip:

- labels: a batch of entries holds a handful of distinct value texts (a
  radio schema's differ only in the label), each interpreted once
  (``_tally_votes``); ``potato.json_chunks`` does not even parse the others.
  Votes go straight into the totals; a file that fails half-way has its
  votes taken back. With a CPU to spare, the next files are parsed in forked
  children meanwhile (``_ParsedAhead``, ``potato.forked``).
- items: a JSON-lines file is read a MiB of lines at a time; a block whose
  lines are all objects with a string id and text, and that names no media,
  is written whole (``_Block``, ``_block_lines``). Each labelled item's
  outcome (labels, held out) is a few shared bytes objects computed in bulk
  (``_label_outcomes``). Anything else goes the plain way, one item at a
  time, so what is accepted, every error and warning stay as they were.
"""

from __future__ import annotations

import codecs
import csv
import gc
import gzip
import hashlib
import heapq
import io
import json
import math
import os
import re
import shutil
import tarfile
import tempfile
from collections import Counter, defaultdict, deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain, compress, count, islice, repeat
from operator import add, methodcaller, mul, neg
from pathlib import Path
from typing import Any, BinaryIO, Callable, Hashable, Iterable, Iterator, Mapping, NamedTuple, Sequence

import orjson

from potato.config import ProjectConfig, Scheme, data_directory_files
from potato.errors import ProjectDataError
from potato.forked import Forked, ForkFailed, can_fork
from potato.json_chunks import WINDOW, Batch, GiveUp, member_batches

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
# Bytes of whole JSON lines parsed and checked at a time (tests make it tiny).
_LINES_BLOCK = 1 << 20
_USER_STATE_CHUNK = 1 << 20
_USER_STATE_WINDOW = WINDOW  # the fast reader's (potato.json_chunks)


# --------------------------------------------------------------------------- records


class Item(NamedTuple):
    """One item of a data file: its id, text, other fields and where it was read.

    A named tuple, not a frozen dataclass: built once per item, 1 M times a
    bundle, and a tuple is built several times faster.
    """

    id: str
    text: str
    fields: Mapping[str, Any]
    file: Path
    line: int


class _Block(NamedTuple):
    """Consecutive items of a JSON-lines file, each line a JSON object with a
    non-empty string id and a string text: what almost every line of a real
    data file is. The bundle writes a block with a few C-level passes over
    these lists instead of a loop per item; anything else takes ``items()``.
    """

    ids: list[str]
    texts: list[str]
    records: list[dict[str, Any]]
    file: Path
    first_line: int
    may_name_media: bool  # a string in it may name a media file (then each item is looked at)

    def items(self) -> Iterator[Item]:
        return map(Item, self.ids, self.texts, self.records, repeat(self.file), count(self.first_line))


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
    label_counts: dict[str, dict[str, int]]
    users: tuple[str, ...]
    media_files: int
    unknown_item_labels: int
    skipped_annotations: int
    warnings: tuple[str, ...]


def describe_bundle(info: BundleInfo) -> str:
    """One line for the run log: what the run trains on."""
    def labels(schema: str) -> str:
        return ", ".join(f"{label} {n}" for label, n in info.label_counts.get(schema, {}).items())

    per_schema = "; ".join(
        f"{schema}: {count} labelled ({labels(schema)}; {info.holdout.get(schema, 0)} held out, "
        f"{info.ties.get(schema, 0)} ties)"
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
    record: Any, id_key: str, text_key: str, path: Path, line: int, shown: str,
    skipped: _Grouped | None = None,
) -> Item | None:
    """The item in *record*; with *skipped* (a data_directory file), a bad record is
    skipped (None) and counted there instead of raising, as Potato 2.12 does."""
    if not isinstance(record, dict):
        if skipped is not None:
            skipped.add((shown, "line(s) {listed} hold no JSON object; skipped"), line)
            return None
        raise ProjectDataError(
            f"{shown} line {line}: expected a JSON object per item, got "
            f"{type(record).__name__}; write one object per line, e.g. "
            f'{{"{id_key}": "1", "{text_key}": "..."}}'
        )
    item_id = record.get(id_key)
    if item_id is None or item_id == "":
        if skipped is not None:
            skipped.add((shown, f"the item(s) at line(s) {{listed}} have no {id_key!r} field "
                         "(item_properties.id_key); skipped"), line)
            return None
        raise ProjectDataError(
            f"{shown} line {line}: the item has no {id_key!r} field "
            f"(item_properties.id_key); its fields are {sorted(record)!r}. Add the id, "
            f"or set item_properties.id_key to the field that holds it"
        )
    if text_key not in record or record[text_key] is None:
        if skipped is None:
            raise ProjectDataError(
                f"{shown} line {line}: item {str(item_id)!r} has no {text_key!r} field "
                f"(item_properties.text_key); its fields are {sorted(record)!r}. Add the text, "
                f"or set item_properties.text_key to the field that holds it"
            )
        # Potato 2.12 serves such an item with an empty text; it trains as one too.
        skipped.add((shown, f"item(s) {{listed}} have no {text_key!r} field; they train with an empty "
                     "text"), str(item_id))
        record = {**record, text_key: ""}
    text = record[text_key]
    if not isinstance(text, str):
        # Potato displays non-string text (numbers, lists) via str(); do the same.
        text = json.dumps(text, ensure_ascii=False) if isinstance(text, (list, dict)) else str(text)
    return Item(str(item_id), text, record, path, line)


def _read_json_lines(handle: Iterable[str], path: Path, shown: str, first_line: int = 1) -> Iterator[tuple[int, Any]]:
    for line_no, raw in enumerate(handle, start=first_line):
        if not raw.strip():
            continue
        try:
            yield line_no, json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ProjectDataError(
                f"{shown} line {line_no}: not valid JSON: {exc.msg} (column {exc.colno}). "
                f"Each line must hold one complete JSON object"
            ) from exc


def _read_utf8_json_lines(path: Path, shown: str, keys: tuple[str, str]) -> Iterator[_Block | tuple[int, Any]]:
    """``_read_json_lines`` of a UTF-8 file, parsed as bytes by orjson about a MiB of lines at a time.

    A block of lines that all hold what a bundle expects (``_clean_block``)
    comes out whole, as a ``_Block``. In any other block each line goes its
    own way, as ``(line, record)``: a line orjson refuses (a blank line,
    ``NaN``, a lone ``\\r`` splitting it, invalid JSON or UTF-8) goes through
    the text reader, so what is accepted and every error's text stay the
    same. So does a line whose id or text (*keys*) orjson read as a float: it
    reads an integer past 64 bits as one, and an id must keep every digit.
    """
    loads = orjson.loads
    id_key, text_key = keys
    line_no = 1
    extra = 0  # lines a lone \r made that binary line splitting does not see
    with open(path, "rb") as handle:
        for number, block in enumerate(_line_blocks(handle)):
            if number == 0 and block.startswith(codecs.BOM_UTF8):
                block = block[len(codecs.BOM_UTF8):]
            lines = block.split(b"\n")
            if not lines[-1]:
                lines.pop()  # what follows the block's last newline
            clean = _clean_block(lines, id_key, text_key)
            if clean is not None:
                yield _Block(*clean, path, line_no + extra, _may_name_media(block))
                line_no += len(lines)
                continue
            for raw in io.BytesIO(block):
                try:
                    record = loads(raw)
                    if type(record) is dict and (type(record.get(id_key)) is float
                                                 or type(record.get(text_key)) is float):
                        raise orjson.JSONDecodeError("a float", "", 0)
                except orjson.JSONDecodeError:
                    pieces = io.StringIO(raw.decode("utf-8"), newline="").readlines()
                    yield from _read_json_lines(pieces, path, shown, line_no + extra)
                    extra += len(pieces) - 1
                else:
                    yield line_no + extra, record
                line_no += 1


def _line_blocks(handle: BinaryIO) -> Iterator[bytes]:
    """Whole lines of *handle*, about ``_LINES_BLOCK`` bytes at a time (the last may lack its newline)."""
    pending: list[bytes] = []
    while data := handle.read(_LINES_BLOCK):
        cut = data.rfind(b"\n") + 1
        if not cut:  # a line longer than a block
            pending.append(data)
            continue
        pending.append(data[:cut])
        yield b"".join(pending)
        pending = [data[cut:]]
    if tail := b"".join(pending):
        yield tail


def _clean_block(lines: list[bytes], id_key: str, text_key: str) -> tuple[list[str], list[str], list[dict]] | None:
    """``(ids, texts, records)`` when every line is a JSON object with a non-empty string id
    and a string text, as orjson reads it; else None. C-level passes, no loop per line."""
    try:
        records = list(map(orjson.loads, lines))
    except orjson.JSONDecodeError:
        return None
    if set(map(type, records)) != {dict}:
        return None
    ids = list(map(dict.get, records, repeat(id_key)))
    texts = list(map(dict.get, records, repeat(text_key)))
    if set(map(type, ids)) != {str} or set(map(type, texts)) != {str} or "" in ids:
        return None
    return ids, texts, records


# A string value looks_like_media accepts ends in '.' and three or four letters
# or digits (lower-cased), so its JSON ends so before the closing quote: as
# written, or with some of them escaped (\u0070), or with the Kelvin sign,
# which lower() turns into the k of .mkv. A block without such an ending names
# no media. The escaped dot is looked for apart: an alternation at the start
# makes the search six times slower.
_EXT_CHAR = rb"(?:[A-Za-z0-9]|\\u00[2-7][0-9A-Fa-f]|\\u212[Aa]|\xe2\x84\xaa)"
_MEDIA_ENDING = re.compile(rb"\." + _EXT_CHAR + rb"{3,4}\"")
_ESCAPED_MEDIA_ENDING = re.compile(rb"\\u002[Ee]" + _EXT_CHAR + rb"{3,4}\"")


def _may_name_media(block: bytes) -> bool:
    """Whether a string in *block* (JSON text) could name a media file (``looks_like_media``)."""
    return (_MEDIA_ENDING.search(block) is not None
            or (b"\\u002" in block and _ESCAPED_MEDIA_ENDING.search(block) is not None))


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
    # TSV has no quoting (IANA text/tab-separated-values): a '"' is text, as in
    # Potato 2.12's parser. A short row gets "" for its missing cells.
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    reader = csv.DictReader(handle, delimiter=delimiter, quoting=quoting, restval="")
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


def _file_parts(path: Path, id_key: str, text_key: str, base: Path | None = None, *,
                encoding: str = "utf-8", skipped: _Grouped | None = None) -> Iterator[Item | _Block]:
    """``read_items_file``, with blocks of clean JSON lines left whole (``_Block``)."""
    shown = show_path(path, base)
    # utf-8-sig: a byte order mark at the start is not part of the first item.
    codec = "utf-8-sig" if codecs.lookup(encoding).name == "utf-8" else encoding
    try:
        handle = open(path, "r", encoding=codec, newline="")
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
            elif codec == "utf-8-sig":
                records = _read_utf8_json_lines(path, shown, (id_key, text_key))
            else:
                records = _read_json_lines(handle, path, shown)
            for part in records:
                if type(part) is _Block:
                    yield part
                    continue
                item = _item_from_record(part[1], id_key, text_key, path, part[0], shown, skipped)
                if item is not None:
                    yield item
        except UnicodeDecodeError as exc:
            name = "UTF-8" if codec == "utf-8-sig" else encoding
            raise ProjectDataError(
                f"{shown}: not {name} text ({exc.reason}); save it as {name}, or name its encoding "
                "in the config (data_files: [{path: ..., encoding: latin-1}])"
            ) from exc


def _items_of(parts: Iterable[Item | _Block]) -> Iterator[Item]:
    for part in parts:
        if type(part) is _Block:
            yield from part.items()
        else:
            yield part


def read_items_file(path: Path, id_key: str, text_key: str, base: Path | None = None, *,
                    encoding: str = "utf-8", skipped: _Grouped | None = None) -> Iterator[Item]:
    """Yield the items of one data file, streaming.

    Raises ``ProjectDataError`` naming the file (relative to *base*) and line
    for unreadable files, malformed JSON and missing id/text fields; with
    *skipped*, records without an id are skipped and counted there instead.
    """
    return _items_of(_file_parts(path, id_key, text_key, base, encoding=encoding, skipped=skipped))


def _item_parts(config: ProjectConfig, skipped: _Grouped | None = None) -> Iterator[Item | _Block]:
    """``iter_items``, with blocks of clean JSON lines left whole (``_Block``)."""
    for path in config.data_files:
        encoding = config.data_file_encodings.get(path, "utf-8")
        yield from _file_parts(Path(path), config.id_key, config.text_key, config.task_dir, encoding=encoding)
    if config.data_directory is not None:
        skipped = _Grouped() if skipped is None else skipped
        for path in data_directory_files(config.data_directory):
            yield from _file_parts(path, config.id_key, config.text_key, config.task_dir,
                                   encoding=config.data_directory_encoding, skipped=skipped)


def iter_items(config: ProjectConfig, skipped: _Grouped | None = None) -> Iterator[Item]:
    """Yield every item of ``config.data_files``, then of ``config.data_directory``, in order.

    No duplicate check. A data_directory file is read as Potato 2.12 reads it
    (``potato.config.data_directory_files``): its bad records are skipped and
    counted in *skipped* rather than stopping the run.
    """
    return _items_of(_item_parts(config, skipped))


def _find_first(config: ProjectConfig, item_id: str) -> Item | None:
    # Only called on the error path: re-reading keeps the happy path to a set of ids.
    for item in iter_items(config):
        if item.id == item_id:
            return item
    return None


def _first_use(config: ProjectConfig, item: Item, seen: set[str], skipped: _Grouped) -> bool:
    """Whether *item*'s id is new (then it is added to *seen*). A repeat in a
    data_directory file is counted in *skipped* (Potato 2.12 keeps the first);
    anywhere else it raises ``ProjectDataError`` naming both lines."""
    if item.id not in seen:
        seen.add(item.id)
        return True
    if config.data_directory is not None and item.file.parent == config.data_directory:
        skipped.add((show_path(item.file, config.task_dir), "item(s) {listed} repeat an id read "
                     "before; skipped (the first was kept)"), item.id)
        return False
    here = f"{show_path(item.file, config.task_dir)} line {item.line}"
    first = _find_first(config, item.id)
    there = f"{show_path(first.file, config.task_dir)} line {first.line}" if first else "an earlier line"
    raise ProjectDataError(
        f"{here}: duplicate item id {item.id!r}, first used at {there}. "
        f"Each item needs its own {config.id_key!r}"
    )


def _claim_ids(seen: set[str], ids: list[str]) -> bool:
    """Add a block's *ids* to *seen* when none repeats (in the block or before it);
    else leave *seen* as it was and return False, for ``_first_use`` to name the repeat."""
    if not seen.isdisjoint(ids):
        return False
    before = len(seen)
    seen.update(ids)
    if len(seen) - before == len(ids):
        return True
    seen.difference_update(ids)  # a repeat within the block: all of them were new
    return False


def read_items(config: ProjectConfig, skipped: _Grouped | None = None) -> Iterator[Item]:
    """Yield every item once, in data-file order; raise on a duplicate id.

    Keeps only a set of ids seen (the first occurrence is found again by
    re-reading when a duplicate turns up). In a data_directory file a
    duplicate is skipped and counted in *skipped* instead, as Potato 2.12
    keeps the first there.
    """
    seen: set[str] = set()
    skipped = _Grouped() if skipped is None else skipped
    for item in iter_items(config, skipped):
        if _first_use(config, item, seen, skipped):
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


# The members of user_state.json whose keys are items an annotator annotated
# (Potato 2.12's UserState.get_all_annotations: labels, spans, links, events).
_ANNOTATED_KEYS = ("instance_id_to_label_to_value", "instance_id_to_span_to_value",
                   "instance_id_to_link_to_value", "instance_id_to_event_to_value")


def count_user_state_annotations(path: Path, chunk: int = 1 << 20) -> int:
    """How many items one annotator annotated, counted as Potato 2.12 counts for ``auto_retrain``.

    2.12's ``maybe_auto_retrain`` sums ``len(get_all_annotations())`` over
    users: the items with an entry in any of ``_ANNOTATED_KEYS``. Streams the
    file (values are walked, not kept). Raises ``UserStateError``, ``OSError``
    or ``UnicodeDecodeError`` for a file that cannot be read.
    """
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
    return len(annotated)


def read_votes(
    annotation_dir: Path,
    schemes: Sequence[Scheme],
    base: Path | None = None,
    *,
    per_user: bool = False,
) -> Votes:
    """Read every annotator's votes for *schemes* from ``user_state.json`` files.

    Never raises on a bad file: an unparseable or oddly shaped file is skipped
    with a warning (path and reason), a label not among its schema's labels is
    skipped with a warning (file, item, schema, label). Labels for schemas not
    in *schemes* are ignored (they are not being trained). With *per_user*,
    ``by_user`` keeps each annotator's votes too (more memory; for consensus).
    """
    index = {s.name: {label: i for i, label in enumerate(s.labels)} for s in schemes}
    result = Votes(schemes={s.name: tuple(s.labels) for s in schemes}, votes={s.name: {} for s in schemes})
    unknown = _Grouped()
    bad_entries = _Grouped()
    states = find_user_states(annotation_dir)
    with _ParsedAhead([path for _, path in states]) as parsed:
        for user, path in states:
            shown = show_path(path, base)
            into = {name: {} for name in index} if per_user else result.votes
            try:
                batches = parsed.take(path)
                try:
                    file_unknown, file_bad = _tally_votes(
                        _fast_label_batches(path) if batches is None else batches, index, into)
                except GiveUp:  # odd or broken: the careful reader names the problem
                    file_unknown, file_bad = _tally_votes(_careful_label_batches(path), index, into)
            except (OSError, UnicodeDecodeError) as exc:
                result.warnings.append(f"{shown}: skipped, it cannot be read ({exc})")
                continue
            except UserStateError as exc:
                result.warnings.append(f"{shown}: skipped, {exc}")
                continue
            result.users.append(user)
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
                f"{key[0]}: item(s) {listed} have label {key[2]!r} for schema {key[1]!r}, which is "
                f"not one of its labels {list(index[key[1]])!r}; those annotations were skipped. "
                f"Fix the label in the config's annotation_schemes if {key[2]!r} is meant to be one"
            )
        )
    )
    result.warnings.extend(bad_entries.render(lambda key, listed: f"{key[0]}: item(s) {listed} skipped: {key[1]}"))
    return result


# Entries of the careful reader tallied at a time.
_CAREFUL_BATCH = 4096
# Distinct entry texts whose meaning is remembered across batches (a bound on memory
# when every entry differs, as free-text values would).
_MEANINGS = 1024


# Files at least this large are parsed in forked children (potato.forked), as
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

    def __init__(self, paths: list[Path]) -> None:
        self.waiting = deque(p for p in paths if _size(p) >= _FORK_MIN_BYTES) if _cpu_to_spare() else deque()
        self.running: dict[Path, Forked] = {}
        self.ahead = os.cpu_count() or 1

    def take(self, path: Path) -> list[Batch] | None:
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
                self.running[path] = Forked(_parsed_labels, path)
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


def _parsed_labels(path: Path) -> list[Batch] | None:
    """In a forked child: the file's batches, each distinct text numbered (a small
    pickle), or None for the parent to read it (any problem, too many texts)."""
    numbers: dict[Hashable, int] = {}
    out = []
    try:
        for keys, texts, values in _fast_label_batches(path):
            for text in values:
                numbers.setdefault(text, len(numbers))
            if len(numbers) > _FORK_MAX_TEXTS:
                return None
            out.append((keys, list(map(numbers.__getitem__, texts)),
                        {numbers[text]: value for text, value in values.items()}))
    except Exception:  # noqa: BLE001 - whatever it is, the parent's own reading names it
        return None
    return out


def _fast_label_batches(path: Path) -> Iterator[Batch]:
    """The labels member as ``potato.json_chunks`` batches; raises GiveUp for the careful reader."""
    return member_batches(path, _LABELS_KEY, window=_USER_STATE_WINDOW)


def _careful_label_batches(path: Path) -> Iterator[Batch]:
    """The same from ``read_user_state_labels`` (every member, duplicates included).

    Texts by ``json.dumps``, which tells apart all that ``json`` parses (NaN from null).
    """
    entries = read_user_state_labels(path, _USER_STATE_CHUNK)
    while batch := list(islice(entries, _CAREFUL_BATCH)):
        values = [labels for _, labels in batch]
        texts = list(map(json.dumps, values))
        yield [item_id for item_id, _ in batch], texts, dict(zip(texts, values))


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


def aggregate_votes(votes: Votes) -> Aggregated:
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
    return Aggregated(schemes=dict(votes.schemes), labels=labels, ties=ties)


def consensus_votes(votes: Votes) -> Aggregated:
    """Dawid-Skene labels per schema (``potato.consensus``) from ``read_votes(..., per_user=True)``.

    Each label an annotator selected is one observation (a multiselect item
    gives several). With fewer than two annotators it is majority vote, as in
    Potato 2.12.
    """
    from potato.consensus import dawid_skene

    if len(votes.by_user) < 2:
        return aggregate_votes(votes)
    labels: dict[str, dict[str, int]] = {}
    ties: dict[str, int] = {}
    for schema, names in votes.schemes.items():
        observations: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for user, per_schema in votes.by_user.items():
            for item_id, packed in per_schema.get(schema, {}).items():
                for index, count in enumerate(unpack_counts(packed, len(names))):
                    if count:
                        observations[item_id].append((user, index))
        labels[schema], ties[schema] = dawid_skene(observations)
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


def holdout_flags(item_ids: list[str], fraction: float) -> list[bool]:
    """``is_holdout`` of each id, in C-level passes (a bundle asks about 500 k at once)."""
    if not fraction > 0:
        return [False] * len(item_ids)
    if fraction >= 1:
        return [True] * len(item_ids)
    # For an integer x, x < fraction * 2**64 exactly when x < its ceiling; and
    # a 32-byte digest sorts below that bound's 8 bytes exactly when its first
    # 8 bytes do (equal first bytes sort the longer digest after).
    limit = math.ceil(fraction * 2**64).to_bytes(8, "big")
    digests = map(methodcaller("digest"), map(hashlib.sha256, map(str.encode, item_ids)))
    return list(map(limit.__gt__, digests))


def split_holdout(item_ids: Iterable[str], fraction: float) -> set[str]:
    """The ids of *item_ids* that are held out (see ``is_holdout``)."""
    ids = list(item_ids)
    return set(compress(ids, holdout_flags(ids, fraction)))


def split_of(item_id: str, splits: Mapping[str, float], seed: int) -> str:
    """The split Potato 2.12 puts *item_id* in (its ``publish/preprocessing._partition_splits``).

    ``sha256(f"{seed}:{id}")``'s first 8 hex digits over 0xFFFFFFFF fall in one
    of the cumulative bands of *splits* (normalised, in the order given).
    Same id, same split: on every run, backend and machine, and in 2.12.
    """
    total = sum(splits.values()) or 1.0
    fraction = int(hashlib.sha256(f"{seed}:{item_id}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    bound = 0.0
    for name, share in splits.items():
        bound += share / total
        if fraction <= bound:
            return name
    return name


def holdout_rule(config: ProjectConfig, fraction: float | None = None
                 ) -> tuple[Callable[[list[str]], list[bool]], dict]:
    """``(which of these ids are held out?, how the manifest describes the split)`` for *config*.

    Potato 2.12's ``splits``/``split_seed`` hold out its ``test`` split; else
    ``holdout_fraction`` (or *fraction*, when given) does, by ``is_holdout``.
    """
    mt = config.model_training
    if fraction is None and mt.splits is not None:
        splits, seed = dict(mt.splits), mt.split_seed or 0
        return (lambda ids: [split_of(i, splits, seed) == "test" for i in ids]), {"splits": splits, "split_seed": seed}
    fraction = mt.holdout_fraction if fraction is None else fraction
    if not 0 <= fraction < 1:
        raise ProjectDataError(f"holdout_fraction must be at least 0 and below 1, got {fraction!r}")
    return (lambda ids: holdout_flags(ids, fraction)), {"holdout_fraction": fraction}


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


def _dump_line(record: dict[str, Any]) -> bytes:
    """One line of items.jsonl: compact JSON, UTF-8, newline-terminated (orjson)."""
    try:
        return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:  # a lone surrogate from a \\ud800 escape: the stdlib escapes it
        return (json.dumps(record, separators=(",", ":")) + "\n").encode("ascii")


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
    votes = read_votes(config.output_annotation_dir, schemes, base, per_user=consensus)
    aggregated = consensus_votes(votes) if consensus else aggregate_votes(votes)
    votes.votes.clear()  # the aggregated labels are all we need from here
    votes.by_user.clear()
    warnings = list(votes.warnings)
    # Popped as items are written: what is left are labels for ids the data lacks.
    outcome_of, outcomes = _label_outcomes(aggregated, held_out)
    aggregated.labels.clear()

    skipped_items = _Grouped()
    tmp_items = dest / "items.jsonl.tmp"
    with open(tmp_items, "wb") as out:
        writer = _ItemsWriter(config, dest, out, outcome_of, outcomes, skipped_items)
        for part in _item_parts(config, skipped_items):
            writer.write(part)
    os.replace(tmp_items, dest / "items.jsonl")

    unknown_ids = len(outcome_of)
    if unknown_ids:
        examples = ", ".join(repr(i) for i in heapq.nsmallest(_WARNING_EXAMPLES, outcome_of))
        warnings.append(
            f"{show_path(config.output_annotation_dir, base)}: {unknown_ids} labelled item id(s) "
            f"are not in the data files and were ignored (e.g. {examples}); were items "
            f"removed from data_files, or ids changed?"
        )
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
    labeled = {n: 0 for n in names}
    holdout = {n: 0 for n in names}
    per_label = {s.name: dict.fromkeys(s.labels, 0) for s in schemes}
    for outcome_json, n in writer.written.items():
        outcome = outcomes[outcome_json]
        for schema, label in outcome.labels.items():
            labeled[schema] += n
            per_label[schema][label] += n
            if outcome.holdout:
                holdout[schema] += n
    counts = {
        "items": sum(writer.written.values()),
        "labeled": labeled,
        "holdout": holdout,
        "ties": {n: aggregated.ties[n] for n in names},
        "labels": per_label,
    }
    manifest = {
        "format": BUNDLE_FORMAT,
        "schemas": {s.name: list(s.labels) for s in schemes},
        "id_key": config.id_key,
        "text_key": config.text_key,
        **split,
        "aggregation": config.model_training.aggregation,
        "counts": counts,
    }
    tmp_manifest = dest / "manifest.json.tmp"
    tmp_manifest.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp_manifest, dest / "manifest.json")

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
    )


class _ItemsWriter:
    """Writes items.jsonl: a clean block (``_Block``) in C-level passes, any other item
    alone, as before; counts the outcomes written and copies media."""

    def __init__(self, config: ProjectConfig, dest: Path, out: BinaryIO, outcome_of: dict[str, bytes],
                 outcomes: dict[bytes, _Outcome], skipped: _Grouped) -> None:
        self.config, self.dest, self.out = config, dest, out
        self.outcome_of, self.outcomes = outcome_of, outcomes
        self.skipped = skipped
        self.written: Counter[bytes] = Counter()  # outcome JSON -> items written with it
        self.seen: set[str] = set()
        self.copied: set[Path] = set()
        self.missing_media = _Grouped()

    def write(self, part: Item | _Block) -> None:
        if type(part) is _Block and not part.may_name_media and _claim_ids(self.seen, part.ids):
            self.out.write(_block_lines(part, self.outcome_of, self.written))
            return
        for item in part.items() if type(part) is _Block else (part,):
            if _first_use(self.config, item, self.seen, self.skipped):
                self.out.write(self._line(item))

    def _line(self, item: Item) -> bytes:
        config = self.config
        outcome_json = self.outcome_of.pop(item.id, _UNLABELLED)
        self.written[outcome_json] += 1
        outcome = self.outcomes[outcome_json]
        record = {"id": item.id, "text": item.text, "labels": outcome.labels, "holdout": outcome.holdout}
        media_fields = _media_fields(item, config.task_dir, config, self.missing_media)
        if media_fields:
            for rel in media_fields.values():
                if rel not in self.copied:
                    target = self.dest / "media" / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(config.task_dir / rel, target)
                    self.copied.add(rel)
            record["fields"] = {k: v.as_posix() for k, v in media_fields.items()}
        return _dump_line(record)


class _Outcome(NamedTuple):
    """What items.jsonl says of an item besides its id and text."""

    labels: dict[str, str]
    holdout: bool


def _outcome_json(outcome: _Outcome) -> bytes:
    """``"labels":{...},"holdout":false``: an items.jsonl line's end, as orjson writes the whole line."""
    return orjson.dumps({"labels": outcome.labels, "holdout": outcome.holdout})[1:-1]


_UNLABELLED = _outcome_json(_Outcome({}, False))
# An items.jsonl line from the JSON of its id, text and outcome (orjson's compact form).
_LINE = b'{"id":%b,"text":%b,%b}\n'


def _label_outcomes(aggregated: Aggregated, held_out: Callable[[list[str]], list[bool]]
                    ) -> tuple[dict[str, bytes], dict[bytes, _Outcome]]:
    """``({labelled item id: its outcome's JSON}, {outcome JSON: _Outcome})``, unlabelled items' included.

    Half a million labelled items share a handful of outcomes (a label per
    schema, held out or not). Each item's is computed as an integer code in
    C-level passes (per schema the label index + 1, or 0, in mixed radix;
    then times 2 plus held out), each distinct code's JSON is built once, and
    the items share those bytes objects.
    """
    schemas = [(name, per_item, aggregated.schemes[name]) for name, per_item in aggregated.labels.items()]
    if len(schemas) == 1:  # the common case: no union of ids, no lookups
        ids = list(schemas[0][1])
        codes: Iterable[int] = map(_plus_one, schemas[0][1].values())
    else:
        ids = list(dict.fromkeys(chain.from_iterable(per_item for _, per_item, _ in schemas)))
        codes = repeat(0)
        for _, per_item, labels in schemas:
            codes = map(add, map(mul, codes, repeat(len(labels) + 1)),
                        map(_plus_one, map(per_item.get, ids, repeat(-1))))
    codes = list(map(add, map(mul, codes, repeat(2)), held_out(ids)))
    json_of_code = {}
    outcomes = {_UNLABELLED: _Outcome({}, False)}
    for code in set(codes):
        rest, labels_of = code >> 1, []
        for name, _, labels in reversed(schemas):
            rest, index = divmod(rest, len(labels) + 1)
            if index:
                labels_of.append((name, labels[index - 1]))
        outcome = _Outcome(dict(reversed(labels_of)), bool(code & 1))
        json_of_code[code] = _outcome_json(outcome)
        outcomes[json_of_code[code]] = outcome
    return dict(zip(ids, map(json_of_code.__getitem__, codes))), outcomes


_plus_one = (1).__add__


def _block_lines(block: _Block, outcome_of: dict[str, bytes], written: Counter[bytes]) -> bytes:
    """A block's items.jsonl lines: the same bytes as ``_dump_line`` of each item's record, built in C-level passes."""
    outcome_json = list(map(outcome_of.pop, block.ids, repeat(_UNLABELLED)))
    written.update(outcome_json)
    dumps = orjson.dumps
    return b"".join(map(_LINE.__mod__, zip(map(dumps, block.ids), map(dumps, block.texts), outcome_json)))


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
