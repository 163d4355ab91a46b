"""A data_directory written the way real projects' files come, for the live writeback to keep byte for byte.

Items are spread over three files, each a hazard for anything that rewrites
records by a JSON round trip:

- ``a.jsonl``: a UTF-8 byte order mark, CRLF line ends, keys in odd orders
  (text before id), numbers a round trip rewrites (``1e5``, ``1.0``,
  ``-0.0``, an integer past 64 bits), ``\\u2028`` and a lone surrogate as
  escapes, raw non-ASCII, escaped quotes and backslashes, nested objects
  holding the field name, an integer id;
- ``b.json``: a pretty-printed JSON array (indent 4, a trailing newline);
- ``c.csv``: a CSV file, which Potato 2.12 reads as text cells (no
  predictions can live there).

Potato 2.12.1 reads all three (checked by tests/e2e/test_live_beside_potato212.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

# Which file each item goes to, by its position: most to the JSON-lines file.
JSONL, ARRAY, CSV = "a.jsonl", "b.json", "c.csv"


def _jsonl_line(n: int, item_id: str, text: str, id_key: str, text_key: str) -> str:
    quoted_id = json.dumps(item_id, ensure_ascii=False)
    quoted_text = json.dumps(text, ensure_ascii=False)
    shapes = [
        f'{{"{text_key}": {quoted_text}, "{id_key}": {quoted_id}, "score": 1e5, "weight": 1.0}}',
        f'{{ "{id_key}" : {quoted_id} ,  "{text_key}" : {quoted_text} , "note": "line\\u2028sep \\ud83d", '
        f'"zero": -0.0 }}',
        f'{{"{id_key}":{quoted_id},"{text_key}":{quoted_text},"meta":{{"predictions":"theirs","q":"\\"\\\\"}},'
        f'"big":123456789012345678901234567890}}',
        f'{{"{id_key}": {quoted_id}, "{text_key}": {quoted_text}, "city": "Zürich 😀", "tags": ["a", "}}"]}}',
    ]
    return shapes[n % len(shapes)]


def write_hostile_directory(directory: Path, items: Sequence[tuple[str, str]], *, id_key: str = "id",
                            text_key: str = "text", in_array: int = 3, in_csv: int = 2) -> dict[str, list[str]]:
    """Write *items* (``(id, text)``) into *directory*: the last *in_csv* into c.csv, the *in_array* before
    them into b.json, the rest into a.jsonl. Returns each file's ids."""
    directory.mkdir(parents=True, exist_ok=True)
    items = list(items)
    cut_csv = len(items) - in_csv
    cut_array = cut_csv - in_array
    lines = [_jsonl_line(n, item_id, text, id_key, text_key) for n, (item_id, text) in enumerate(items[:cut_array])]
    (directory / JSONL).write_bytes(b"\xef\xbb\xbf" + "".join(line + "\r\n" for line in lines).encode("utf-8"))
    array = [{id_key: item_id, "source": "import", text_key: text} for item_id, text in items[cut_array:cut_csv]]
    (directory / ARRAY).write_text(json.dumps(array, indent=4, ensure_ascii=False) + "\n", encoding="utf-8")
    rows = "".join(f'{item_id},"{text}"\n' for item_id, text in items[cut_csv:])
    (directory / CSV).write_text(f"{id_key},{text_key}\n" + rows, encoding="utf-8")
    return {JSONL: [i for i, _ in items[:cut_array]], ARRAY: [i for i, _ in items[cut_array:cut_csv]],
            CSV: [i for i, _ in items[cut_csv:]]}


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file of *directory* (hidden ones too) and its bytes."""
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.is_file()}
