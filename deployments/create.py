"""Set up the Prefect side of Potato's training: ``python -m deployments.create``.

    python -m deployments.create
        the ``process`` work pool ``potato-training`` and the deployment
        ``training-run/potato`` of prefect.yaml, whose runs name their project
        in their parameters (``--param config=… --param backend=…``);
    python -m deployments.create --config config.yaml [--cron "0 3 * * *" [--timezone Europe/Berlin]]
        the work pool, the project's concurrency limit and the project's own
        deployment ``training-run/<project>`` (its config as a parameter,
        its ``model_training.backend``), scheduled by the cron expression:
        nightly retraining the Prefect way.
    python -m deployments.create --allow-config /srv/reviews/config.yaml [--allow-config …] [--config …]
        as above, and the configs the flow accepts
        from a flow run's parameters; without an allow-list it accepts any.
        Anyone who can reach the Prefect API can start a flow run with any
        ``config`` parameter (docs/prefect.md, "The Prefect API is an
        admin interface"): with an allow-list, a config not on it is refused before
        it is read, naming the allow-list. It lives on the worker's host,
        beside this file (``deployments/allowed-configs.json``); once it
        exists, ``--config`` adds its project's config to it.

Needs ``PREFECT_API_URL`` to point at the Prefect API the annotation server
uses. Then start a worker on the annotation server's host
(``prefect worker start --pool potato-training``); set
``model_training.prefect_deployment: training-run/potato`` for runs started
from Potato to go through it too.

The pool has no concurrency limit of Potato's making: several projects may
share it (and one Prefect server), and each project's flows hold that
project's limit ``potato-training-<project>`` (``potato.runs.prefect_runs``), so
one project's queue never waits for another's. A limit its operator set on it
is theirs and stays; only the limit 1 that Potato before this version gave the
pools it made (and no description) is lifted. Deployments are registered by
``prefect deploy`` from prefect.yaml, the Prefect way, so this command and a
hand-edited prefect.yaml make the same deployments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from potato.runs import prefect_runs

POOL = "potato-training"
FLOW = "training-run"
GENERIC = "potato"  # prefect.yaml's deployment: one for every project
ENTRYPOINT = "flows/training_run.py:training_run"
PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEPLOY_TIMEOUT_S = 300
POOL_DESCRIPTION = ("Potato's training runs (python -m deployments.create). No concurrency limit of Potato's: "
                    "each project's flows hold their own, potato-training-<project>.")
# What Potato before this version set on the pools it created (with no description).
OLDER_POTATOS_LIMIT = 1


class SetupError(Exception):
    """Raised when the command line names something that cannot make a deployment (exit status 2)."""

    status = 2


class DeployFailed(SetupError):
    """Raised when ``prefect deploy`` fails; its output is in the message (exit status 1)."""

    status = 1


def build_project_deploy_argv(name: str, config: Path, tags: list[str], cron: str | None,
                              timezone: str | None, python: str | None = None) -> list[str]:
    """Return the ``prefect deploy`` argv that registers one project's deployment *name*."""
    argv = [python or sys.executable, "-m", "prefect", "--no-prompt", "deploy", ENTRYPOINT,
            "--name", name, "--pool", POOL, "--params", json.dumps({"config": str(config)})]
    for tag in tags:
        argv += ["--tag", tag]
    if cron:  # the zone always explicit, so that the Prefect UI shows it
        argv += ["--cron", cron, "--timezone", timezone or "UTC"]
    return argv


def check_schedule(cron: str, timezone: str | None) -> None:
    """Raise ``SetupError`` naming the value when *cron* or *timezone* would not make a schedule."""
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        CronSchedule(cron=cron, timezone=timezone or "UTC")
    except ValidationError as exc:
        why = "; ".join(error["msg"] for error in exc.errors())
        raise SetupError(f"--cron {cron!r} --timezone {timezone or 'UTC'!r} is not a schedule Prefect accepts ({why}). "
                         f"Example: --cron \"0 3 * * *\" --timezone Europe/Berlin") from None


