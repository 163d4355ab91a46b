"""Report a run to Weights & Biases with its own client, online or offline, as its users set it.

W&B's own conventions, read from the annotation server's environment:
``WANDB_PROJECT`` (default: the project's name), ``WANDB_ENTITY``,
``WANDB_MODE`` (``offline`` keeps the run on disk for a later ``wandb sync``;
online needs ``WANDB_API_KEY`` or a ``wandb login`` on this machine, which
the client reads itself: the key is never passed, shown or stored here),
``WANDB_DIR`` (default: the project's ``annotation_output/training``, so its
runs sit in ``annotation_output/training/wandb``) and ``WANDB_LOG_MODEL``
(``end`` or ``true``: the run's model files as a W&B artifact, as
transformers' integration does).

One W&B run per training run, named ``run-N`` with the run id and project as
its config's ``potato/…`` keys: the options and counts as config, each
training step's numbers against that schema's ``train/step``, the holdout
scores in the summary, the learning curve as a table per metric, and the
run's files (scores, evaluation, report, pictures) in the run's files.

The client's own habits that do not suit a server are turned off: it does not
capture the server's console, sample its system, read its git repository or
program or its packages, or keep its service process after the report.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from potato.config import ProjectConfig
from potato.errors import TrackerError
from potato.trackers.tracked_run import TrackedRun
from potato.training.escaping import escaped

# WANDB_MODE's values that keep the run on disk ("dryrun": W&B's older name for offline).
OFFLINE_MODES = ("offline", "dryrun")
# How long a run's start may wait on W&B's servers (as long as an MLflow request may).
INIT_TIMEOUT_S = 30
# WANDB_LOG_MODEL's values that ask for the model (transformers': "checkpoint" logs each checkpoint; a run has one).
LOG_MODEL = ("end", "true", "1", "checkpoint")
# A file name W&B's run directory takes: the parts of an artifact path, each made of these only.
_PART = re.compile(r"[^0-9A-Za-z_\-.]")


def wandb_dir(config: ProjectConfig, env: dict[str, str]) -> Path:
    return Path(env["WANDB_DIR"]) if env.get("WANDB_DIR") else config.training_dir


def _safe_path(name: str) -> Path:
    """An artifact path as a relative path of plain parts (a schema's name is part of a picture's)."""
    parts = [_PART.sub("_", p) for p in name.split("/") if p not in ("", ".", "..")]
    return Path(*parts) if parts else Path("file")


def _step_metric(key: str) -> str:
    """The step a training number is logged against: ``train/step``, or ``<schema>/train/step``."""
    head, _, _ = key.rpartition("/train/")
    return f"{head}/train/step" if head else "train/step"


def _settings(wandb: Any, where: Path) -> Any:
    return wandb.Settings(silent=True, console="off", x_disable_stats=True, x_disable_meta=True,
                          x_disable_machine_info=True, disable_git=True, disable_code=True, save_code=False,
                          disable_job_creation=True, x_save_requirements=False, init_timeout=INIT_TIMEOUT_S,
                          root_dir=str(where))


def report(run: TrackedRun, config: ProjectConfig, env: dict[str, str] | None = None) -> str:
    """Log *run* as one W&B run; return the line the run log keeps (where it went)."""
    env = dict(os.environ) if env is None else env
    mode = (env.get("WANDB_MODE") or "online").strip().lower()
    if mode == "disabled":  # W&B's own switch for "log nothing": said, not a warning
        return "W&B: WANDB_MODE is disabled, so nothing was logged"
    offline = mode in OFFLINE_MODES
    try:
        import wandb
    except ImportError:
        raise TrackerError("the wandb package is not installed on the annotation server: pip install wandb (or "
                           "the trackers extra) into its environment") from None
    where = wandb_dir(config, env)
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrackerError(f"cannot write W&B's files in {where}: {exc.strerror or exc}; set WANDB_DIR to a "
                           "directory the annotation server can write") from None
    project = env.get("WANDB_PROJECT") or run.project
    try:
        tracked = wandb.init(project=project, entity=env.get("WANDB_ENTITY") or None, name=run.name,
                             dir=str(where), mode="offline" if offline else mode,
                             config={**{k: escaped(v) for k, v in run.params.items()}, "potato/run_id": run.run_id,
                                     "potato/project": escaped(run.project)},
                             reinit="create_new", settings=_settings(wandb, where))
    except Exception as exc:  # the client's own errors: a missing login, a refused key, no route to W&B
        raise TrackerError(_refusal(exc, mode)) from None
    try:
        _log(wandb, tracked, run)
        if run.model_dir is not None and (env.get("WANDB_LOG_MODEL") or "").strip().lower() in LOG_MODEL:
            artifact = wandb.Artifact(name=f"model-{run.name}", type="model")
            artifact.add_dir(str(run.model_dir))
            tracked.log_artifact(artifact)
        run_dir = tracked.dir
        url = None if offline else tracked.url  # an offline run has none (and the client says so)
    finally:
        tracked.finish()
        wandb.teardown()  # its service process would outlive the report in the server's process
    offline_dir = Path(run_dir).parent
    if offline:
        return f"W&B: offline run {run.name} of project {project!r} in {offline_dir} (wandb sync {offline_dir})"
    return f"W&B: run {run.name} of project {project!r} at {url}"


def _log(wandb: Any, tracked: Any, run: TrackedRun) -> None:
    for step_metric in sorted({_step_metric(k) for s in run.steps for k in s.values}):
        tracked.define_metric(step_metric, hidden=True)
        tracked.define_metric(step_metric[:-len("step")] + "*", step_metric=step_metric)
    for step in run.steps:
        steps = {_step_metric(k): step.step for k in step.values}
        tracked.log({**step.values, **steps})
    tracked.summary.update(run.scores)
    curves: dict[str, list[list[float]]] = {}
    for name, items, value in run.curve:
        curves.setdefault(name, []).append([items, value])
    for name, rows in curves.items():
        tracked.log({name: wandb.Table(columns=["items", name.rpartition("/")[2]], data=rows)})
    files = Path(tracked.dir)
    for name, data in run.files.items():
        path = files / _safe_path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        tracked.save(str(path), base_path=str(files), policy="now")


def _refusal(exc: Exception, mode: str) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if mode not in OFFLINE_MODES and re.search(r"api[_ ]key|login|authenticat|401|403", text, re.IGNORECASE):
        return (f"W&B refused the run ({text}): set WANDB_API_KEY in the annotation server's environment (or run "
                "`wandb login` as its user), or WANDB_MODE=offline to keep runs on disk for `wandb sync`")
    return f"W&B could not start the run ({text})" + (
        "; set WANDB_MODE=offline to keep runs on disk for `wandb sync`" if mode not in OFFLINE_MODES else "")
