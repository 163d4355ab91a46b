"""Set up the Prefect side of Potato's training: ``python -m deployments.create``.

Creates (or updates) the ``process`` work pool ``potato-training`` with a
concurrency limit of 1, the global concurrency limit ``potato-training``
that every training flow holds, and the deployment ``training-run/potato``
from ``prefect.yaml``. Needs ``PREFECT_API_URL`` to point at the Prefect API
the annotation server uses. Then start a worker on the annotation server's host:

    prefect worker start --pool potato-training

and set ``model_training.prefect_deployment: training-run/potato`` so that
Potato's dispatcher starts runs through the deployment.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

POOL = "potato-training"
DEPLOYMENT = "training-run/potato"
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def ensure_work_pool(name: str = POOL, concurrency: int = 1) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectAlreadyExists

    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=name, type="process", concurrency_limit=concurrency))
        except ObjectAlreadyExists:
            client.update_work_pool(name, WorkPoolUpdate(concurrency_limit=concurrency))


def deploy(project_root: Path = PROJECT_ROOT) -> None:
    """Register every deployment of prefect.yaml (``prefect --no-prompt deploy --all``)."""
    env = dict(os.environ, PWD=str(project_root))
    subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"],
        cwd=project_root, env=env, check=True, timeout=300,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deployments.create", description=__doc__.splitlines()[0])
    parser.add_argument("--pool", default=POOL)
    args = parser.parse_args(argv)
    if not os.environ.get("PREFECT_API_URL"):
        print("PREFECT_API_URL is not set: point it at the Prefect API the annotation server uses", file=sys.stderr)
        return 1
    from potato.prefect_api import ensure_concurrency_limit

    ensure_work_pool(args.pool)
    ensure_concurrency_limit("potato-training", 1)
    deploy()
    print(f"Deployment {DEPLOYMENT} is on work pool {args.pool!r}; start a worker with:")
    print(f"  prefect worker start --pool {args.pool}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