def ensure_work_pool(name: str = POOL) -> str | None:
    """Create the ``process`` work pool *name*; on an existing one, lift only a limit Potato set. Returns
    what the user should know about the pool's concurrency limit, or None.

    Potato before this version created its pools with ``concurrency_limit=1`` and
    no description; this one gives them ``POOL_DESCRIPTION`` and no limit. So a
    limit on a pool with that description, or with another description, or
    other than 1, is its operator's.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=name, type="process", description=POOL_DESCRIPTION))
            return None
        except ObjectAlreadyExists:
            pool = client.read_work_pool(name)
        limit = pool.concurrency_limit
        if limit is None:
            return None
        if limit == OLDER_POTATOS_LIMIT and not pool.description:
            client.update_work_pool(name, WorkPoolUpdate(concurrency_limit=None, description=POOL_DESCRIPTION))
            return (f"Lifted the concurrency limit {limit} that an older Potato gave work pool {name!r}: each "
                    "project's flows hold their own limit")
        return (f"Work pool {name!r} keeps the concurrency limit {limit} set on it: at most {limit} flow run(s) at "
                "once across every project on it (each project's own limit of one still holds)")


def deploy(argv: list[str]) -> None:
    """Run ``prefect deploy`` in the project root (prefect.yaml's pull step names it as ``$PWD``)."""
    env = dict(os.environ, PWD=str(PROJECT_ROOT))
    done = subprocess.run(argv, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=DEPLOY_TIMEOUT_S)
    if done.returncode != 0:
        raise DeployFailed(f"prefect deploy failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")


def load_project(config_path: str, cron: str | None, timezone: str | None):
    """Return the project's config, or raise ``SetupError`` for a bad config or schedule (before any Prefect call)."""
    from potato.config import load_config
    from potato.errors import ConfigError

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise SetupError(str(exc)) from None
    if cron:
        check_schedule(cron, timezone)
    return config


def deploy_project(config, cron: str | None, timezone: str | None) -> str:
    """Register the project's own deployment and its concurrency limit; return ``training-run/<project>``."""
    from potato.runs.prefect_api import ensure_concurrency_limit
    from potato.runs.prefect_runs import limit_name, project_key_of

    key = project_key_of(config)
    ensure_concurrency_limit(limit_name(config), 1)
    deploy(build_project_deploy_argv(key, config.path.resolve(), ["potato", f"project:{key}"], cron, timezone))
    return f"{FLOW}/{key}"


def update_allow_list(configs: list[str], project_config: str | None) -> list[str] | None:
    """Add *configs* to the allow-list (creating it), and *project_config* when one exists; return it, or None."""
    missing = [c for c in configs if not Path(c).is_file()]
    if missing:
        raise SetupError(f"--allow-config {missing[0]!r}: no such file; name a project's config.yaml")
    if project_config and prefect_runs.read_allow_list() is not None:
        configs = [*configs, project_config]
    return prefect_runs.allow_configs(configs) if configs else prefect_runs.read_allow_list()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deployments.create", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="a project's config.yaml: create that project's own deployment")
    parser.add_argument("--cron", help='with --config: retrain on this cron schedule, e.g. "0 3 * * *"')
    parser.add_argument("--timezone", help="the cron schedule's time zone, e.g. Europe/Berlin (default UTC)")
    parser.add_argument("--allow-config", action="append", default=[], metavar="CONFIG",
                        help="accept only these configs (repeatable) in flow runs' parameters; see docs/prefect.md")
    args = parser.parse_args(argv)
    if (args.cron or args.timezone) and not args.config:
        parser.error("--cron and --timezone schedule one project's runs: give its --config too")
    if args.timezone and not args.cron:
        parser.error("--timezone needs --cron")
    if not os.environ.get("PREFECT_API_URL"):
        print("PREFECT_API_URL is not set: point it at the Prefect API the annotation server uses, "
              "e.g. export PREFECT_API_URL=http://127.0.0.1:4200/api", file=sys.stderr)
        return 1
    try:
        project = load_project(args.config, args.cron, args.timezone) if args.config else None
        allowed = update_allow_list(args.allow_config, args.config)
        if allowed is not None:
            print(f"Flow runs may train these configs ({prefect_runs.ALLOW_LIST}): {', '.join(allowed)}")
        note = ensure_work_pool(POOL)
        if note:
            print(note)
        if project is not None:
            name = deploy_project(project, args.cron, args.timezone)
            when = f"on the schedule {args.cron!r} ({args.timezone or 'UTC'})" if args.cron else "when started"
            print(f"Deployment {name} runs {project.path.resolve()} {when}, on work pool {POOL!r}")
        else:
            deploy([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"])
            print(f"Deployment {FLOW}/{GENERIC} is on work pool {POOL!r}")
    except SetupError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return exc.status
    print(f"Start a worker on the annotation server's host with:\n  prefect worker start --pool {POOL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
