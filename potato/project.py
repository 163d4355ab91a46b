"""A Potato project's items and the run bundle built from them.

Pure readers on top, the one function that writes (``build_bundle``) and the
packer below. The bundle joins three readers: the items (here), the
annotators' labels (``potato.labels``) and the holdout split
(``potato.holdout``). Nothing here changes the project's files.

Items read (mirroring real Potato, ``davidjurgens/potato``):

``data_files`` in JSON lines (one object per line), a JSON array file
(any non-CSV/TSV file whose first character is ``[``), ``.csv`` or ``.tsv``
with a header row (TSV unquoted, as in Potato 2.12), each in its entry's
encoding; then the files of ``data_directory`` that Potato 2.12 reads there
(``config.data_directory_files``), whose bad records are skipped with a
warning as 2.12 skips them. ``item_properties.id_key`` and ``text_key`` name
the fields; ids become strings. All are streamed.

Media: a string field naming a file with a media extension (image, audio,
video, pdf), relative to ``task_dir`` (or absolute but inside it), is copied to
``media/<same relative path>`` and named under the item's ``"fields"``. A path
that resolves outside ``task_dir`` (``..``, an absolute path elsewhere, a
symlink pointing out) is refused, because the bundle is shipped to other
machines and must not carry files the project does not own. URLs are left alone.

Speed (the target: 1 M items, 1.5 M label entries in 3 annotators' files, in
4 s; ``bench/bundle_bench.py``). What costs is per-entry Python, and even
more, touching 500 k-entry dicts: 150-350 ns an operation, cache misses
whether the loop is in C or Python. So the hot paths run as C-level passes
(``map``, ``compress``, ``dict.update``, ``b"".join``) over batches and
touch each big dict once per entry, and the common case never builds a
per-entry object it can skip (the labels' part: ``potato.labels``):

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
import io
import json
import os
import re
import shutil
import tarfile
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain, count, repeat
from operator import add, mul
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence

import orjson

from potato.aggregation import Coded, aggregate
from potato.answer_kinds import CONTINUOUS, MULTILABEL, NOMINAL, ORDINAL, SPAN, TEXT, UNSUPPORTED
from potato.answers import needs_answers, read_answers
from potato.config import ProjectConfig, Scheme, data_directory_files
from potato.data_warnings import GroupedWarnings, show_path
from potato.errors import ProjectDataError
from potato.holdout import holdout_rule
from potato.labels import describe_not_items, drop_not_items, read_votes, read_votes_on
from potato.rendered_text import DISPLAYED_TEXT_FIELD, renders_raw_text, spans_to_raw
from potato.scheme_fields import answer_spec
from potato.training import atomic_files
from potato.training.escaping import json_bytes, quote

BUNDLE_FORMAT = 1

MEDIA_EXTENSIONS = frozenset(
    ".png .jpg .jpeg .gif .webp .bmp .tif .tiff .svg "
    ".wav .mp3 .flac .ogg .m4a .aac .opus "
    ".mp4 .webm .mov .avi .mkv .pdf".split()
)

# Characters read at a time from a JSON array data file (tests make it tiny to
# exercise elements split across chunks).
_ARRAY_CHUNK = 1 << 20
# Bytes of whole JSON lines parsed and checked at a time (tests make it tiny).
_LINES_BLOCK = 1 << 20


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


# --------------------------------------------------------------------------- items


def _item_from_record(
    record: Any, id_key: str, text_key: str, path: Path, line: int, shown: str,
    skipped: GroupedWarnings | None = None,
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
                f"{shown} line {line}: item {quote(str(item_id))} has no {text_key!r} field "
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
    item_id = str(item_id)
    _check_id_encodes(item_id, f"{shown} line {line}")
    return Item(item_id, text, record, path, line)


def _check_id_encodes(item_id: str, where: str) -> None:
    """Raise ``ProjectDataError`` naming *where* when *item_id* holds a lone surrogate.

    JSON can carry one (a ``\\ud83d`` escape with no pair); UTF-8 cannot, so
    neither the bundle, the holdout split nor the writeback could name the
    item. Only the JSON readers can produce one: text decoding refuses it.
    """
    try:
        item_id.encode("utf-8")
    except UnicodeEncodeError:
        raise ProjectDataError(
            f"{where}: item id {quote(item_id)} holds a lone surrogate (an escape such as \\ud83d without "
            "its pair), which UTF-8 cannot encode; change the id in the data file"
        ) from None


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
                encoding: str = "utf-8", skipped: GroupedWarnings | None = None) -> Iterator[Item | _Block]:
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
                    encoding: str = "utf-8", skipped: GroupedWarnings | None = None) -> Iterator[Item]:
    """Yield the items of one data file, streaming.

    Raises ``ProjectDataError`` naming the file (relative to *base*) and line
    for unreadable files, malformed JSON and missing id/text fields; with
    *skipped*, records without an id are skipped and counted there instead.
    """
    return _items_of(_file_parts(path, id_key, text_key, base, encoding=encoding, skipped=skipped))


def _item_parts(config: ProjectConfig, skipped: GroupedWarnings | None = None) -> Iterator[Item | _Block]:
    """``iter_items``, with blocks of clean JSON lines left whole (``_Block``)."""
    for path in config.data_files:
        encoding = config.data_file_encodings.get(path, "utf-8")
        yield from _file_parts(Path(path), config.id_key, config.text_key, config.task_dir, encoding=encoding)
    if config.data_directory is not None:
        skipped = GroupedWarnings() if skipped is None else skipped
        for path in data_directory_files(config.data_directory):
            yield from _file_parts(path, config.id_key, config.text_key, config.task_dir,
                                   encoding=config.data_directory_encoding, skipped=skipped)


def iter_items(config: ProjectConfig, skipped: GroupedWarnings | None = None) -> Iterator[Item]:
    """Yield every item of ``config.data_files``, then of ``config.data_directory``, in order.

    No duplicate check. A data_directory file is read as Potato 2.12 reads it
    (``potato.config.data_directory_files``): its bad records are skipped and
    counted in *skipped* rather than stopping the run.
    """
    return _items_of(_item_parts(config, skipped))


def item_ids(config: ProjectConfig) -> set[str]:
    """The ids of every item, read without writing anything (duplicates are the bundle's to name)."""
    return _ids_of(_item_parts(config, GroupedWarnings()))


def item_ids_of_files(config: ProjectConfig, files: Iterable[Path]) -> set[str]:
    """The ids of the items of *files*, some of ``config.data_files``."""
    return _ids_of(chain.from_iterable(
        _file_parts(Path(path), config.id_key, config.text_key, config.task_dir,
                    encoding=config.data_file_encodings.get(path, "utf-8")) for path in files))


def _ids_of(parts: Iterable[Item | _Block]) -> set[str]:
    ids: set[str] = set()
    for part in parts:
        if type(part) is _Block:
            ids.update(part.ids)
        else:
            ids.add(part.id)
    return ids


def _find_first(config: ProjectConfig, item_id: str) -> Item | None:
    # Only called on the error path: re-reading keeps the happy path to a set of ids.
    for item in iter_items(config):
        if item.id == item_id:
            return item
    return None


def _first_use(config: ProjectConfig, item: Item, seen: set[str], skipped: GroupedWarnings) -> bool:
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
        f"{here}: duplicate item id {quote(item.id)}, first used at {there}. "
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


def read_items(config: ProjectConfig, skipped: GroupedWarnings | None = None) -> Iterator[Item]:
    """Yield every item once, in data-file order; raise on a duplicate id.

    Keeps only a set of ids seen (the first occurrence is found again by
    re-reading when a duplicate turns up). In a data_directory file a
    duplicate is skipped and counted in *skipped* instead, as Potato 2.12
    keeps the first there.
    """
    seen: set[str] = set()
    skipped = GroupedWarnings() if skipped is None else skipped
    for item in iter_items(config, skipped):
        if _first_use(config, item, seen, skipped):
            yield item


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


# Kinds whose answers are labels of the schema: they need labels, and their votes are counted by potato.labels.
LABEL_KINDS = (NOMINAL, ORDINAL, MULTILABEL, SPAN)
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


def load_line(line: bytes) -> Any:
    """One JSON line as ``dump_line`` wrote it: orjson, or the stdlib for a lone surrogate's escape (orjson refuses it)."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)


def read_lines(path: Path) -> Iterator[Any]:
    """Each line of a JSON lines file this server wrote (``load_line``); none when the file is missing."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return
    with handle:
        for raw in handle:
            if raw.strip():
                yield load_line(raw)


def dump_line(record: dict[str, Any]) -> bytes:
    """One JSON line (items.jsonl, labels.jsonl): compact JSON, UTF-8, newline-terminated (orjson)."""
    try:
        return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:  # a lone surrogate from a \\ud800 escape: written as that escape
        return json_bytes(record, separators=(",", ":")) + b"\n"


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
    votes = read_votes(config.output_annotation_dir, voted, base, per_user=consensus)
    # Dawid-Skene weighs each annotator by all their labels: labels on ids that are not
    # items (planted, say) must not count, so the items' ids are read first.
    not_items = drop_not_items(votes, item_ids(config)) if consensus else {}
    answers = (read_answers(config.output_annotation_dir, schemes, votes.users, base, per_user=consensus)
               if needs_answers(schemes) else None)
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
        for part in _item_parts(config, skipped_items):
            writer.write(part)

    # What is left are answers on ids that are not items: majority vote learns which only now, and
    # reads the annotators' labels on them again to name who gave them (consensus dropped them before).
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
    labeled = {n: 0 for n in names}
    holdout = {n: 0 for n in names}
    per_label = {s.name: dict.fromkeys(s.labels, 0) for s in schemes}
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
    (``potato.rendered_text``), which only the item being written has.
    """

    def __init__(self, config: ProjectConfig, schemes: Sequence[Scheme], rich: dict[str, dict[str, Any]],
                 ids: set[str]):
        self.ids = ids
        self.rich = rich
        self.kinds = {s.name: s.kind for s in schemes}
        self.highlight_linebreaks = bool(config.raw.get("highlight_linebreaks", False))
        self.text_key = config.text_key
        self.spans = SPAN in self.kinds.values()
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

    def needs_lines(self, block: _Block) -> bool:
        """Whether *block* must be written item by item: it holds rich answers, or (a run with spans) an
        item 2.12 shows from ``displayed_text``, which items.jsonl marks."""
        if self.ids and not self.ids.isdisjoint(block.ids):
            return True
        return self.spans and any(map(dict.__contains__, block.records, repeat(DISPLAYED_TEXT_FIELD)))

    def add_counts(self, labeled: dict[str, int], holdout: dict[str, int], per_label: dict[str, dict[str, int]]) -> None:
        for schema, (n, held) in self.counted.items():
            labeled[schema] += n
            holdout[schema] += held
        for schema, counts in self.per_label.items():
            for label, n in counts.items():
                per_label[schema][label] += n

    def warnings(self) -> list[str]:
        return self.unrendered.render(lambda key, listed: (
            f"span answers of schema {key[0]!r} on item(s) {listed} were left out: Potato 2.12 shows those "
            f"items from a list, a mapping or a displayed_text field, and their spans' offsets count that "
            f"text, not the item's {self.text_key!r}"))


class _ItemsWriter:
    """Writes items.jsonl: a clean block (``_Block``) in C-level passes, any other item
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

    def write(self, part: Item | _Block) -> None:
        if (type(part) is _Block and not part.may_name_media and not self.rich.needs_lines(part)
                and _claim_ids(self.seen, part.ids)):
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
        if item.id in self.rich.ids:
            record["labels"] = {**outcome.labels, **self.rich.labels_of(item, outcome.holdout)}
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


def _block_lines(block: _Block, outcome_of: dict[str, bytes], written: Counter[bytes]) -> bytes:
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
    with atomic_files.replacing(dest) as raw:
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
    return dest


def read_manifest(bundle_dir: str | Path) -> dict[str, Any]:
    """The bundle's ``manifest.json`` as a dict."""
    return json.loads((Path(bundle_dir) / "manifest.json").read_text(encoding="utf-8"))
