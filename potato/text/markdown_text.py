"""Values from a config or a run as Markdown that renders as written: the model card's and the Prefect report's.

A label may hold ``|`` or ``*``, a schema name a newline: every value is
escaped, a table cell's code span keeps its pipes escaped.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

_MARKDOWN = str.maketrans({c: "\\" + c for c in "\\`*_[]<>|#"} | {"\n": " ", "\r": " "})


def md(value: Any) -> str:
    """*value* as Markdown text that renders as written."""
    return str(value).translate(_MARKDOWN)


def code(value: Any) -> str:
    """*value* as a code span in a table cell (escapes do not work inside one; a pipe still ends a cell)."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
    return "`" + " ".join(text.replace("`", "'").replace("|", "\\|").split()) + "`"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table's lines; the cells are written as given (escape them first)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines
