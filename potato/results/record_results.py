"""Record a run's results on the server: its scores, its holdout evaluation, the writeback.

The flow's record-results step, without Prefect: the worker's ``scores.json``
goes into the store and the run log, then the trainer's own ``record`` hook
runs if it declares one (``potato.training.trainers.registry``: decision-calibrate
rewrites an earlier run's results instead), else the usual: the holdout
evaluation (``potato.results.evaluation``), the quality gate's verdicts
(``potato.results.quality_gate``), the stopping signal (``potato.results.stability``) and the
writeback of the schemas the gate let through (``potato.results.writeback``, and into
the items' own records when live: ``potato.results.live_writeback``).
Both read the server's own bundle, which clean-up removes only after this.
"""

from __future__ import annotations

from typing import Any

from potato.backends.base import RunContext
from potato.results import quality_gate, stability
from potato.results.evaluation import record_evaluation, schema_answers
from potato.results.live_writeback import LiveReport, publish
from potato.runs.runlog import RunLog
from potato.training.trainers import metrics
from potato.training.trainers.registry import hooks


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
    try:
        labels, kinds = schema_answers(ctx.bundle_dir, ctx.run.schemas)
    except (OSError, ValueError, KeyError):
        labels, kinds = {}, {}  # no manifest: write_back says so
    verdicts = _judge(ctx, kinds, labels)
    _stability(ctx, kinds)
    held = {v.schema for v in verdicts if not v.written}
    predictions = ctx.paths.predictions
    if held and not [s for s in ctx.run.schemas if s in ctx.config.model_training.writeback.schemas
                      and s not in held]:
        return scores  # nothing to write: what annotators see stays as it was
    summary, live = publish(ctx.config, ctx.run_id, [s for s in ctx.run.schemas if s not in held], predictions,
                            ctx.bundle_dir, gate=[v.text for v in verdicts])
    bad_lines = summary.describe_bad_lines(predictions)
    if bad_lines:
        ctx.log.warning(bad_lines)
    ctx.log.info(summary.describe())
    log_live(ctx.log, live)
    return scores


def _judge(ctx: RunContext, kinds: dict[str, str], labels: dict[str, list[str]]) -> list[quality_gate.Verdict]:
    """The quality gate's verdict per writeback schema, in the run log and ``gate.json``."""
    verdicts = quality_gate.judge(ctx.config, ctx.run_id, kinds, labels)
    for verdict in verdicts:
        (ctx.log.info if verdict.written else ctx.log.warning)(verdict.text)
    if verdicts:
        quality_gate.save(ctx.paths, verdicts)
    return verdicts


def log_live(log: RunLog, live: LiveReport | None) -> None:
    """The live writeback's line in the run log: a warning when something was left as it was."""
    if live is not None:
        (log.warning if live.error or live.problems else log.info)(live.describe())


def _stability(ctx: RunContext, kinds: dict[str, str]) -> None:
    """The stopping signal per label schema (``potato.results.stability``), in the run log and ``stability.json``."""
    changes = stability.measure(ctx.config, ctx.store, ctx.run_id, kinds)
    for change in changes:
        ctx.log.info(change.describe())
    if changes:
        stability.save(ctx.config, ctx.run_id, changes)
