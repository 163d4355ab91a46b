"""``potato validate``: the config's errors, warnings and acknowledged warnings.

``validate_config_file(path)`` is the one check: the server calls it at
start-up (refusing to start on errors, printing warnings); ``potato validate``
calls it with ``apply_acknowledge=True``, since the top-level
``validation.acknowledge`` block is read by ``potato validate`` only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import click

from potato.config import (
    BuildResult,
    Issue,
    ProjectConfig,
    build_config,
    describe_live,
    did_you_mean,
    read_config_file,
)
from potato.errors import ConfigError, ProjectDataError
from potato.items.data_warnings import show_path

# Shorter entries would match warnings by accident ("time", "is").
MIN_ACKNOWLEDGE_LENGTH = 12


@dataclass(frozen=True)
class Acknowledged:
    """A warning that a ``validation.acknowledge`` entry matched."""

    path: str
    message: str
    entry: str


@dataclass(frozen=True)
class ValidationReport:
    """What validating one config file found.

    ``config`` is None when there are errors. ``warnings`` are the ones no
    acknowledge entry matched (every warning when acknowledge is not applied).
    """

    path: Path
    config: ProjectConfig | None
    errors: tuple[Issue, ...]
    warnings: tuple[Issue, ...]
    acknowledged: tuple[Acknowledged, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors

    def passes(self, strict: bool = False) -> bool:
        """True when valid and, with *strict*, no unacknowledged warning is left."""
        return self.ok and not (strict and self.warnings)

    def raise_for_errors(self) -> ProjectConfig:
        """The config, or ``ConfigError`` listing every error (the server's start-up check)."""
        from potato.config import format_errors

        if self.config is None:
            exc = ConfigError(format_errors(self.path, self.errors))
            exc.issues = self.errors
            raise exc
        return self.config

    @property
    def live_writeback(self) -> str | None:
        """Where annotators see predictions, when the project writes some into a data_directory's items."""
        return describe_live(self.config) if self.config is not None else None

    def to_json(self, strict: bool = False) -> dict[str, Any]:
        found = {
            "ok": self.passes(strict),
            "errors": [{"path": e.path, "message": e.message} for e in self.errors],
            "warnings": [{"path": w.path, "message": w.message} for w in self.warnings],
            "acknowledged": [
                {"path": a.path, "message": a.message, "acknowledged_by": a.entry}
                for a in self.acknowledged
            ],
        }
        if self.live_writeback:
            found["live_writeback"] = self.live_writeback
        return found


def read_acknowledge(raw: Mapping[str, Any]) -> tuple[list[str], list[Issue]]:
    """The ``validation.acknowledge`` entries of *raw*, and warnings about the block's shape."""
    block = raw.get("validation")
    if block is None:
        return [], []
    if not isinstance(block, dict):
        return [], [Issue("validation", f"validation is {block!r}; use a mapping with the key "
                          "acknowledge (a list of warning texts)")]
    problems = [
        Issue(f"validation.{k}", f"validation.{k} is not a key of validation"
              f"{did_you_mean(k, ['acknowledge'], '.')} Accepted keys: acknowledge")
        for k in block if k != "acknowledge"
    ]
    entries = block.get("acknowledge")
    if entries is None:
        return [], problems
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        problems.append(Issue("validation.acknowledge", f"validation.acknowledge is {entries!r}; use a "
                              "list of strings, each part of a warning's text"))
        return [], problems
    return entries, problems


def apply_acknowledgements(
    warnings: tuple[Issue, ...], entries: list[str]
) -> tuple[tuple[Issue, ...], tuple[Acknowledged, ...], tuple[Issue, ...]]:
    """Match *entries* against *warnings*.

    Returns (warnings left, acknowledged warnings, warnings about entries that
    are too short or match nothing). Each entry is a case-sensitive substring
    of the warning's text; an entry naming a backend therefore acknowledges
    that backend's warnings only.
    """
    usable = [(i, e) for i, e in enumerate(entries) if len(e) >= MIN_ACKNOWLEDGE_LENGTH]
    problems = [
        Issue(f"validation.acknowledge[{i}]",
              f"validation.acknowledge[{i}] is {e!r} ({len(e)} characters); an entry needs at least "
              f"{MIN_ACKNOWLEDGE_LENGTH} characters of a warning's text, so it cannot match "
              "warnings by accident")
        for i, e in enumerate(entries) if len(e) < MIN_ACKNOWLEDGE_LENGTH
    ]
    left, acknowledged, used = [], [], set()
    for warning in warnings:
        entry = next(((i, e) for i, e in usable if e in warning.message), None)
        if entry is None:
            left.append(warning)
        else:
            used.add(entry[0])
            acknowledged.append(Acknowledged(warning.path, warning.message, entry[1]))
    # An entry may match several warnings; it is unused only if it matched none.
    for i, e in usable:
        if i not in used and not any(e in w.message for w in warnings):
            problems.append(Issue(f"validation.acknowledge[{i}]",
                                  f"validation.acknowledge[{i}] is {e!r}, which matches no warning; "
                                  "remove it or copy part of a warning's text"))
    problems.sort(key=lambda p: p.path)
    return tuple(left), tuple(acknowledged), tuple(problems)


def validate_config_file(path: str | Path, *, apply_acknowledge: bool = False,
                         read_items: bool = False) -> ValidationReport:
    """Check the config at *path*; never raises for a bad config.

    The server calls this at start-up (``report.raise_for_errors()`` then
    print ``report.warnings``). ``potato validate`` passes
    ``apply_acknowledge=True`` to read ``validation.acknowledge``, and
    ``read_items=True`` to read every item as a run would (``item_errors``).
    """
    path = Path(path)
    raw, errors = read_config_file(path)
    if raw is None:
        return ValidationReport(path=path.absolute(), config=None, errors=errors, warnings=())
    result = build_config(raw, path)
    if read_items and result.config is not None:
        item_errors = items_error(result.config)
        if item_errors:
            result = BuildResult(None, result.errors + item_errors, result.warnings)
        else:
            result = BuildResult(result.config, result.errors, result.warnings + not_live_files(result.config))
    if not apply_acknowledge:
        return ValidationReport(path=path.absolute(), config=result.config,
                                errors=result.errors, warnings=result.warnings)
    entries, shape_problems = read_acknowledge(raw)
    left, acknowledged, entry_problems = apply_acknowledgements(result.warnings, entries)
    return ValidationReport(
        path=path.absolute(),
        config=result.config,
        errors=result.errors,
        warnings=left + tuple(shape_problems) + entry_problems,
        acknowledged=acknowledged,
    )


def items_error(config: ProjectConfig) -> tuple[Issue, ...]:
    """The error that would fail every run of *config* at its bundle, found by reading its items now.

    A data file that does not parse, an item without an id, an id repeated,
    an id UTF-8 cannot encode: each names the file and the line. And a record
    of the data_directory that already holds the field the live writeback
    would write (``potato.items.live_items.foreign_field``).
    """
    from potato.items.live_items import foreign_field
    from potato.items.read import read_items
    try:
        for _ in read_items(config):
            pass
    except ProjectDataError as exc:
        return (Issue("data_files", str(exc)),)
    foreign = foreign_field(config)
    return (Issue("model_training.writeback.live", foreign),) if foreign else ()


def not_live_files(config: ProjectConfig) -> tuple[Issue, ...]:
    """With the live writeback on, a warning for each data file of the directory it leaves as it is (a link,
    a hard-linked, read-only or another account's file: ``potato.items.live_items.not_rewritten``)."""
    from potato.items.live_items import not_rewritten_files

    wb = config.model_training.writeback
    if not (wb.live and wb.schemas):
        return ()
    return tuple(Issue("data_directory", f"{show_path(path, config.task_dir)} is {why}. Its items' predictions "
                       "reach annotators only through pre_annotation.predictions_file, once Potato 2.12 restarts")
                 for path, why in not_rewritten_files(config))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def warning_lines(warnings: tuple[Issue, ...]) -> list[str]:
    """The config's warnings as ``potato validate``, ``potato start`` and ``potato training run`` print them."""
    return [f"warning: {w.message}" for w in warnings]


def format_report(report: ValidationReport, strict: bool = False) -> str:
    """The human report: errors, warnings, acknowledged warnings, then one summary line."""
    lines = [f"error: {e.message}" for e in report.errors]
    lines += warning_lines(report.warnings)
    lines += [f"acknowledged: {a.message} (by {a.entry!r})" for a in report.acknowledged]
    if report.live_writeback:
        lines.append(report.live_writeback)
    if not report.ok:
        verdict = "invalid"
    elif not report.passes(strict):
        verdict = "fails --strict"
    else:
        verdict = "valid"
    counts = ", ".join((
        _count(len(report.errors), "error"),
        _count(len(report.warnings), "warning"),
        f"{len(report.acknowledged)} acknowledged",
    ))
    lines.append(f"{report.path}: {verdict} ({counts})")
    return "\n".join(lines)


def run_validate_command(path: str | Path, strict: bool = False, as_json: bool = False) -> int:
    """``potato validate CONFIG [--strict] [--json]``: print the report; return the exit status."""
    report = validate_config_file(path, apply_acknowledge=True, read_items=True)
    if as_json:
        click.echo(json.dumps(report.to_json(strict), indent=2))
    else:
        click.echo(format_report(report, strict))
    return 0 if report.passes(strict) else 1
