"""Text every writer can write: any string JSON can carry is escaped, never a crash; ids are quoted short.

Ids reach Potato from files and hosts it does not control: a key an
annotator's tool wrote into ``user_state.json`` (Potato 2.12 saves a label on
any id posted to it), a line of a data file, a worker's prediction. JSON can
carry strings that UTF-8 cannot encode — a lone surrogate, ``"\\ud83d"`` —
and writing one to a file opened ``encoding="utf-8"``, to SQLite or to orjson
raises. An id can also be two megabytes long. So every writer of text
(run log, ``events.jsonl``, predictions, ``labels.jsonl``, the writeback, the
run store, Prefect's log lines) goes through here:

- ``ENCODE_ERRORS`` is the ``errors=`` of every text file Potato writes
  (``open_text``). ``backslashreplace`` turns a lone surrogate into
  ``\\ud83d``, which is exactly JSON's escape for it: a JSON line dumped with
  ``ensure_ascii=False`` and written so stays valid JSON and reads back as the
  same string. In a log line it is a visible escape.
- ``escaped(text)`` is the same for a string kept in memory (the run store's
  columns, Prefect's log lines).
- ``json_bytes(value)`` is one JSON line as UTF-8 bytes, for writers of bytes.
- ``quote(value)`` names one id in a message: ``repr`` (a NUL or a surrogate
  shows as its escape), cut at ``QUOTE_CHARS`` characters with its length
  said; ``quote_all(values)`` lists at most ``QUOTED`` of them. A message
  that quotes ids through these has a bounded length whatever the ids are.

Part of the remote half (the worker and the agent write predictions and
events too): Python 3.8, standard library only.
"""

import json
from typing import IO, Any, Iterable, Optional

ENCODE_ERRORS = "backslashreplace"
# An id longer than this is cut in messages (its length is said instead).
QUOTE_CHARS = 80
# How many ids one message lists before it only counts the rest.
QUOTED = 5


def open_text(path: Any, mode: str = "w") -> IO[str]:
    """Open *path* as UTF-8 text for writing; a string UTF-8 cannot encode is written escaped."""
    return open(path, mode, encoding="utf-8", errors=ENCODE_ERRORS)


def escaped(text: str) -> str:
    """*text* with every lone surrogate as its ``\\udXXX`` escape: a string that always encodes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", ENCODE_ERRORS).decode("utf-8")
    return text


def json_bytes(value: Any, **options: Any) -> bytes:
    """*value* as JSON in UTF-8 bytes (``json.dumps`` *options*), lone surrogates as JSON escapes."""
    return json.dumps(value, ensure_ascii=False, **options).encode("utf-8", ENCODE_ERRORS)


def quote(value: Any, limit: int = QUOTE_CHARS) -> str:
    """*value* as a message names it: ``'r1'``; ``'xxxx…' (200000 characters)`` past *limit* characters."""
    if not isinstance(value, str):
        text = repr(value)
        return text if len(text) <= limit else "{}… ({} characters)".format(text[:limit], len(text))
    if len(value) <= limit:
        return repr(value)
    shown = repr(value[:limit])
    return "{}…{} ({} characters)".format(shown[:-1], shown[-1], len(value))


def quote_all(values: Iterable[Any], total: Optional[int] = None, shown: int = QUOTED) -> str:
    """At most *shown* of *values* quoted, then how many more: ``'a', 'b' and 7 more``.

    *total* is how many there are when *values* holds only the first few.
    """
    listed = []
    count = 0
    for value in values:
        if len(listed) < shown:
            listed.append(quote(value))
        count += 1
    more = (count if total is None else total) - len(listed)
    return ", ".join(listed) + (" and {} more".format(more) if more > 0 else "")
