"""One config key, and the findings of checking a config: the vocabulary every key table is written in.

A key table (``potato.config``'s own, and each backend type's in
``potato.backends``) is a tuple of ``Key``: its name, the kind of value it
takes (a name in ``potato.config.KINDS``), its default and what it means.
Validation, defaults, the error for an unknown key and docs/backends.md all
read the tables. Checking collects ``Issue``s into ``Issues``, so one pass
reports every error.

Pure: no I/O, and nothing of Potato's, so a backend type can declare its
keys without importing the config machinery that reads them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Issue:
    """One error or warning: the dotted key path ("" for the file) and a sentence."""

    path: str
    message: str


@dataclass(frozen=True)
class Key:
    """One config key: its kind (a name in ``KINDS``), default and meaning."""

    name: str
    kind: str
    meaning: str
    default: Any = None
    required: bool = False
    minimum: float | None = None
    maximum: float | None = None
    default_text: str | None = None  # the docs' default when not the literal value

    def doc_default(self) -> str:
        if self.required:
            return "**required**"
        if self.default_text is not None:
            return self.default_text
        if self.default is None or self.default == () or self.default == {}:
            return "—"
        if isinstance(self.default, bool):
            return f"`{str(self.default).lower()}`"
        return f"`{self.default}`"

    def doc_kind(self) -> str:
        if self.minimum is not None and self.maximum is not None:
            return f"{self.kind}, {self.minimum:g}..{self.maximum:g}"
        if self.minimum is not None:
            return f"{self.kind} ≥ {self.minimum:g}"
        return self.kind


class Issues:
    """Every error and warning one pass over a config finds, in the order found."""

    def __init__(self) -> None:
        self.errors: list[Issue] = []
        self.warnings: list[Issue] = []

    def error(self, path: str, message: str) -> None:
        self.errors.append(Issue(path, message))

    def warn(self, path: str, message: str) -> None:
        self.warnings.append(Issue(path, message))


# The experiment trackers a run reports to (model_training.report_to), named as transformers' report_to names them.
TRACKERS = ("mlflow", "tensorboard", "wandb")
# Known to transformers, not (yet) reported to here: a config naming one is told so rather than "unknown".
TRACKERS_NOT_HERE = ("comet_ml", "clearml", "neptune", "dagshub", "dvclive", "swanlab", "trackio")


SLURM_TIME_FORMS = (
    "MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS, "
    "DAYS-HOURS:MINUTES, DAYS-HOURS:MINUTES:SECONDS or UNLIMITED"
)

# sbatch --time's forms (man sbatch, "-t, --time"), each with the factors that
# turn its numbers into seconds.
_SLURM_TIME_PATTERNS = (
    (re.compile(r"(\d+)"), (60,)),
    (re.compile(r"(\d+):(\d+)"), (60, 1)),
    (re.compile(r"(\d+):(\d+):(\d+)"), (3600, 60, 1)),
    (re.compile(r"(\d+)-(\d+)"), (86400, 3600)),
    (re.compile(r"(\d+)-(\d+):(\d+)"), (86400, 3600, 60)),
    (re.compile(r"(\d+)-(\d+):(\d+):(\d+)"), (86400, 3600, 60, 1)),
)


def parse_slurm_time(value: Any) -> int | None:
    """Seconds in a SLURM ``--time`` value; None for UNLIMITED/INFINITE.

    Accepts every form sbatch accepts (an int is minutes). Raises ValueError
    naming the accepted forms otherwise (``"4h"`` is not one).
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value * 60
    if isinstance(value, str):
        text = value.strip()
        if text.upper() in ("UNLIMITED", "INFINITE"):
            return None
        for pattern, factors in _SLURM_TIME_PATTERNS:
            match = pattern.fullmatch(text)
            if match:
                return sum(int(n) * f for n, f in zip(match.groups(), factors))
    raise ValueError(f'a SLURM time: {SLURM_TIME_FORMS} (e.g. "04:00:00")')
