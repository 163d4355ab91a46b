"""Walk a very large JSON object in chunks of many members, each chunk parsed by orjson.

Why: a 1 M-item project's ``user_state.json`` files hold about 80 MB each.
Parsed whole they cost ~0.5 GB; walked member by member with the standard
library's ``raw_decode`` (``potato.annotations.labels._JsonStream``, the careful reader)
they cost seconds, almost all of it Python per member. orjson parses a few
megabytes of members in one C call.

How a chunk is cut, and why the cut is safe: a container's members are
separated by commas at its own depth. A cut just before such a comma is a
member boundary, and it is *verified*, never assumed: the text from the last
boundary to the cut, wrapped in the container's brackets, must parse. JSON is
read left to right without look-ahead, so a prefix that parses as a complete
container ends at a member boundary of the whole text too. Candidates come
from the whitespace the writer put before the first member: a pretty-printed
file (Potato writes ``indent=2``) puts the same newline and indentation
before every member of one container and other indentation at other depths,
and a string cannot hold a raw newline, so its first candidate is right. A
compact file's candidates are tried from the end of the window, a few at most.
The container's end is found the same way: orjson reports where the content
after a complete document starts.

Pretty-printed members need not even be parsed one by one. A chunk cut at a
candidate is split at every ``,`` + indentation: if each piece is a key (a
string without escapes) and a value text that orjson parses on its own, the
chunk is that sequence of members, for JSON's grammar leaves no other
reading, and any wrong split leaves a piece with an unclosed bracket, which
does not parse. Only the *distinct* value texts are parsed: an annotator's
labels map holds 500 k entries but a handful of distinct values, so this
costs a third of a full parse (1 M-item bench project: 0.3 s a file instead
of 0.9 s with the parse and a hashable key per entry). ``member_batches``
yields ``(keys, texts, values)``: each member's key and its value's text, and
the value of each distinct text; a chunk that does not split so is parsed by
orjson and its values serialised back by ``orjson.dumps`` for their texts.

Anything unusual (invalid JSON or UTF-8, a member larger than ``MAX_WINDOW``,
too many wrong candidates) raises :class:`GiveUp`, and the caller reads the
file with the careful reader, which names the problem precisely. Memory: one
window (1 MiB by default) and its parsed members. Server side only (the remote
half stays stdlib-only).
"""

from __future__ import annotations

import re
from operator import itemgetter, methodcaller
from typing import Any, BinaryIO, Hashable, Iterator

import orjson

WINDOW = 1 << 20
MAX_WINDOW = 256 << 20
# Wrong candidates tolerated per chunk (compact files only) before giving up.
_TRIES = 8
_WS = re.compile(rb"[ \t\n\r]*")
_OPEN = {b"{": b"}", b"[": b"]"}
# What a key of a split member may not hold: a quote, an escape, a control character.
_ODD_KEY = re.compile(rb'["\\\x00-\x1f]')
_at_colon = methodcaller("partition", b'":')
_first, _last = itemgetter(0), itemgetter(2)

# A batch of members: their keys, their values' texts (hashable; equal texts,
# equal values), and the value of each distinct text.
Batch = tuple[list[str], list[Hashable], dict[Hashable, Any]]


class GiveUp(Exception):
    """The fast path cannot read this file; read it with the careful reader instead."""


