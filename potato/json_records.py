"""The records of a JSON data file as byte ranges, and one member of a record set or removed, every other byte kept.

Why bytes: the live writeback (``potato.results.live_writeback``) changes one field of
some records in a project's own data files while Potato 2.12 serves them. A
JSON round trip would rewrite what it does not change — ``1.0`` becomes
``1.0`` but ``1e5`` becomes ``100000.0``, key order, escapes (``\\u00e9``
against ``é``), spacing, a CRLF or a byte order mark — and annotators' item
texts must stay exactly as they are. So a record is found as a byte range, its
top-level members as ranges inside it, and a change splices new bytes into
one member's place; nothing else is re-serialised.

How a range is found: JSON's structural characters (``{ } [ ] , :``) and
quotes are ASCII, and outside a string they are structure. A string is
``"`` … ``"`` with backslash escapes; in UTF-8 (and in any one-byte encoding)
no byte of a multi-byte character is ASCII, so a regular expression over the
bytes finds every string and every structural character in order. Encodings
whose multi-byte characters may hold ASCII bytes (Shift JIS, GBK, UTF-16…)
are refused by the caller (``ascii_safe``).

Every edit is checked: the edited record must parse to the original with the
one member changed, or ``EditError`` is raised and the file is left alone.

Which records a file holds, as Potato 2.12's directory watcher reads it
(``directory_watcher._parse_json_file``): a file whose text starts (after a
byte order mark and white space) with ``[`` is one JSON array, its objects the
records; any other is JSON lines, each line an object, or an array whose
objects are records. ``records`` yields each object with its range and its
parsed value; a line that is not JSON yields nothing (2.12 refuses the whole
file then; the caller counts it).

Pure: bytes in, bytes out.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Any, Iterator, NamedTuple

import orjson

# A string (with its escapes), or one structural character. The string is "unrolled" — a run of plain bytes,
# then each escape with the plain run after it — so the engine keeps no state per byte: the form
# "(?:[^"\\]|\\.)*" took 13 GB and three minutes over one item of 110 MB (tests/integration/test_huge_items.py).
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\],:]', re.S)
_WS = b" \t\r\n"
_BOM = codecs.BOM_UTF8


class EditError(ValueError):
    """A record's bytes could not be edited so that it parses to what was asked (the file is left as it is)."""


class Record(NamedTuple):
    """One JSON object of a data file: ``data[start:end]`` is its text; ``value`` what it parses to."""

    start: int
    end: int
    value: dict


class Member(NamedTuple):
    """A top-level member of an object: where its key starts and ends, where its value starts and ends."""

    key: str
    key_start: int
    key_end: int
    value_start: int
    value_end: int


def ascii_safe(encoding: str) -> bool:
    """Whether the bytes of every JSON structural character and quote in *encoding* are always structure:
    UTF-8, ASCII and the one-byte encodings (latin-1, cp1252, …)."""
    name = codecs.lookup(encoding).name
    if name in ("utf-8", "utf-8-sig", "ascii"):
        return True
    if "".join(map(chr, range(128))).encode(name, "strict") != bytes(range(128)):
        return False
    decoder = codecs.getincrementaldecoder(name)()
    for byte in range(128, 256):  # a lead byte of a multi-byte encoding decodes to nothing on its own
        decoder.reset()
        try:
            if decoder.decode(bytes([byte]), final=False) == "":
                return False
        except UnicodeDecodeError:
            continue  # an undefined byte of a one-byte encoding: still one byte
    return True


def _skip_ws(data: bytes, pos: int, end: int) -> int:
    while pos < end and data[pos] in _WS:
        pos += 1
    return pos


def _parse(text: bytes, encoding: str) -> Any:
    """*text* (in *encoding*) as JSON: UTF-8 by orjson, or by the standard library where orjson refuses what
    JSON allows (a lone surrogate escape); ``ValueError`` when it is not JSON in that encoding."""
    if encoding == "utf-8":
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text.decode(encoding))


def starts_array(data: bytes) -> bool:
    """Whether the file's text is one JSON array (it starts with ``[``, after a byte order mark and white space)."""
    start = len(_BOM) if data.startswith(_BOM) else 0
    start = _skip_ws(data, start, len(data))
    return data[start:start + 1] == b"["


