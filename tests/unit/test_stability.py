"""The stopping signal: the share of unlabelled items whose predicted label changed since the previous run."""

from __future__ import annotations

from click.testing import CliRunner

from potato.cli import main
from potato.config import load_config
from potato.results import stability
from tests.unit.test_quality_gate import LABELS, _record, _truth, project  # noqa: F401 - the fixture


def _changed(log) -> list[str]:
    return [text for _, text in log.lines if "predicted labels changed since" in text]


def test_predictions_that_settle_say_so_and_the_runs_table_shows_the_share(project):  # noqa: F811
    first, log = _record(project, _truth)
    assert _changed(log) == []  # a schema's first run has nothing to compare with
    second, log = _record(project, _truth)
    (line,) = _changed(log)
    unlabelled = stability.read(load_config(project), second)[0].compared
    assert unlabelled > 0
    assert line == (f"sentiment: 0 of {unlabelled} unlabelled items' predicted labels changed since run {first} "
                    "(0.0 %), below model_training.stable_below (1 %): the predictions have settled; more labels "
                    "like these may change the model little")
    # Flip every fourth item's label: a quarter of what annotators see changed.
    third, log = _record(project, lambda i: LABELS[(i + 1) % 2] if i % 4 == 0 else _truth(i))
    (change,) = stability.read(load_config(project), third)
    assert change.previous_run == second and 0.05 < change.share < 0.5 and not change.stable
    assert _changed(log) == [change.describe()]
    assert change.describe().endswith(f"({100 * change.share:.1f} %); settled below 1 % "
                                      "(model_training.stable_below)")
    out = CliRunner().invoke(main, ["training", "runs", str(project)]).output.splitlines()
    start = out[0].index("CHANGED")
    assert [line[start:].split("  ")[0] for line in out[1:]] == [
        f"{100 * change.share:.1f} %", "0.0 % (stable)", "-"]
