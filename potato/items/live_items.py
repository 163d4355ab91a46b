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

``unwritable`` says which of these holds for a file. And some files are the
data provider's in a way a rewrite would break, so they are never rewritten
either (``not_rewritten``): a **symbolic link** (its file may be outside the
directory, shared with another project: a rewrite would change it there, or
replace the link by a copy); a **hard-linked** file (a rewrite is a new file,
cut off from its other names); a **read-only** file (its owner may not write
it, so neither does the writeback); a file **owned by another account** when
the server is not root (the rewritten file could not be given back to its
owner, who would lose write access to it). Their items' predictions reach
annotators only through ``pre_annotation.predictions_file``, at 2.12's next
start; ``potato validate`` names each such file (``not_rewritten_files``).
Reading only: the writing is ``potato.results.live_writeback``'s.

**Whose field it is.** The live writeback owns ``writeback.field`` of the
records it wrote. ``training/live-writeback.json`` (the marker) names the
field and the ids of the records that hold what the writeback wrote there;
it is written before the first record changes. Before the first writeback
into a directory (no marker naming that field), a record that already holds
the field, with a value other than the writeback file's for it, holds
something of the project's own, which the writeback would replace:
``foreign_field`` names it, ``potato validate`` reports it, and the writeback
refuses to start (``LiveWritebackError``). Afterwards a record holding the
field that the marker does not list is reported and left as it is. A marker
from before the list (``{"field": …}`` alone) keeps its old meaning: every
record's field is the writeback's.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, NamedTuple

import orjson

from potato.config import ProjectConfig, data_directory_files
from potato.items.data_warnings import GroupedWarnings, show_path
from potato.items.read import item_ids_of_files, read_items_file
from potato.json_records import Record, ascii_safe, records, starts_array
from potato.training import atomic_files
from potato.training.escaping import json_bytes, quote

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


def read_targets(config: ProjectConfig) -> dict[str, Any]:
    """What the writeback file holds for each item: its id, the value of its ``writeback.field``."""
    field_name = config.model_training.writeback.field
    targets: dict[str, Any] = {}
    try:
        handle = open(config.writeback_file, "rb")
    except FileNotFoundError:
        return targets
    with handle:
        for raw in handle:
            if not raw.strip():
                continue
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                record = json.loads(raw.decode("utf-8"))
            if isinstance(record, dict) and isinstance(record.get("id"), str) and field_name in record:
                targets[record["id"]] = record[field_name]
    return targets


def marker_path(config: ProjectConfig) -> Path:
    return config.training_dir / MARKER


@dataclass
class Marker:
    """What the marker says: the field the writeback owns, and the records holding what it wrote there
    (None: a marker from before the list, under which every record's field is the writeback's)."""

    field: str
    ids: set[str] | None

    def ours(self, item_id: str) -> bool:
        return self.ids is None or item_id in self.ids


