"""The dispatcher: starts queued runs FIFO, one at a time, each as a flow, and reaps what they leave.

It starts the oldest queued run when no run is active, by starting the flow
in a child process (the embedded default) or through ``run_deployment``
when ``model_training.prefect_deployment`` names a deployment. The store's
atomic claim decides which run starts, so a server and a CLI dispatching at
once never start two; the flow also holds the project's Prefect
concurrency limit (``potato.runs.prefect_runs``), so runs started from Prefect
directly wait their turn too, and other projects on the same Prefect never
wait for this one. Every pass also reconciles (``potato.runs.reconcile``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time

from potato.config import ProjectConfig
from potato.runs import prefect_runs
from potato.runs.ending import end_run
from potato.runs.paths import importing_this_potato, private_dir, run_paths
from potato.runs.reconcile import reconcile, release_slot_if_idle
from potato.runs.store import END_STATES, Run, Store

log = logging.getLogger(__name__)


def describe_flow_exit(config: ProjectConfig, run_id: int, returncode: int) -> str:
    how = (f"was killed by {signal.Signals(-returncode).name}" if returncode < 0 and -returncode in
           signal.valid_signals() else f"exited with code {returncode}")
    return (f"The run's flow process {how} before the run finished; Potato stopped what the run left running "
            f"(see {run_paths(config, run_id).flow_log})")


class Dispatcher:
    """Starts queued runs FIFO, one at a time, each as a flow in a child process."""

    def __init__(self, config: ProjectConfig, store: Store, *, python: str | None = None, poll_seconds: float = 0.25):
        self.config = config
        self.store = store
        self.python = python or sys.executable
        self.poll_seconds = poll_seconds
        self.processes: dict[int, subprocess.Popen] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def dispatch_once(self) -> Run | None:
        """Reap finished flows, reconcile orphaned runs; start the oldest queued run if none is active."""
        ended = False
        for run_id, process in list(self.processes.items()):
            if process.poll() is not None:
                del self.processes[run_id]
                run = self.store.get_run(run_id)
                if run.state not in END_STATES and not run.ending:
                    error = describe_flow_exit(self.config, run_id, process.returncode)
                    ended = end_run(self.config, self.store, run_id, "failed", error).state in END_STATES or ended
        if ended:
            release_slot_if_idle(self.config, self.store)
        reconcile(self.config, self.store, own_flows=[p.pid for p in self.processes.values()])
        if self.config.model_training.prefect_deployment:
            prefect_runs.fail_runs_no_worker_started(self.config, self.store)
        run = self.store.claim_next_queued(only_when_idle=True, step="starting the run's flow")
        if run is not None:
            self.launch(run)
        return run

    def launch(self, run: Run) -> None:
        deployment = getattr(self.config.model_training, "prefect_deployment", None)
        if deployment:
            self._launch_deployment(run, deployment)
            return
        paths = run_paths(self.config, run.id)
        private_dir(paths.dir)
        argv = [self.python, "-m", "flows.training_run", "--config", str(self.config.path), "--run-id", str(run.id)]
        with open(paths.flow_log, "ab") as out:
            # Its own session: a Ctrl-C in the terminal reaches the CLI, not the flow,
            # and the flow outlives a crashed server (reconcile() re-attaches to it).
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, env=importing_this_potato(dict(os.environ)),
            )
        self.store.update_run(run.id, flow_pid=process.pid, step="starting the run's flow")
        self.processes[run.id] = process

    def _launch_deployment(self, run: Run, deployment: str) -> None:
        from prefect.deployments import run_deployment

        flow_run = run_deployment(
            deployment,
            parameters={"config": str(self.config.path), "run_id": run.id},
            timeout=0,
            flow_run_name=f"run-{run.id}",
            tags=prefect_runs.flow_run_tags(self.config, run),
        )
        step = f"waiting for a Prefect worker on pool {flow_run.work_pool_name}"
        self.store.update_run(run.id, prefect_flow_run_id=str(flow_run.id), step=step)
        self.store.add_event(run.id, "step", {"text": step})  # as RunContext.set_step keeps step rows

    def wait_for_flows(self, timeout: float = 15) -> None:
        """Give flows that recorded their run's end time to exit (Prefect's last API calls)."""
        deadline = time.monotonic() + timeout
        for process in self.processes.values():
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("The flow process %s is still finishing", process.pid)

    # The annotation server runs the dispatcher in a thread.
    def start(self) -> None:
        reconcile(self.config, self.store)
        self._thread = threading.Thread(target=self._loop, name="potato-dispatcher", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.dispatch_once()
            except Exception:
                log.exception("dispatcher")

    def stop(self, *, stop_flows: bool = True, timeout: float = 30) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if stop_flows:
            for process in self.processes.values():
                if process.poll() is None:
                    process.terminate()
            deadline = time.monotonic() + timeout
            for process in self.processes.values():
                try:
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