class ChunkReader:
    """A binary file read through a sliding buffer; ``pos`` is the next byte to look at."""

    def __init__(self, handle: BinaryIO, window: int = WINDOW):
        self.handle = handle
        self.window = window
        self.buf = b""
        self.pos = 0
        self.eof = False

    def _fill(self, wanted: int) -> None:
        """Make at least *wanted* bytes from ``pos`` available, unless the file ends first."""
        if len(self.buf) - self.pos >= wanted or self.eof:
            return
        more = self.handle.read(max(wanted, self.window))
        if len(more) < max(wanted, self.window):
            self.eof = True
        self.buf = self.buf[self.pos:] + more
        self.pos = 0

    def peek(self) -> bytes:
        """The next non-whitespace byte (``b""`` at the end of the file)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or self.eof:
                return self.buf[self.pos:self.pos + 1]
            self._fill(1)

    def expect(self, char: bytes) -> None:
        if self.peek() != char:
            raise GiveUp
        self.pos += 1

    def small_value(self) -> Any:
        """Parse the next value whole: a key, a scalar, a small container."""
        self.peek()
        size = 256
        while size <= MAX_WINDOW:
            self._fill(size)
            data = self.buf[self.pos:self.pos + size]
            everything = self.eof and self.pos + size >= len(self.buf)
            try:
                value = orjson.loads(data)
            except orjson.JSONDecodeError as exc:
                if exc.pos > 0:
                    try:
                        value = orjson.loads(data[: exc.pos])
                    except orjson.JSONDecodeError:
                        pass
                    else:
                        self.pos += exc.pos
                        return value
            else:
                if everything:  # else a number may be cut at the window's edge: read on
                    self.pos += len(data)
                    return value
            if everything:
                raise GiveUp
            size *= 4
        raise GiveUp

    def skip_value(self) -> None:
        if self.peek() in _OPEN:
            for _ in self.chunks():
                pass
        else:
            self.small_value()

    def chunks(self, split: bool = False) -> Iterator[Any]:
        """Yield the container at ``pos`` (``{`` or ``[``) as a series of smaller ones of the same kind.

        Dict chunks for an object (duplicate keys inside one chunk keep the
        last, as ``json.loads`` does), list chunks for an array. With *split*
        (objects only), a chunk of a pretty-printed object may come as a
        ``Batch`` instead (``_split``; every member, duplicates included).
        """
        open_b = self.peek()
        close_b = _OPEN.get(open_b)
        if close_b is None:
            raise GiveUp
        self.pos += 1
        self._fill(4096)
        lead = _WS.match(self.buf, self.pos).group()
        if self.peek() == close_b:
            self.pos += 1
            return
        sep = b"," + lead
        first_char = b'"' if open_b == b"{" else None
        # One member a line: the only layout whose separator never occurs inside a member.
        split = split and first_char is not None and b"\n" in lead
        # Where such an object ends: its closing brace on a line less indented than its members.
        indent = len(lead) - len(lead.rstrip(b" \t"))
        closing = re.compile(rb"\n[ \t]{0,%d}\}" % (indent - 1)) if split and indent else None
        while True:
            self._fill(self.window)
            start = self.pos
            limit = min(len(self.buf), start + self.window)
            found = self._cut(start, limit, sep, first_char, open_b, close_b, split, closing)
            if found is None:
                found = self._end(start, limit, open_b)
            if found is None:  # one member is longer than the window: widen it
                if self.window >= MAX_WINDOW:
                    raise GiveUp
                self.window *= 2
                continue
            chunk, self.pos, ended = found
            yield chunk
            if ended:
                return

    def _cut(self, start: int, limit: int, sep: bytes, first_char: bytes | None, open_b: bytes,
             close_b: bytes, split: bool = False, closing: re.Pattern | None = None) -> tuple[Any, int, bool] | None:
        """``(chunk, next pos, container ended)`` at the last verified boundary before *limit*, or None."""
        hi, tries = limit, 0
        while True:
            cut = self.buf.rfind(sep, start, hi)
            if cut < 0:
                return None
            hi = cut
            after = self.buf[cut + len(sep):cut + len(sep) + 1]
            if not after or after in b" \t\r\n" or (first_char and after != first_char):
                continue  # deeper indentation, or not where a member starts
            if split:
                batch = self._split(start, cut, sep)
                if batch is not None:
                    return batch, cut + 1, False
                # The object may have ended before this cut (its last window): split up to its end.
                end = closing.search(self.buf, start, cut) if closing is not None else None
                batch = self._split(start, end.start(), sep) if end is not None else None
                if batch is not None:
                    return batch, end.end(), True
                split = False  # not this layout here: orjson decides
            body = open_b + self.buf[start:cut]
            try:
                return orjson.loads(body + close_b), cut + 1, False
            except orjson.JSONDecodeError as exc:
                try:  # the container closed before the cut: its end is found
                    return orjson.loads(body[: exc.pos]), start + exc.pos - 1, True
                except orjson.JSONDecodeError:
                    tries += 1
                    if tries >= _TRIES:
                        raise GiveUp from None

    def _split(self, start: int, cut: int, sep: bytes) -> Batch | None:
        """The members between *start* and *cut* as a ``Batch``, when every piece
        between separators is ``"key":`` and a value text that parses alone; else None."""
        body = self.buf[start:cut].lstrip(b" \t\r\n")
        if body[:1] != b'"':
            return None
        # Each piece: the key, '":', the value's text.
        parts = list(map(_at_colon, body[1:].split(sep + b'"')))
        keys = list(map(_first, parts))
        joined = b"".join(keys)
        if _ODD_KEY.search(joined):  # a quote, an escape or a control character: not a plain key
            return None
        texts = list(map(_last, parts))
        values = dict.fromkeys(texts)
        try:
            for text in values:
                values[text] = orjson.loads(text)
            return list(map(bytes.decode, keys)), texts, values
        except (orjson.JSONDecodeError, UnicodeDecodeError):
            return None

    def _end(self, start: int, limit: int, open_b: bytes) -> tuple[Any, int, bool] | None:
        """The container's last members when it ends before *limit*; None when it runs on past it."""
        body = open_b + self.buf[start:limit]
        try:
            return orjson.loads(body), limit, True
        except orjson.JSONDecodeError as exc:
            try:
                return orjson.loads(body[: exc.pos]), start + exc.pos - 1, True
            except orjson.JSONDecodeError:
                if self.eof and limit >= len(self.buf):
                    raise GiveUp from None  # the file ends inside it: not valid JSON
                return None


def object_members(reader: ChunkReader) -> Iterator[str]:
    """Walk the object at ``reader.pos``: yield each key with the reader at its value.

    The consumer must read the value (``small_value``, ``skip_value`` or
    ``chunks``) before asking for the next key.
    """
    reader.expect(b"{")
    if reader.peek() == b"}":
        reader.pos += 1
        return
    while True:
        if reader.peek() != b'"':
            raise GiveUp
        key = reader.small_value()
        reader.expect(b":")
        yield key
        sep = reader.peek()
        reader.pos += 1
        if sep == b"}":
            return
        if sep != b",":
            raise GiveUp


def member_batches(path, name: str, window: int = WINDOW) -> Iterator[Batch]:
    """The top-level object member *name* of the JSON file at *path*, as ``Batch`` es of its members.

    Other members are parsed chunk by chunk and dropped. A member that is
    ``null`` yields nothing; raises ``GiveUp`` for anything the careful reader
    should look at (the top level not an object, the member not an object,
    invalid JSON or UTF-8, content after the object), ``OSError`` when the
    file cannot be opened or read. A repeated key (Potato never writes one)
    comes once with its last value from a parsed chunk, as ``json.loads``
    reads it, and every time from a split one, as the careful reader yields it.
    """
    for _, batch in members_batches(path, (name,), window):
        yield batch


def members_batches(path, names: tuple[str, ...], window: int = WINDOW) -> Iterator[tuple[str, Batch]]:
    """``(name, batch)`` of each top-level member in *names*, in file order: ``member_batches`` for
    several members in one pass over the file."""
    with open(path, "rb") as handle:
        reader = ChunkReader(handle, window)
        if reader.peek() == b"\xef":  # a UTF-8 byte order mark: the careful reader decides
            raise GiveUp
        for key in object_members(reader):
            if key not in names:
                reader.skip_value()
                continue
            first = reader.peek()
            if first == b"{":
                for chunk in reader.chunks(split=True):
                    yield key, (chunk if type(chunk) is tuple else _as_batch(chunk))
            elif reader.small_value() is not None:
                raise GiveUp
        if reader.peek() != b"":
            raise GiveUp


def _as_batch(chunk: dict[str, Any]) -> Batch:
    values = list(chunk.values())
    texts = list(map(orjson.dumps, values))
    return list(chunk), texts, dict(zip(texts, values))
