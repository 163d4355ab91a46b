"""Record a run's results on the server: its scores, its holdout evaluation, the writeback.

The flow's record-results step, without Prefect: the worker's ``scores.json``
goes into the store and the run log, then the trainer's own ``record`` hook
runs if it declares one (``potato.trainers.registry``: decision-calibrate
rewrites an earlier run's results instead), else the usual two: the holdout
evaluation (``potato.evaluation``) and the writeback (``potato.writeback``,
and into the items' own records when live: ``potato.live_writeback``).
Both read the server's own bundle, which clean-up removes only after this.
"""

from __future__ import annotations

from typing import Any

from potato.backends.base import RunContext
from potato.evaluation import record_evaluation
from potato.live_writeback import LiveReport, publish
from potato.runlog import RunLog
from potato.trainers import metrics
from potato.trainers.registry import hooks


def record_results(ctx: RunContext) -> dict[str, Any]:
    """Store and log the run's holdout scores, then evaluate and write back (or the trainer's hook); return them."""
    scores = ctx.paths.read_scores()
    ctx.store.update_run(ctx.run_id, scores=scores)
    records = hooks(ctx.run.trainers, "record")
    if records:  # in place of the evaluation and writeback; its worker logged its own line per schema
        for record in records:
            record(ctx)
        return scores
    for schema, s in scores.items():
        ctx.log.info(metrics.describe(schema, s))
    try:
        record_evaluation(ctx.run_id, ctx.run_dir, ctx.bundle_dir, ctx.run.schemas)
    except (OSError, ValueError, KeyError) as exc:  # the pictures and calibration need it; the run does not
        ctx.log.warning(f"The holdout evaluation could not be kept: {type(exc).__name__}: {exc}")
    predictions = ctx.paths.predictions
    summary, live = publish(ctx.config, ctx.run_id, ctx.run.schemas, predictions, ctx.bundle_dir)
    bad_lines = summary.describe_bad_lines(predictions)
    if bad_lines:
        ctx.log.warning(bad_lines)
    ctx.log.info(summary.describe())
    log_live(ctx.log, live)
    return scores


def log_live(log: RunLog, live: LiveReport | None) -> None:
    """The live writeback's line in the run log: a warning when something was left as it was."""
    if live is not None:
        (log.warning if live.error or live.problems else log.info)(live.describe())
