"""What reporting a run to experiment trackers costs: the example project's run with and without ``report_to``.

    .venv/bin/python bench/tracker_cost.py [--repeats 1] [--mlflow URL]

The main job's project (``examples/review-sentiment``: MiniLM, its defaults),
copied to a scratch directory, trained by ``potato training run`` against a
warm embedded Prefect API, in the same run of this script:

- baseline: no ``report_to`` (what a user has without trackers);
- ours: ``report_to: [mlflow, tensorboard, wandb]``, reporting to a real
  MLflow tracking server (``--mlflow``, else ``mlflow server`` started from
  ``.venv-mlflow``: ``bash scripts/install-mlflow.sh``), TensorBoard and W&B
  offline (``WANDB_MODE=offline``: no W&B server here);
  ``--trackers mlflow,tensorboard`` measures fewer.

Prints each run's wall time (from the run's start to its end, as the store
has them), the report step's own seconds (its line in the run log), and the
report as a share of the run (target: under 2 %).

Measured (2 cores, ``--repeats 3``, all three trackers; the example's run is
short, 24 s on this machine today, so this is the hardest case for the
share): the report step took 0.55 s, 0.18 s and 0.40 s, median 0.40 s =
1.56 % of the run; the whole runs, 24.5 s without trackers and 25.6 s with,
differ by training's own noise. W&B's client takes 1-2 s to import and 0.2 s
to start its service: both now begin while the run trains
(``potato.trackers.import_clients_early``); before that, 0.52 s = 2.07 %.
MLflow and TensorBoard alone (``--trackers mlflow,tensorboard``, an earlier
day, a 16 s run): median 0.30 s = 1.88 %; before the trackers and the
artifact uploads went side by side: 0.52 s, 3.2 %.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from potato.config import load_config  # noqa: E402
from potato.runs.prefect_api import start_embedded  # noqa: E402
from potato.runs.store import Store  # noqa: E402
from tests.support.runs import POTATO, free_port, stop_group, wait_for  # noqa: E402

EXAMPLE = ROOT / "examples" / "review-sentiment"
_REPORTED = re.compile(r"Reported to [\w, ]+ in ([\d.]+) s")


def _project(scratch: Path, name: str, report_to: list[str]) -> Path:
    root = scratch / name
    # The annotators' answers come along; a run's own files (annotation_output/training/) do not.
    shutil.copytree(EXAMPLE, root, ignore=lambda where, names: ["training"] if where.endswith("annotation_output")
                    else [])
    config = root / "config.yaml"
    raw = yaml.safe_load(config.read_text())
    raw.setdefault("model_training", {})["report_to"] = report_to
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    return config


def _run(config: Path, env: dict[str, str]) -> tuple[float, float | None]:
    done = subprocess.run([POTATO, "training", "run", str(config)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    cfg = load_config(config)
    store = Store(cfg.training_dir / "runs.db")
    run = store.list_runs(limit=1)[0]
    log = (cfg.training_dir / "runs" / str(run.id) / "run.log").read_text()
    found = _REPORTED.search(log)
    return run.finished_at - run.started_at, float(found.group(1)) if found else None


def _mlflow(home: Path) -> tuple[str, subprocess.Popen]:
    import urllib.request

    command = ROOT / ".venv-mlflow" / "bin" / "mlflow"
    if not command.exists():
        raise SystemExit("no MLflow server: pass --mlflow URL, or run bash scripts/install-mlflow.sh")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([str(command), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                                "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}",
                                "--artifacts-destination", str(home / "art")],
                               cwd=home, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return True
        except OSError:
            return False

    wait_for(answers, 120, "mlflow server to answer")
    return url, process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--mlflow", help="an MLflow tracking server's address (default: start one)")
    parser.add_argument("--trackers", default="mlflow,tensorboard,wandb", help="the report_to list (comma-separated)")
    args = parser.parse_args()
    trackers = [name.strip() for name in args.trackers.split(",") if name.strip()]
    with tempfile.TemporaryDirectory(prefix="potato-tracker-cost-") as tmp:
        scratch = Path(tmp)
        server = None
        url = args.mlflow
        if not url:
            url, server = _mlflow(scratch)
        prefect = start_embedded(scratch / "prefect")
        env = dict(os.environ, HF_HUB_OFFLINE="1", MLFLOW_TRACKING_URI=url, PREFECT_API_URL=prefect.url,
                   WANDB_MODE="offline")
        try:
            plain, tracked, reports = [], [], []
            for k in range(args.repeats):
                plain.append(_run(_project(scratch, f"plain-{k}", []), env)[0])
                seconds, report = _run(_project(scratch, f"tracked-{k}", trackers), env)
                tracked.append(seconds)
                reports.append(report)
                print(f"repeat {k + 1}: without trackers {plain[-1]:.1f} s, with {seconds:.1f} s "
                      f"(the report step {report:.2f} s)", flush=True)
        finally:
            prefect.stop()
            if server is not None:
                stop_group(server, 10)
    p, t, r = statistics.median(plain), statistics.median(tracked), statistics.median(reports)
    print(f"\nmedian of {args.repeats}: a run without trackers {p:.1f} s, with {', '.join(trackers)} {t:.1f} s; "
          f"the report step took {r:.2f} s = {100 * r / t:.2f} % of the run (target < 2 %); "
          f"the whole runs differ by {t - p:+.1f} s ({100 * (t - p) / p:+.1f} %, training's own noise included)")


if __name__ == "__main__":
    main()