def _array_objects(data: bytes, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The ``(start, end)`` of each object directly inside the array that opens at ``data[start]``."""
    depth = 0
    opened = -1
    for token in _TOKEN.finditer(data, start, end):
        char = data[token.start()]
        if char == 0x22:  # a string
            continue
        if char in (0x7B, 0x5B):  # { [
            depth += 1
            if depth == 2 and char == 0x7B:
                opened = token.start()
        elif char in (0x7D, 0x5D):  # } ]
            if depth == 2 and char == 0x7D and opened >= 0:
                yield opened, token.end()
                opened = -1
            depth -= 1
            if depth == 0:
                return


def records(data: bytes, *, array: bool, encoding: str = "utf-8") -> Iterator[Record]:
    """Every object of a data file that is a record, in file order (module docstring).

    *data* is the file's bytes in *encoding* (``ascii_safe``; a codec name as
    ``codecs.lookup`` spells it); *array*: the file is one JSON array
    (``starts_array``). Raises ``ValueError`` naming the line when the file is
    not what 2.12 reads (2.12 then loads none of it).
    """
    if array:
        yield from _objects_of_array(data, 0, len(data), 1, encoding)
        return
    start = 0
    line = 0
    for raw in data.splitlines(keepends=True):
        line += 1
        begin, stop = start, start + len(raw)
        start = stop
        if line == 1 and raw.startswith(_BOM):
            begin += len(_BOM)
        begin = _skip_ws(data, begin, stop)
        end = stop
        while end > begin and data[end - 1] in _WS:
            end -= 1
        if begin == end:
            continue
        try:
            value = _parse(data[begin:end], encoding)
        except ValueError:
            raise ValueError(f"line {line} is not JSON") from None
        if isinstance(value, dict):
            yield Record(begin, end, value)
        elif isinstance(value, list):
            yield from _objects_of_array(data, begin, end, line, encoding)


def _objects_of_array(data: bytes, start: int, end: int, line: int, encoding: str) -> Iterator[Record]:
    begin = start + (len(_BOM) if data.startswith(_BOM, start) else 0)
    begin = _skip_ws(data, begin, end)
    try:
        value = _parse(data[begin:end], encoding)
    except ValueError:
        raise ValueError(f"line {line} is not JSON") from None
    if not isinstance(value, list):
        raise ValueError(f"line {line} is not a JSON array")
    objects = [element for element in value if isinstance(element, dict)]
    spans = list(_array_objects(data, begin, end))
    if len(spans) != len(objects):  # cannot happen for valid JSON; refuse rather than misplace an edit
        raise ValueError(f"line {line}: the array's objects could not be told apart")
    for (first, last), element in zip(spans, objects):
        yield Record(first, last, element)


def members(data: bytes, record: Record, encoding: str = "utf-8") -> list[Member]:
    """The top-level members of *record*, in order."""
    found: list[Member] = []
    depth = 0
    key = None
    key_start = key_end = value_start = -1
    for token in _TOKEN.finditer(data, record.start, record.end):
        at = token.start()
        char = data[at]
        if char == 0x22:
            if depth == 1 and key is None:
                key, key_start, key_end = _parse(token.group(), encoding), at, token.end()
            continue
        if char == 0x3A:  # :
            if depth == 1:
                value_start = _skip_ws(data, token.end(), record.end)
            continue
        if depth == 1 and char in (0x2C, 0x7D):  # the end of a member's value
            if key is not None:
                value_end = at
                while data[value_end - 1] in _WS:
                    value_end -= 1
                found.append(Member(key, key_start, key_end, value_start, value_end))
                key = None
        if char in (0x7B, 0x5B):
            depth += 1
        elif char in (0x7D, 0x5D):
            depth -= 1
    return found


def _style(data: bytes, found: list[Member], record: Record) -> tuple[bytes, bytes]:
    """How the record spells what goes before a member's key and between a key and its value."""
    if not found:
        return b"", b": "
    first = found[0]
    between = data[first.key_end:first.value_start]
    if len(found) > 1:
        last = found[-1]
        comma = data.rfind(b",", found[-2].value_end, last.key_start)
        return data[comma + 1:last.key_start], between
    before = data[record.start + 1:first.key_start]
    return before or (b" " if between.endswith(b" ") else b""), between


def set_member(data: bytes, record: Record, key: str, value: Any, encoding: str = "utf-8") -> bytes:
    """The bytes of *record* with member *key* set to *value* (``None``: removed); every other byte as it was.

    An existing member keeps its place (the last one, where a key repeats:
    the one a parser reads); a new one goes after the last member, spelled
    as the record spells its others; a removed one takes the comma before it
    with it, so that adding a member and removing it again gives back the
    record's own bytes. *value* is written as ASCII JSON (``ascii_json``).
    Raises ``EditError`` when the result would not parse to what was asked.
    """
    found = members(data, record, encoding)
    existing = [m for m in found if m.key == key]
    text = data[record.start:record.end]
    base = record.start
    if value is None:
        if not existing:
            return text
        member = existing[-1]
        index = found.index(member)
        if index > 0:
            cut = (found[index - 1].value_end, member.value_end)
        elif index + 1 < len(found):
            cut = (member.key_start, found[index + 1].key_start)
        else:
            cut = (member.key_start, member.value_end)
        edited = text[:cut[0] - base] + text[cut[1] - base:]
    else:
        encoded = ascii_json(value)
        if existing:
            member = existing[-1]
            edited = text[:member.value_start - base] + encoded + text[member.value_end - base:]
        else:
            before, between = _style(data, found, record)
            if found:
                at = found[-1].value_end
                piece = b"," + before + ascii_json(key) + between + encoded
            else:
                at = record.start + 1
                piece = ascii_json(key) + between + encoded
            edited = text[:at - base] + piece + text[at - base:]
    expected = dict(record.value)
    expected.pop(key, None)
    if value is not None:
        expected[key] = value
    try:
        if not _same(_parse(edited, encoding), expected):
            raise EditError(f"the record edited would not read back as asked: {edited[:200]!r}")
    except ValueError as exc:
        if isinstance(exc, EditError):
            raise
        raise EditError(f"the record edited would not be JSON: {edited[:200]!r}") from None
    return edited


def _same(a: Any, b: Any) -> bool:
    # NaN is not equal to itself: compare what the two serialise to when == says no.
    return a == b or json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def ascii_json(value: Any) -> bytes:
    """*value* as JSON in ASCII: every other character, a lone surrogate included, as its ``\\u`` escape.

    What any ASCII-compatible encoding can carry, and what no line splitter
    cuts: Potato 2.12 splits a JSON-lines file with ``str.splitlines``, which
    also splits at U+2028, U+0085 and other characters JSON leaves raw.
    """
    return json.dumps(value, ensure_ascii=True).encode("ascii")
