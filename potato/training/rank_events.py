"""The events of a data-parallel run's processes, merged into the run's one stream.

Every process writes ``ranks/<rank>/events.jsonl``; whoever follows the run
(the local flow, a remote agent) reads only ``events.jsonl``, in the format
of docs/architecture.md, as if one process trained. The leader merges:

- ``started``: one event once every process has started, for the leader's
  pid, naming every device (``2 × CPU (1 thread)``); events the processes
  write before that are held back, so nothing precedes it but log lines;
- ``log``: rank 0's as they are; the other processes' warnings and errors
  prefixed ``rank N:`` (their info lines repeat rank 0's);
- ``progress``: training progress from rank 0, whose loss is already the
  mean over all processes (they vote it each step); prediction progress
  summed over the processes, each of which predicts its share of the items;
- ``metrics``: rank 0's;
- ``done``: not copied — the leader writes the run's own from
  :meth:`RankEvents.outcome`.

Part of the remote half: Python 3.8, standard library only.
"""

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from potato.training.events import read_events
from potato.training.job_paths import JobPaths, read_exit_code

EXIT_CANCELLED = 143


def describe_devices(names: Sequence[str]) -> str:
    """``2 × CPU (1 thread)``, or the names one by one when they differ."""
    if len(set(names)) == 1:
        return "{} × {}".format(len(names), names[0])
    return ", ".join(names)


class RankEvents:
    """Tails ``size`` processes' event files and writes the merged events to ``out`` (an EventWriter)."""

    def __init__(self, job_dir: str, size: int, out: Any):
        self.job_dir = job_dir
        self.size = size
        self.out = out
        self.offsets = [0] * size
        self.started = {}  # type: Dict[int, Dict[str, Any]]
        self.done = {}  # type: Dict[int, Dict[str, Any]]
        self.predicting = {}  # type: Dict[Tuple[Any, int], Tuple[int, int]]
        self.held = []  # type: List[Dict[str, Any]]

    def pump(self) -> None:
        """Read what the processes wrote since the last call and merge it, oldest first.

        In time order: rank 1's last prediction batch, written before rank 0
        could finish the schema, must not come out after rank 0's metrics.
        """
        new = []  # type: List[Tuple[float, int, int, Dict[str, Any]]]
        for rank in range(self.size):
            path = JobPaths(self.job_dir).rank(rank).events
            events, self.offsets[rank] = read_events(path, self.offsets[rank])
            new.extend((float(e.get("t") or 0), rank, k, e) for k, e in enumerate(events))
        for _, rank, _, event in sorted(new, key=lambda x: x[:3]):
            self._take(rank, event)

    def _take(self, rank: int, event: Dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "done":
            self.done[rank] = event
        elif kind == "started":
            self.started[rank] = event
            if len(self.started) == self.size:
                self._emit_started()
        elif kind == "log":
            if rank == 0:
                self.out.log(event.get("message", ""), level=event.get("level", "info"))
            elif event.get("level") in ("warning", "error"):
                self.out.log("rank {}: {}".format(rank, event.get("message", "")), level=event["level"])
        elif len(self.started) < self.size:
            self.held.append(dict(event, rank=rank))
        else:
            self._merge(rank, event)

    def _emit_started(self) -> None:
        first = self.started[0]
        self.out.emit(
            "started", pid=os.getpid(), python=first.get("python"), device=first.get("device"),
            device_name=describe_devices([self.started[r].get("device_name") or "?" for r in range(self.size)]),
            trainer=first.get("trainer"), schemas=first.get("schemas"),
        )
        held, self.held = self.held, []
        for event in held:
            self._merge(event.pop("rank"), event)

    def _merge(self, rank: int, event: Dict[str, Any]) -> None:
        kind = event.get("type")
        fields = {k: v for k, v in event.items() if k not in ("seq", "t", "type")}
        if kind == "progress" and fields.get("phase") == "predict":
            step, total = int(fields.get("step") or 0), int(fields.get("total") or 0)
            self.predicting[(fields.get("schema"), rank)] = (step, total)
            mine = [v for (schema, _), v in self.predicting.items() if schema == fields.get("schema")]
            if len(mine) == self.size:
                extra = {k: v for k, v in fields.items() if k not in ("phase", "step", "total")}
                self.out.progress("predict", sum(s for s, _ in mine), sum(t for _, t in mine), **extra)
        elif rank == 0 and kind in ("progress", "metrics"):
            self.out.emit(kind, **fields)

    def signal_ranks(self, sig: int) -> bool:
        """Send ``sig`` to every process that has said its pid; True once all have."""
        for event in self.started.values():
            try:
                os.kill(int(event["pid"]), sig)
            except (OSError, KeyError, TypeError, ValueError):
                pass
        return len(self.started) == self.size

    def exit_codes(self) -> List[Optional[int]]:
        return [read_exit_code(JobPaths(self.job_dir).rank(rank).dir) for rank in range(self.size)]

    def outcome(self, cancelled: bool, failure: Optional[BaseException]) -> Tuple[int, str, Optional[str]]:
        """The run's ``(exit code, status, error)`` from the processes' ends.

        Cancelled when the run was asked to stop (or every process stopped on
        SIGTERM); succeeded when every process did; otherwise failed as the
        first process that failed did — its error, its exit code — since the
        others fail only because it left.
        """
        codes = self.exit_codes()
        if cancelled or (codes and all(code == EXIT_CANCELLED for code in codes)):
            return EXIT_CANCELLED, "cancelled", "Cancelled"
        if failure is None and all(code == 0 for code in codes):
            return 0, "succeeded", None
        failed = [r for r, code in enumerate(codes) if code not in (None, 0, EXIT_CANCELLED)]
        if failed:
            def error_of(rank: int) -> str:
                return self.done.get(rank, {}).get("error") or "exit status {}".format(codes[rank])

            first = min(failed, key=lambda r: (self.done.get(r, {}).get("t", float("inf")), r))
            # The same failure in every process (a model that is not there) is no one rank's.
            first = min(r for r in failed if error_of(r) == error_of(first))
            error = error_of(first)
            return codes[first] or 1, "failed", error if first == 0 else "rank {}: {}".format(first, error)
        silent = [r for r, code in enumerate(codes) if code is None]
        why = _first_line(failure) if failure is not None else "no exit code"
        return 1, "failed", "Training process {} ended without reporting how ({}); see worker.log".format(
            ", ".join(str(r) for r in silent) or "?", why)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return "{}: {}".format(type(exc).__name__, lines[0]) if lines else type(exc).__name__
