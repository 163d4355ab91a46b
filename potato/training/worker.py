"""The training worker: ``python -m potato.training.worker JOB_DIR``.

The same worker trains on every backend. It reads ``JOB_DIR/job.json`` and
the run bundle, runs the trainer, and writes into ``JOB_DIR``:
``events.jsonl`` (appended, flushed per event), ``predictions.jsonl`` and
``scores.json`` (each written under a temporary name, then renamed),
``artifacts/`` and, last, ``exit_code`` (atomically). The formats are in
docs/architecture.md, "The job directory".

Exit codes: 0 succeeded, 1 failed, 3 the trainer could not be imported,
4 over ``max_ram_mb``, 5 the GPU ran out of memory, 143 stopped by SIGTERM.

SIGTERM asks the trainer to stop at its next step; the worker then writes
``done`` with status ``cancelled`` and exits 143. A one-device run starts no
child processes. A data-parallel run (job.json's ``processes``; see
``potato/training/data_parallel.py``) starts one training process per device
under torch's launcher, in the worker's own process group, and merges their
events into ``events.jsonl``; the worker stays the one process its
supervisor signals.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import sys
import threading
import time
import traceback
from array import array
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from potato.training import atomic_files, helper_processes
from potato.training.answer_kinds import NOMINAL
from potato.training.device import THREAD_VARIABLES
from potato.training.events import Cancelled, EventWriter, OutOfGpuMemory, TrainerFailure
from potato.training.job_paths import BUNDLE, JobPaths
from potato.training.trainers import registry
from potato.training.trainers.registry import import_failure_message

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_IMPORT = 3
EXIT_MEMORY = 4
EXIT_GPU_MEMORY = 5
EXIT_CANCELLED = 143

RAM_CHECK_INTERVAL_S = 0.2


class Job:
    """What the trainer gets as ``job``: the parsed ``job.json`` plus paths and writers.

    Attributes: ``dir``, ``run_id``, ``trainer``, ``schemas``, ``bundle_dir``,
    ``manifest`` (the bundle's ``manifest.json``), ``options`` (as given; the
    trainer merges its defaults), ``device`` (the torch device chosen, e.g.
    ``cpu``), ``device_name``, ``num_threads``, ``max_ram_mb``,
    ``include_unlabeled``, ``processes``, ``artifacts_dir``, ``group`` (None, or in
    a data-parallel run this process's place among the training processes),
    ``parts`` (a job with several trainers: ``potato.training.parts``).
    """

    def __init__(self, job_dir: str, spec: Dict[str, Any]):
        self.dir = os.path.abspath(job_dir)
        self.spec = spec
        self.run_id = spec.get("run_id")
        self.trainer = spec.get("trainer", registry.DEFAULT_BY_KIND[NOMINAL])  # a job.json of an older server
        self.schemas = list(spec.get("schemas") or [])
        bundle = spec.get("bundle", BUNDLE)
        self.bundle_dir = bundle if os.path.isabs(bundle) else os.path.join(self.dir, bundle)
        self.options = dict(spec.get("options") or {})
        self.device_setting = spec.get("device") or "auto"
        self.num_threads = spec.get("num_threads")
        self.max_ram_mb = spec.get("max_ram_mb")
        self.include_unlabeled = bool(spec.get("include_unlabeled", False))
        self.processes = spec.get("processes")
        self.grace_seconds = spec.get("grace_seconds", 20)
        self.artifacts_dir = JobPaths(self.dir).artifacts
        self.device = "cpu"
        self.device_name = "CPU"
        self.group = None  # a data-parallel run's DataParallelGroup (potato/training/process_group.py)
        self.parts = list(spec.get("parts") or [])  # several trainers: potato/training/parts.py
        self._manifest = None  # type: Optional[Dict[str, Any]]

    @property
    def manifest(self) -> Dict[str, Any]:
        if self._manifest is None:
            with open(os.path.join(self.bundle_dir, "manifest.json"), encoding="utf-8") as f:
                self._manifest = json.load(f)
        return self._manifest

    @property
    def items_path(self) -> str:
        return os.path.join(self.bundle_dir, "items.jsonl")

    def iter_items(self) -> Iterator[Dict[str, Any]]:
        """The bundle's items (``items.jsonl``), in order, one at a time."""
        with open(self.items_path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    yield _parse_item(line, self.items_path, number)

    def index_items(self) -> "ItemIndex":
        """The bundle's items for a trainer that predicts many: see :class:`ItemIndex`."""
        return ItemIndex(self.items_path)

    def read_items(self) -> List[Dict[str, Any]]:
        """The bundle's items (``items.jsonl``), in order."""
        return list(self.iter_items())

    def write_predictions(self, records: Iterable[Dict[str, Any]]) -> int:
        """Write ``predictions.jsonl`` (temp name, then rename); returns the count."""
        lines = [json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in records]
        atomic_files.write_text(JobPaths(self.dir).predictions, "".join(line + "\n" for line in lines))
        return len(lines)

    def write_scores(self, scores: Dict[str, Any]) -> None:
        """Write ``scores.json`` (temp name, then rename)."""
        atomic_files.write_text(JobPaths(self.dir).scores, json.dumps(scores, indent=1, sort_keys=True) + "\n")


def _parse_item(line: Any, path: str, number: int) -> Dict[str, Any]:
    try:
        item = json.loads(line)
    except ValueError as exc:
        raise TrainerFailure("{} line {} is not valid JSON: {}".format(path, number, exc))
    if not isinstance(item, dict):
        raise TrainerFailure("{} line {} is not a JSON object".format(path, number))
    return item


class ItemIndex:
    """The bundle's items, with only the labelled ones in memory; the others are read back when needed.

    A run that predicts 100 000 unlabelled items must not hold them all: the
    index keeps, per item, where its line starts and its text's length (12
    bytes), and the labelled items whole (``labelled``: position -> item).
    :meth:`read` returns any item's ``(id, text)``, from memory or from its line.
    """

    def __init__(self, path: str):
        self.path = path
        self.offsets = array("q")
        self.text_lengths = array("i")
        self.labelled = {}  # type: Dict[int, Dict[str, Any]]
        with open(path, "rb") as f:
            offset, number = 0, 0
            for line in f:
                number += 1
                if line.strip():
                    item = _parse_item(line, path, number)
                    labels = item.get("labels")
                    if isinstance(labels, dict) and labels:
                        self.labelled[len(self.offsets)] = item
                    self.offsets.append(offset)
                    self.text_lengths.append(len(_text(item)))
                offset += len(line)
        self._file = open(path, "rb")

    def __len__(self) -> int:
        return len(self.offsets)

    def labels(self, position: int) -> Dict[str, Any]:
        item = self.labelled.get(position)
        return item["labels"] if item is not None else {}

    def read(self, position: int) -> Tuple[Any, str]:
        """``(id, text)`` of the item at ``position``."""
        item = self.record(position)
        return item.get("id"), _text(item)

    def record(self, position: int) -> Dict[str, Any]:
        """The whole line of the item at ``position`` (its ``sides``, say), from memory or from the file."""
        item = self.labelled.get(position)
        if item is None:
            self._file.seek(self.offsets[position])
            item = json.loads(self._file.readline())
        return item

    def close(self) -> None:
        self._file.close()


def _text(item: Dict[str, Any]) -> str:
    return str(item.get("text") or "")


def read_job(job_dir: str) -> Job:
    """Parse ``JOB_DIR/job.json``."""
    with open(JobPaths(job_dir).job, encoding="utf-8") as f:
        return Job(job_dir, json.load(f))


def _finish(job_dir: str, events: Optional[EventWriter], code: int, status: str, error: Optional[str]) -> int:
    if events is not None:
        events.done(status, error)
    atomic_files.write_text(JobPaths(job_dir).exit_code, "{}\n".format(code))
    return code


# -- memory watchdog ---------------------------------------------------------


def read_rss_mb() -> Optional[float]:
    """This process's resident memory in MB (VmRSS) with its helper processes', or None where it cannot be read."""
    own = helper_processes.vm_rss_mb()
    if own is not None:
        return own + helper_processes.resident_mb()
    try:  # macOS: no /proc; the peak is the best stdlib figure (bytes there)
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0
    except Exception:
        return None


def memory_message(used_mb: float, limit_mb: float) -> str:
    return (
        "The worker used {:.0f} MB of memory, over model_training.max_ram_mb ({:g}); "
        "raise max_ram_mb or train with a smaller batch_size or max_length".format(used_mb, limit_mb)
    )


def _start_watchdog(job_dir: str, events: EventWriter, limit_mb: float) -> None:
    """Exit 4 as soon as RSS passes ``limit_mb``, checked every 0.2 s, so the machine never swaps."""

    def watch() -> None:
        while True:
            used = read_rss_mb()
            if used is not None and used > limit_mb:
                message = memory_message(used, limit_mb)
                try:
                    events.log(message, level="error")
                    _finish(job_dir, events, EXIT_MEMORY, "failed", message)
                    sys.stderr.write(message + "\n")
                    sys.stderr.flush()
                finally:
                    os._exit(EXIT_MEMORY)
            time.sleep(RAM_CHECK_INTERVAL_S)

    threading.Thread(target=watch, name="potato-ram-watchdog", daemon=True).start()


# -- threads -----------------------------------------------------------------


def apply_num_threads(num_threads: Optional[int]) -> None:
    """Set the BLAS/OpenMP thread counts before torch is imported (overrides a login shell's value)."""
    if num_threads:
        for name in THREAD_VARIABLES:
            os.environ[name] = str(int(num_threads))


# -- the run -----------------------------------------------------------------


def import_error_message(trainer: str, exc: ImportError, tried: str) -> str:
    """The message for a trainer whose packages are missing, with the missing module named."""
    missing = (getattr(exc, "name", None) or tried).split(".")[0]
    return import_failure_message(trainer, missing)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if isinstance(exc, (TrainerFailure, Cancelled)):
        return first or type(exc).__name__
    return "{}: {}".format(type(exc).__name__, first) if first else type(exc).__name__


Outcome = Tuple[int, str, Optional[str]]  # (exit code, status of the done event, its error)
SUCCEEDED = (EXIT_SUCCEEDED, "succeeded", None)  # type: Outcome


def run(job_dir: str) -> int:
    """Run the job in ``job_dir``; returns the exit code (also written to ``exit_code``)."""
    job_dir = os.path.abspath(job_dir)
    events = EventWriter(JobPaths(job_dir).events)
    job, trainer, code = _prepare(job_dir, events)
    if trainer is None:
        return code
    if job.parts:
        from potato.training.parts import train_parts

        return _guarded(job_dir, events, lambda: train_parts(job, events, trainer, read_job, _train_or_lead))
    return _guarded(job_dir, events, lambda: _train_or_lead(job, events, trainer))


def run_rank(job_dir: str, plan: Dict[str, Any]) -> None:
    """One process of a data-parallel run (``potato/training/data_parallel.py`` starts it).

    Writes its events and exit code under ``ranks/<rank>/``; the leader merges
    them. Exits with the worker's codes (0, 1, 3, 4, 143).
    """
    from potato.training.predictions import rank_dir

    rank = int(os.environ["RANK"])
    own_dir = rank_dir(job_dir, rank)
    os.makedirs(own_dir, exist_ok=True)
    events = EventWriter(JobPaths(own_dir).events)
    job, trainer, code = _prepare(job_dir, events, exit_dir=own_dir, num_threads=plan["threads"], announce=False)
    if trainer is None:
        sys.exit(code)

    def train() -> Outcome:
        from potato.training.process_group import DataParallelGroup

        job.device, job.device_name = plan["devices"][rank], plan["names"][rank]
        job.group = DataParallelGroup(plan["backend"], job.device)
        try:
            _started(job, events)
            trainer.train(job, events)
        finally:
            job.group.close()
        if events.cancelled:
            raise Cancelled("Cancelled")
        return SUCCEEDED

    code = _guarded(own_dir, events, train)
    if code:
        sys.exit(code)


def _prepare(job_dir: str, events: EventWriter, exit_dir: Optional[str] = None,
             num_threads: Optional[int] = None, announce: bool = True) -> Tuple[Any, Any, int]:
    """Read the job, arm SIGTERM and the memory watchdog, set threads, import the trainer.

    Returns ``(job, trainer module, 0)``, or ``(job, None, exit code)`` after
    writing ``done`` and ``exit_code`` into ``exit_dir`` (default ``job_dir``).
    """
    exit_dir = exit_dir or job_dir

    def on_sigterm(signum: int, frame: Any) -> None:
        events.request_cancel()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        job = read_job(job_dir)
    except Exception as exc:
        return None, None, _finish(exit_dir, events, EXIT_FAILED, "failed",
                                   "Could not read job.json: {}".format(_one_line(exc)))
    if job.max_ram_mb:
        _start_watchdog(exit_dir, events, float(job.max_ram_mb))
    num_threads = num_threads or job.num_threads
    apply_num_threads(num_threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # transformers would otherwise fetch a layer's kernel from the Hub's kernels-community as a model loads: code
    # downloaded at run time, which a GPU host must not need (the torch path computes the same).
    os.environ["USE_HUB_KERNELS"] = "NO"

    from potato.training.parts import check_parts
    from potato.training.trainers.uncertainty import check_order

    problem = check_parts(job.spec.get("parts")) or check_order(job.spec.get("order"))
    if problem:
        return job, None, _finish(exit_dir, events, EXIT_FAILED, "failed", "Job: " + problem)
    names = [part["trainer"] for part in job.parts] or [job.trainer]
    modules = []
    for name in names:
        module, code = _import_trainer(name, exit_dir, events, announce)
        if module is None:
            return job, None, code
        modules.append(module)
    trainer = modules if job.parts else modules[0]
    if num_threads and any(uses_device(name) for name in names):
        import torch

        torch.set_num_threads(int(num_threads))  # once, before any work
    return job, trainer, 0


def _import_trainer(name: str, exit_dir: str, events: EventWriter, announce: bool) -> Tuple[Any, int]:
    """``(trainer module, 0)``, or ``(None, exit code)`` after writing why it could not be imported."""
    info = registry.TRAINERS.get(name)
    if info is None:
        return None, _finish(
            exit_dir, events, EXIT_FAILED, "failed",
            "Unknown trainer {!r}; known trainers: {}".format(name, ", ".join(sorted(registry.TRAINERS))),
        )
    tried = info.module
    if announce:  # at once: importing torch and friends takes seconds, and silence counts against the heartbeat
        events.log("Loading trainer {!r} and its packages".format(name))
    try:
        trainer = registry.load(info)
        for tried in info.required_modules:
            if tried not in info.imported_when_used:
                importlib.import_module(tried)
            elif importlib.util.find_spec(tried) is None:
                raise ModuleNotFoundError("No module named {!r}".format(tried), name=tried)
    except ImportError as exc:
        message = import_error_message(name, exc, tried)
        events.log("{}: {}".format(message, _one_line(exc)), level="error")
        return None, _finish(exit_dir, events, EXIT_IMPORT, "failed", message)
    except Exception as exc:  # a package that is there but breaks on import (e.g. a CUDA mismatch)
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        events.log(tb.rstrip(), level="error")
        return None, _finish(
            exit_dir, events, EXIT_IMPORT, "failed",
            "Trainer {!r} could not be imported ({} failed: {})".format(name, tried, _one_line(exc)),
        )
    return trainer, 0


def uses_device(trainer: str) -> bool:
    """Whether trainer *trainer* computes on a torch device (its declaration's ``uses_device``).

    One that does not (decision-calibrate rescales stored probabilities) gets
    no device choice, no thread setting and no data-parallel processes: each
    of those imports torch, which such a trainer must not need.
    """
    return registry.TRAINERS[trainer].uses_device


def _train_or_lead(job: Job, events: EventWriter, trainer: Any) -> Outcome:
    """Train in this process, or lead a data-parallel run when the job has several devices."""
    from potato.training.data_parallel import PlanError, check_processes, lead, plan_processes
    from potato.training.device import DeviceChoice, choose_device, usable_cuda_devices

    problem = check_processes(job.processes)
    if problem:
        raise TrainerFailure("Job: " + problem)
    if uses_device(job.trainer):
        choice = choose_device(job.device_setting, job.num_threads)
        try:
            cuda = usable_cuda_devices() if choice.device.startswith("cuda") else []
            plan = plan_processes(job.processes, choice.device, choice.name, cuda, job.num_threads)
        except PlanError as exc:
            raise TrainerFailure(str(exc))
    else:
        choice = DeviceChoice("cpu", "CPU (no device needed)", None)
        plan = plan_processes(1, choice.device, choice.name, [], job.num_threads)
    if plan.size == 1:  # a data-parallel run's started event comes when all its processes have started
        job.device, job.device_name = choice.device, choice.name
        _started(job, events)
    for warning in (choice.warning, plan.warning):
        if warning:
            events.log(warning, level="warning")
    problems = trainer.check_options(job.options)
    if problems:
        raise TrainerFailure("Trainer options: " + "; ".join(problems))
    if plan.size > 1:
        return lead(job, events, plan, run_rank)
    events.check_cancelled()
    trainer.train(job, events)
    if events.cancelled:
        raise Cancelled("Cancelled")
    return SUCCEEDED


def _started(job: Job, events: EventWriter) -> None:
    events.emit(
        "started",
        pid=os.getpid(),
        python=".".join(str(v) for v in sys.version_info[:3]),
        device=job.device,
        device_name=job.device_name,
        trainer=job.trainer,
        schemas=job.schemas,
    )


def _guarded(exit_dir: str, events: EventWriter, body: Callable[[], Outcome]) -> int:
    """Run ``body``; write its outcome, or the failure or cancel it raised, as ``done`` and ``exit_code``."""
    try:
        code, status, error = body()
    except Cancelled:
        events.log("Stopped on SIGTERM", level="warning")
        return _finish(exit_dir, events, EXIT_CANCELLED, "cancelled", "Cancelled")
    except TrainerFailure as exc:
        if events.cancelled:
            return _finish(exit_dir, events, EXIT_CANCELLED, "cancelled", "Cancelled")
        code = EXIT_GPU_MEMORY if isinstance(exc, OutOfGpuMemory) else EXIT_FAILED
        return _finish(exit_dir, events, code, "failed", _one_line(exc))
    except Exception as exc:
        if events.cancelled:
            return _finish(exit_dir, events, EXIT_CANCELLED, "cancelled", "Cancelled")
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        events.log(tb.rstrip(), level="error")
        return _finish(exit_dir, events, EXIT_FAILED, "failed", _one_line(exc))
    return _finish(exit_dir, events, code, status, error)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        sys.stderr.write("usage: python -m potato.training.worker JOB_DIR\n")
        return 2
    if not os.path.isfile(JobPaths(argv[0]).job):
        sys.stderr.write("{}: no job.json there\n".format(argv[0]))
        return 2
    return run(argv[0])


if __name__ == "__main__":
    sys.exit(main())
