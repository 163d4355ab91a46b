"""Promote a run past the quality gate, and pin the run annotators see.

``potato training promote`` (the run page's button, the admin API's
``POST runs/<id>/promote``) writes a run's predictions back although the gate
held them (``potato.results.quality_gate``): the user has looked and wants them. Its
bundle was deleted at clean-up, so the writeback reads the project's items as
they are now, and the leak guard takes what the run trained on from the run's
own ``labels.jsonl``, as decision-calibrate's rewrite does. ``pin`` keeps a
run's predictions with annotators until ``unpin``: the gate holds back every
newer run of its schemas.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from potato.bundle.build import build_bundle
from potato.config import ProjectConfig
from potato.errors import PromoteError
from potato.results import quality_gate
from potato.results.evaluation import trained_on
from potato.results.live_writeback import LiveReport, publish
from potato.results.writeback import WritebackSummary, live_run_ids
from potato.runs.paths import private_dir, run_paths
from potato.runs.store import SUCCEEDED, Run, Store


def promote(config: ProjectConfig, store: Store, run_id: int, by: str) -> tuple[WritebackSummary, LiveReport | None]:
    """Write run *run_id*'s predictions of its writeback schemas back, whatever the gate said; *by* says who
    asked (``by an admin on the Training page``, ``with potato training promote, by the account …``). Raises
    ``PromoteError`` naming why it cannot."""
    run = store.get_run(run_id)
    schemas = [s for s in run.schemas if s in config.model_training.writeback.schemas]
    paths = run_paths(config, run_id)
    why = None
    if run.state != SUCCEEDED:
        why = f"it {run.state}" if run.state in ("failed", "cancelled") else f"it is {run.state}"
    elif run.retracted_at is not None:
        why = "its predictions were retracted"
    elif not schemas:
        why = "it trained no schema of model_training.writeback.schemas"
    elif not paths.predictions.is_file() or not paths.labels.is_file():
        why = "its directory was deleted (model_training.retain_runs) or holds no predictions"
    if why:
        raise PromoteError(f"Run {run_id} cannot be promoted: {why}")
    scratch = Path(tempfile.mkdtemp(prefix=f"promote-{run_id}-", dir=private_dir(config.training_dir)))
    try:
        build_bundle(config, schemas, scratch)
        result = publish(config, run_id, schemas, paths.predictions, scratch,
                         trained_on=trained_on(paths.dir, schemas),
                         gate=[f"Promoted past the quality gate {by}"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    quality_gate.mark_promoted(paths, by)
    return result


def pin(config: ProjectConfig, store: Store, run_id: int, pinned: bool = True) -> str:
    """Pin (or unpin) run *run_id*; return what changed, in words."""
    store.get_run(run_id)  # no such run: StoreError
    if pinned and run_id not in live_run_ids(config):
        raise PromoteError(f"Run {run_id} cannot be pinned: annotators do not see its predictions now "
                           f"(`potato training promote {config.path} {run_id}` writes them back first)")
    quality_gate.set_pinned(config, run_id, pinned)
    if pinned:
        return (f"Run {run_id} is pinned: annotators keep its predictions, and newer runs of its schemas are "
                f"held back until `potato training unpin {config.path} {run_id}`")
    return f"Run {run_id} is no longer pinned: the next run that passes the quality gate replaces its predictions"


def predictions_state(config: ProjectConfig, run: Run, live: set[int], pins: set[int]) -> str:
    """What became of the run's predictions, for the Runs tables: ``live`` (annotators see them; ``pinned``
    too), ``held back`` (the quality gate's verdict, until promoted), ``retracted``, or ``-``."""
    if run.retracted_at is not None:
        return "retracted"
    if run.id in live:
        return "live, pinned" if run.id in pins else "live"
    if quality_gate.held_back(run_paths(config, run.id)):
        return "held back"
    return "-"
