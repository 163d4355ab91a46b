"""How problems in a project's data are worded: paths as the user wrote them, repeats grouped."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Callable

from potato.training.escaping import QUOTED, quote_all


def show_path(path: Path, base: Path | None) -> str:
    """*path* relative to *base* when it lies under it (as users wrote it in the config)."""
    if base is not None:
        try:
            return str(Path(path).relative_to(base))
        except ValueError:
            pass
    return str(path)


class GroupedWarnings:
    """Collects repeated warnings of one kind and renders a few examples plus a count.

    A misconfigured label on 500 k items must not flood the run log: each kind
    lists ``QUOTED`` examples, each cut short (``potato.training.escaping``).
    """

    def __init__(self) -> None:
        self.groups: dict[tuple, list[str]] = {}
        self.counts: dict[tuple, int] = defaultdict(int)

    def add(self, key: tuple, example: str) -> None:
        self.counts[key] += 1
        examples = self.groups.setdefault(key, [])
        if len(examples) < QUOTED:
            examples.append(example)

    def render(self, make: Callable[[tuple, str], str]) -> list[str]:
        """One warning per key: ``make(key, "'a', 'b' and 7 more")`` (each example quoted short)."""
        return [make(key, quote_all(examples, total=self.counts[key])) for key, examples in self.groups.items()]
