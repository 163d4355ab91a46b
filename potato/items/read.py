"""A Potato project's items, read as Potato 2.12 reads them, streamed.

Items read (mirroring real Potato, ``davidjurgens/potato``):

``data_files`` in JSON lines (one object per line), a JSON array file
(any non-CSV/TSV file whose first character is ``[``), ``.csv`` or ``.tsv``
with a header row (TSV unquoted, as in Potato 2.12), each in its entry's
encoding; then the files of ``data_directory`` that Potato 2.12 reads there
(``config.data_directory_files``), whose bad records are skipped with a
warning as 2.12 skips them. ``item_properties.id_key`` and ``text_key`` name
the fields; ids become strings. All are streamed. Nothing here changes the
project's files.

Media: a string field naming a file with a media extension (image, audio,
video, pdf), relative to ``task_dir`` (or absolute but inside it), is named by
``media_path`` only when it resolves inside ``task_dir`` (``..``, an absolute
path elsewhere, a symlink pointing out are refused), because the bundle
(``potato.bundle.build``) copies it to machines that must not get files the
project does not own. URLs are left alone.

Speed: a JSON-lines file is read a MiB of lines at a time; a block whose
lines are all objects with a string id and text, and that names no media,
is handed on whole (``Block``), so the bundle writes it with a few C-level
passes (``potato.bundle.build`` says why that matters). Anything else goes
the plain way, one item at a time.

Best–worst scaling: with a top-level ``bws_config`` 2.12 serves tuples of
the data's items instead of the items, and so does ``item_parts`` here
(``potato.items.bws_tuples``); an empty data set has no tuples.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import re
from itertools import chain, count, repeat
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator, Mapping, NamedTuple

import orjson

from potato.config import ProjectConfig, data_directory_files
from potato.errors import ProjectDataError
from potato.items.bws_tuples import bws_tuples
from potato.items.data_warnings import GroupedWarnings, show_path
from potato.training.escaping import quote

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


class Block(NamedTuple):
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


def _read_utf8_json_lines(path: Path, shown: str, keys: tuple[str, str]) -> Iterator[Block | tuple[int, Any]]:
    """``_read_json_lines`` of a UTF-8 file, parsed as bytes by orjson about a MiB of lines at a time.

    A block of lines that all hold what a bundle expects (``_clean_block``)
    comes out whole, as a ``Block``. In any other block each line goes its
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
                yield Block(*clean, path, line_no + extra, _may_name_media(block))
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
                encoding: str = "utf-8", skipped: GroupedWarnings | None = None) -> Iterator[Item | Block]:
    """``read_items_file``, with blocks of clean JSON lines left whole (``Block``)."""
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
                if type(part) is Block:
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


def _items_of(parts: Iterable[Item | Block]) -> Iterator[Item]:
    for part in parts:
        if type(part) is Block:
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


def item_parts(config: ProjectConfig, skipped: GroupedWarnings | None = None) -> Iterator[Item | Block]:
    """``iter_items``, with blocks of clean JSON lines left whole (``Block``)."""
    if config.bws is not None:
        yield from _bws_tuple_items(config, skipped)
    else:
        yield from _data_parts(config, skipped)


def _bws_tuple_items(config: ProjectConfig, skipped: GroupedWarnings | None) -> Iterator[Item]:
    """With ``bws_config``, the items are the tuples 2.12 builds from the data (``potato.items.bws_tuples``)."""
    skipped = GroupedWarnings() if skipped is None else skipped
    seen: set[str] = set()
    pool = [item for item in _items_of(_data_parts(config, skipped)) if first_use(config, item, seen, skipped)]
    try:
        tuples = bws_tuples([item.fields for item in pool], config.id_key, config.text_key, config.bws)
    except ValueError as exc:
        raise ProjectDataError(str(exc)) from None
    where = pool[0].file
    for line, record in enumerate(tuples, 1):
        yield Item(record[config.id_key], "", record, where, line)


def _data_parts(config: ProjectConfig, skipped: GroupedWarnings | None = None) -> Iterator[Item | Block]:
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
    return _items_of(item_parts(config, skipped))


def item_ids(config: ProjectConfig) -> set[str]:
    """The ids of every item, read without writing anything (duplicates are the bundle's to name)."""
    return _ids_of(item_parts(config, GroupedWarnings()))


def item_ids_of_files(config: ProjectConfig, files: Iterable[Path]) -> set[str]:
    """The ids of the items of *files*, some of ``config.data_files``."""
    return _ids_of(chain.from_iterable(
        _file_parts(Path(path), config.id_key, config.text_key, config.task_dir,
                    encoding=config.data_file_encodings.get(path, "utf-8")) for path in files))


def _ids_of(parts: Iterable[Item | Block]) -> set[str]:
    ids: set[str] = set()
    for part in parts:
        if type(part) is Block:
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


def first_use(config: ProjectConfig, item: Item, seen: set[str], skipped: GroupedWarnings) -> bool:
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


def claim_ids(seen: set[str], ids: list[str]) -> bool:
    """Add a block's *ids* to *seen* when none repeats (in the block or before it);
    else leave *seen* as it was and return False, for ``first_use`` to name the repeat."""
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
        if first_use(config, item, seen, skipped):
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