def read_marker(config: ProjectConfig) -> Marker | None:
    """The marker, when it names ``writeback.field``; None before the first live writeback of that field."""
    try:
        found = json.loads(marker_path(config).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    field_name = config.model_training.writeback.field
    if not (isinstance(found, dict) and found.get("field") == field_name):
        return None
    ids = found.get("ids")
    if not isinstance(ids, list):
        return Marker(field_name, None)
    return Marker(field_name, {i for i in ids if isinstance(i, str)})


def write_marker(config: ProjectConfig, marker: Marker) -> None:
    """Keep *marker* (``potato.training.atomic_files``: the old one or the new one, never half)."""
    content: dict[str, Any] = {"field": marker.field}
    if marker.ids is not None:
        content["ids"] = sorted(marker.ids)
    atomic_files.write_bytes(marker_path(config), json_bytes(content) + b"\n")


def owns_field(config: ProjectConfig) -> bool:
    """Whether the live writeback has written ``writeback.field`` into this directory's records before."""
    return read_marker(config) is not None


# Why a data file is not rewritten (module docstring); each is said with the file's name.
SYMLINK = ("a symbolic link{where}: the live writeback never rewrites where a link points (a file outside the "
           "directory may be another project's too); link the file's directory instead, or copy the file in")
HARD_LINKED = ("hard-linked ({links} names): a rewrite would be a new file, cut off from its other names; keep one "
               "name of it in the directory")
READ_ONLY = "read-only (mode {mode:04o}): its owner may not write it, so neither does the live writeback"
OTHER_OWNER = ("owned by another account (uid {uid}, gid {gid}), to which this server's account (uid {me}) could not "
               "give the rewritten file back: its owner would lose write access to it; run Potato as the files' "
               "owner, or give the files to its account")
NOT_REGULAR = "not a regular file"


def not_rewritten(directory: Path, name: str, st: os.stat_result) -> str | None:
    """Why the data file *name* of *directory* (``st``: its ``lstat``) is the provider's in a way a rewrite
    would break (module docstring), or None."""
    if stat.S_ISLNK(st.st_mode):
        try:
            target = Path(os.path.realpath(directory / name))
            inside = target.parent == Path(os.path.realpath(directory))
        except OSError:
            inside = False
        return SYMLINK.format(where=" to a file in the directory" if inside else " to a file outside the directory")
    if not stat.S_ISREG(st.st_mode):
        return NOT_REGULAR
    if st.st_nlink > 1:
        return HARD_LINKED.format(links=st.st_nlink)
    if not st.st_mode & stat.S_IWUSR:
        return READ_ONLY.format(mode=stat.S_IMODE(st.st_mode))
    me = os.geteuid()
    if me != 0 and (st.st_uid != me or (st.st_gid != os.getegid() and st.st_gid not in os.getgroups())):
        return OTHER_OWNER.format(uid=st.st_uid, gid=st.st_gid, me=me)
    return None


def not_rewritten_files(config: ProjectConfig) -> list[tuple[Path, str]]:
    """The data files of the watched directory that the live writeback leaves as they are, and why."""
    directory = config.data_directory
    if directory is None:
        return []
    found = []
    for path in data_directory_files(directory):
        try:
            why = unwritable(path, config.data_directory_encoding) or not_rewritten(
                directory, path.name, os.lstat(path))
        except OSError:
            continue
        if why and why != TABLE_FILE:
            found.append((path, why))
    return found


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
    return parse_data_file(path, path.read_bytes(), encoding)


def parse_data_file(path: Path, data: bytes, encoding: str) -> DataFile:
    """The records of *data*, the bytes of *path*; ``ValueError`` saying why Potato 2.12 reads none of it."""
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


def foreign_field(config: ProjectConfig, targets: Mapping[str, Any] | None = None,
                  seen: set[str] | None = None) -> str | None:
    """Before the live writeback's first writeback, the first record that already holds ``writeback.field``
    with a value other than what the writeback file holds for it (*targets*; read when None) — a sentence
    naming it and the fix — else None. A record holding exactly the file's value is the writeback's own, left
    by a first writeback cut short. *seen*: the ids read before the directory (``earlier_ids``; read when
    None), updated."""
    wb = config.model_training.writeback
    if not (wb.live and wb.schemas) or config.data_directory is None or owns_field(config):
        return None
    if targets is None:
        targets = read_targets(config)
    if seen is None:
        seen = earlier_ids(config)
    for path in data_directory_files(config.data_directory):
        try:
            if unwritable(path, config.data_directory_encoding) or not_rewritten(
                    config.data_directory, path.name, os.lstat(path)):
                continue
            data_file = read_data_file(path, config.data_directory_encoding)
        except (OSError, ValueError):
            continue
        for record, item_id in first_records(data_file, config.id_key, seen):
            if wb.field in record.value and record.value[wb.field] != targets.get(item_id, _NONE):
                return (f"{show_path(path, config.task_dir)} line {line_of(data_file, record)}: item "
                        f"{quote(item_id)} already holds a field {wb.field!r} of its own, which the live "
                        f"writeback (model_training.writeback.live) would replace; set "
                        "model_training.writeback.field and pre_annotation.field to a key the items do not use")
    return None


_NONE = object()


def table_ids(config: ProjectConfig, path: Path) -> list[str]:
    """The ids of a file of the directory the writeback does not rewrite (a CSV or TSV file…), read as a run
    reads them; ``ProjectDataError`` when it cannot be read."""
    return [item.id for item in read_items_file(path, config.id_key, config.text_key, config.task_dir,
                                                encoding=config.data_directory_encoding,
                                                skipped=GroupedWarnings())]
