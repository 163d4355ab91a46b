"""Data-parallel training: one process per GPU, under torch's own launcher.

A run given several GPUs (ssh ``gpus: "0,1"`` or ``max_gpus``, slurm
``gres: gpu:2``) trains on all of them. The job's ``processes`` says how many
processes (docs/architecture.md, "The job directory"); on the CPU the same
path runs with the gloo backend, so it can be tested without GPUs.

Shape of a data-parallel run:

- The worker the backend started stays the only process the backend knows:
  it leads. It starts the training processes with ``torch.distributed``'s
  elastic launcher (what ``torchrun`` runs), with the processes started as
  multiprocessing children — unlike ``torchrun``'s command mode, which puts
  each in a session of its own, they stay in the worker's process group, so
  the backend's TERM-then-KILL of that group (local, ssh agent, SLURM's
  ``scancel --full``) stops every one of them, and nothing outlives the run.
- Each process trains with ``potato.training.process_group.DataParallelGroup``
  and writes its own ``ranks/<rank>/events.jsonl`` and ``exit_code``.
- The leader merges those into the run's one ``events.jsonl``
  (``potato/training/rank_events.py``) and writes the run's ``done`` and
  ``exit_code`` from the processes' outcomes.

Part of the remote half: Python 3.8, standard library only at import time.
"""

import os
import signal
import threading
import uuid
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from potato.training.device import THREAD_VARIABLES
from potato.training.rank_events import RankEvents

PER_GPU = "per_gpu"
PUMP_INTERVAL_S = 0.2


class ProcessPlan(NamedTuple):
    """How a run trains: ``size`` processes, process ``r`` on ``devices[r]`` (named ``names[r]``)."""

    size: int
    devices: List[str]
    names: List[str]
    backend: Optional[str]  # "nccl", "gloo"; None for one process
    threads: Optional[int]  # torch threads per process on the CPU
    warning: Optional[str] = None


class PlanError(Exception):
    """The job asks for more processes than the machine has devices for; the message says what to change."""


def check_processes(value: Any) -> Optional[str]:
    """A problem with job.json's ``processes`` (None when it is fine)."""
    if value is None or value == PER_GPU:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return None
    return "processes must be a positive integer or {!r}, got {!r}".format(PER_GPU, value)


def plan_processes(processes: Any, device: str, device_name: str, cuda: Sequence[Tuple[str, str]],
                   threads: Optional[int]) -> ProcessPlan:
    """Decide the processes of a run.

    ``processes``: None or 1 (one process), ``per_gpu`` (one per usable GPU;
    one on the CPU), or N. ``device``/``device_name``: the one-process choice
    (``potato.training.device.choose_device``). ``cuda``: the usable GPUs as
    ``(device, name)``. ``threads``: the CPU threads to share among processes.
    """
    single = ProcessPlan(1, [device], [device_name], None, threads)
    if processes in (None, 1):
        return single
    if device.startswith("cuda"):
        wanted = len(cuda) if processes == PER_GPU else int(processes)
        if wanted > len(cuda):
            raise PlanError(
                "processes is {}, but this machine has {} GPU{} torch can use; give the run {} GPUs "
                "or lower processes".format(wanted, len(cuda), "" if len(cuda) == 1 else "s", wanted))
        if wanted <= 1:
            return single
        return ProcessPlan(wanted, [d for d, _ in cuda[:wanted]], [n for _, n in cuda[:wanted]], "nccl", threads)
    if processes == PER_GPU:
        return single
    if device == "mps":
        return single._replace(warning="Apple Metal trains in one process; processes: {} is ignored".format(processes))
    n = int(processes)
    each = max(1, (threads or available_cpus()) // n)
    name = "CPU ({} thread{})".format(each, "" if each == 1 else "s")
    return ProcessPlan(n, ["cpu"] * n, [name] * n, "gloo", each)


def available_cpus() -> int:
    """The CPUs this process may run on: a SLURM job's or a taskset's share, not the whole machine."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no sched_getaffinity
        return os.cpu_count() or 1


def lead(job: Any, events: Any, plan: ProcessPlan,
         entry: Callable[[str, Dict[str, Any]], None]) -> Tuple[int, str, Optional[str]]:
    """Start ``plan.size`` processes running ``entry(job_dir, plan)``; merge their events.

    Returns the run's ``(exit code, status, error)``. SIGTERM (the backend's
    cancel) reaches every process through the process group; the launcher
    itself turns it into a shutdown of its processes, TERM then KILL after
    ``grace_seconds``.
    """
    events.log("Training data-parallel on {} devices ({}): {}".format(
        plan.size, plan.backend, ", ".join(plan.names)))
    if plan.threads:
        for name in THREAD_VARIABLES:  # the processes inherit them
            os.environ[name] = str(plan.threads)
    merger = RankEvents(job.dir, plan.size, events)
    done = threading.Event()

    def pump() -> None:
        forwarded = False
        while not done.wait(PUMP_INTERVAL_S):
            merger.pump()
            if events.cancelled and not forwarded:
                forwarded = merger.signal_ranks(signal.SIGTERM)  # in case TERM reached the leader alone

    thread = threading.Thread(target=pump, name="potato-rank-events", daemon=True)
    thread.start()
    own_handler = signal.getsignal(signal.SIGTERM)
    failure = None  # type: Optional[BaseException]
    try:
        if not events.cancelled:
            _launch(job.dir, plan, entry, float(job.grace_seconds or 20))
    except Exception as exc:  # a process failed, the launcher got SIGTERM, or the rendezvous failed
        failure = exc
        if type(exc).__name__ == "SignalException":
            events.request_cancel()
    finally:
        signal.signal(signal.SIGTERM, own_handler)
        done.set()
        thread.join()
        merger.pump()
    return merger.outcome(events.cancelled, failure)


def _launch(job_dir: str, plan: ProcessPlan, entry: Callable[[str, Dict[str, Any]], None], grace: float) -> None:
    """Run ``entry`` in ``plan.size`` processes with torch's elastic launcher (as ``torchrun --standalone``)."""
    import dataclasses

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    fields = {f.name for f in dataclasses.fields(LaunchConfig)}
    settings = {
        "min_nodes": 1, "max_nodes": 1, "nproc_per_node": plan.size,
        "run_id": "potato-{}".format(uuid.uuid4().hex[:12]), "role": "potato-training",
        # --standalone: a TCP store on a free local port, no outside rendezvous service.
        "rdzv_backend": "c10d", "rdzv_endpoint": "127.0.0.1:0",
        "max_restarts": 0,  # a failed process fails the run; a restart would train from scratch
        "monitor_interval": 0.2,
        "start_method": "spawn",  # children of this process, in its process group (see above)
        "shutdown_timeout": max(1, int(grace)),
    }
    if "logs_specs" in fields:
        from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

        settings["logs_specs"] = DefaultLogsSpecs(log_dir=os.path.join(job_dir, "ranks", "launcher"))
    config = LaunchConfig(**{k: v for k, v in settings.items() if k in fields})
    elastic_launch(config, entry)(job_dir, plan._asdict())
