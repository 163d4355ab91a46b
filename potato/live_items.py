"""The records of a watched data_directory as the live writeback reads them: file by file, as Potato 2.12 does.

Potato 2.12's directory watcher (its ``directory_watcher.py``) loads every
``.json``, ``.jsonl``, ``.csv`` and ``.tsv`` file of ``data_directory``, in
sorted order (``potato.config.data_directory_files``), and later, polling,
re-reads a file whose size or modification time changed, replacing the data
of each item it first loaded from that file. So an item's predictions can
reach a running 2.12 only through the record it was first read from:

- an id read before — from ``data_files``, which 2.12 loads first, or an
  earlier record of the directory — is kept from there; a later record with
  it is never read (``first_records`` skips it);
- a CSV or TSV file's cells are text, never the mapping 2.12 pre-fills from;
- a file in an encoding whose multi-byte characters may hold ASCII bytes
  cannot have one field changed with every other byte kept
  (``potato.json_records.ascii_safe``);
- a JSON-lines file holding a character ``str.splitlines`` breaks lines at
  (U+2028, U+0085, a form feed…) is one 2.12 cannot read at all: it splits
  the record that holds it.

``unwritable`` says which of these holds for a file. Reading only: the
writing is ``potato.live_writeback``'s.

**Whose field it is.** The live writeback owns ``writeback.field`` of every
record it may change. Before its first writeback into a directory (no
``training/live-writeback.json`` naming that field), a record that already
holds the field holds something of the project's own, which the writeback
would replace: ``foreign_field`` names it, ``potato validate`` reports it, and
the writeback refuses to start (``LiveWritebackError``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator, NamedTuple

from potato.config import ProjectConfig, data_directory_files
from potato.data_warnings import GroupedWarnings, show_path
from potato.json_records import Record, ascii_safe, records, starts_array
from potato.project import item_ids_of_files, read_items_file
from potato.training.escaping import quote

# In training/: which field of the directory's records the live writeback owns.
MARKER = "live-writeback.json"

# What str.splitlines breaks a line at besides \n and \r: in a JSON-lines file 2.12 cannot read. In UTF-8, each
# looked for on its own: a substring search is many times faster over a large file than one regular expression.
_SPLITS_UTF8 = tuple(c.encode("utf-8") for c in "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
_SPLITS_TEXT = re.compile("[\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")

TABLE_FILE = "a CSV or TSV file: Potato 2.12 reads each cell as text, never as the mapping it pre-fills from"


class DataFile(NamedTuple):
    """One data file's bytes and its records (``potato.json_records``)."""

    path: Path
    data: bytes
    records: list[Record]


def marker_path(config: ProjectConfig) -> Path:
    return config.training_dir / MARKER


def owns_field(config: ProjectConfig) -> bool:
    """Whether the live writeback has written ``writeback.field`` into this directory's records before."""
    try:
        found = json.loads(marker_path(config).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and found.get("field") == config.model_training.writeback.field


def unwritable(path: Path, encoding: str) -> str | None:
    """Why the live writeback cannot change *path*'s records (module docstring), or None."""
    if path.suffix.lower() in (".csv", ".tsv"):
        return TABLE_FILE
    if not ascii_safe(encoding):
        return (f"in {encoding}, where one field cannot be changed with every other byte kept (save it as "
                "UTF-8)")
    return None


def read_data_file(path: Path, encoding: str) -> DataFile:
    """*path*'s bytes and records; ``ValueError`` saying why Potato 2.12 reads none of it."""
    data = path.read_bytes()
    array = starts_array(data)
    if not array:
        if encoding == "utf-8":
            splits = any(c in data for c in _SPLITS_UTF8)
        else:
            splits = _SPLITS_TEXT.search(data.decode(encoding, "replace")) is not None
        if splits:
            raise ValueError("a line holds a character Potato 2.12 also breaks lines at (U+2028, U+0085, a form "
                             "feed…), so it reads none of this file")
    try:
        return DataFile(path, data, list(records(data, array=array, encoding=encoding)))
    except UnicodeDecodeError as exc:
        raise ValueError(f"it is not {encoding} text ({exc.reason})") from None


def earlier_ids(config: ProjectConfig) -> set[str]:
    """The ids of ``data_files``' items: Potato 2.12 loads them first, and keeps them from there."""
    return item_ids_of_files(config, config.data_files)


def record_id(record: Record, id_key: str) -> str | None:
    """The id 2.12 reads from *record* (``str()`` of its id field), None when it has none."""
    value = record.value.get(id_key)
    return None if value is None else str(value)


def first_records(data_file: DataFile, id_key: str, seen: set[str]) -> Iterator[tuple[Record, str]]:
    """The records of *data_file* that are the first with their id (*seen*, updated), with the id."""
    for record in data_file.records:
        item_id = record_id(record, id_key)
        if item_id is None or item_id in seen:
            continue
        seen.add(item_id)
        yield record, item_id


def line_of(data_file: DataFile, record: Record) -> int:
    return data_file.data.count(b"\n", 0, record.start) + 1


def foreign_field(config: ProjectConfig) -> str | None:
    """Before the live writeback's first writeback, the first record that already holds ``writeback.field``
    (a sentence naming it and the fix), else None."""
    wb = config.model_training.writeback
    if not (wb.live and wb.schemas) or config.data_directory is None or owns_field(config):
        return None
    seen = earlier_ids(config)
    for path in data_directory_files(config.data_directory):
        if unwritable(path, config.data_directory_encoding):
            continue
        try:
            data_file = read_data_file(path, config.data_directory_encoding)
        except (OSError, ValueError):
            continue
        for record, item_id in first_records(data_file, config.id_key, seen):
            if wb.field in record.value:
                return (f"{show_path(path, config.task_dir)} line {line_of(data_file, record)}: item "
                        f"{quote(item_id)} already holds a field {wb.field!r} of its own, which the live "
                        f"writeback (model_training.writeback.live) would replace; set "
                        "model_training.writeback.field and pre_annotation.field to a key the items do not use")
    return None


def table_ids(config: ProjectConfig, path: Path) -> list[str]:
    """The ids of a CSV or TSV file of the directory, read as a run reads them."""
    return [item.id for item in read_items_file(path, config.id_key, config.text_key, config.task_dir,
                                                encoding=config.data_directory_encoding,
                                                skipped=GroupedWarnings())]
