"""The JSON lines this server writes and reads back (the bundle's items and labels, predictions, evaluations).

orjson, compact and UTF-8, newline-terminated; a lone surrogate (which
orjson refuses) as its JSON escape, read back by the standard library.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import orjson

from potato.training.escaping import json_bytes


def load_line(line: bytes) -> Any:
    """One JSON line as ``dump_line`` wrote it: orjson, or the stdlib for a lone surrogate's escape (orjson refuses it)."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)


def read_lines(path: Path, *, skip_unreadable: bool = False) -> Iterator[Any]:
    """Each line of a JSON lines file this server wrote (``load_line``); none when the file is missing.
    ``skip_unreadable``: a line that is not JSON is passed over (a summary that looks at one field)."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return
    with handle:
        for raw in handle:
            if not raw.strip():
                continue
            try:
                value = load_line(raw)
            except ValueError:
                if skip_unreadable:
                    continue
                raise
            yield value


def dump_line(record: dict[str, Any]) -> bytes:
    """One JSON line (items.jsonl, labels.jsonl): compact JSON, UTF-8, newline-terminated (orjson)."""
    try:
        return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError:  # a lone surrogate from a \\ud800 escape: written as that escape
        return json_bytes(record, separators=(",", ":")) + b"\n"
