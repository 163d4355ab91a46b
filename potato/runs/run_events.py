"""A worker's events, recorded: the one place where an event becomes store rows, run fields and log lines.

Events arrive two ways: the local backend's relay tails ``events.jsonl``
(potato/backends/relay.py); remote agents post them through the agent protocol
(potato/protocol). Both record them here, the same way.

Each event is stored in one store transaction together with what it changes
on the run (step row, progress, device, scores), the heartbeat and the run's
``last_seq`` (``Store.record_worker_event``). So an event is never half
recorded, and one that comes again (a batch re-sent after a lost answer, a
restarted server) is recognised by its ``seq`` and not stored twice. Only a
``log`` event's copy in ``run.log`` is written after the transaction: a crash
between the two loses that line from the file, never from the store.
"""

from __future__ import annotations

from typing import Any

from potato.runs.runlog import RunLog
from potato.runs.store import Store


def time_left(seconds: float) -> str:
    """``about 1 min 20 s left``: the phase's ETA (``eta_s``) in the step row, rounded as an estimate
    deserves (to 5 s under a minute, to a minute past ten)."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"about {max(5, 5 * round(seconds / 5))} s left"
    minutes, rest = divmod(seconds, 60)
    if minutes < 10:
        return f"about {minutes} min {rest:02d} s left"
    if minutes < 60:
        return f"about {minutes + (rest >= 30)} min left"
    hours, minutes = divmod(minutes + (rest >= 30), 60)
    return f"about {hours} h {minutes:02d} min left"


def describe_progress(event: dict[str, Any]) -> tuple[str, float | None]:
    """The step row's text and fraction for a progress event.

    In a run with several trainers the event names its part: the text starts
    ``hf-span-tagging (2 of 2): ``, and the fraction is of the whole run.
    """
    step, total = event.get("step"), event.get("total")
    fraction = step / total if step is not None and total else None
    if event.get("phase") == "predict":
        text = f"predicting: batch {step} of {total}"
    else:
        text = f"training: step {step} of {total}"
        if event.get("epoch") is not None:
            text += f" (epoch {event['epoch']})"
        if event.get("loss") is not None:
            text += f", loss {event['loss']:.4f}"
        if event.get("validation_loss") is not None:
            text += f", validation loss {event['validation_loss']:.4f}"
        if isinstance(event.get("curve"), (int, float)):
            text = f"learning curve, {100 * event['curve']:.0f} % of the labels: {text}"
    if isinstance(event.get("eta_s"), (int, float)) and not isinstance(event["eta_s"], bool):
        text += f", {time_left(event['eta_s'])}"
    part, parts = event.get("part"), event.get("parts")
    if isinstance(part, int) and isinstance(parts, int) and 1 <= part <= parts and parts > 1:
        text = f"{event.get('trainer')} ({part} of {parts}): {text}"
        fraction = None if fraction is None else (part - 1 + fraction) / parts
    return text, fraction


def _run_fields(kind: str, event: dict[str, Any]) -> dict[str, Any]:
    """The run columns an event of *kind* sets."""
    if kind == "started":
        return {"gpu": event.get("device_name") or event.get("device"), "host_python": event.get("python")}
    if kind == "progress":
        text, fraction = describe_progress(event)
        return {"step": text, "progress": fraction}
    if kind == "metrics":
        return {"scores": event.get("scores") or {}}
    return {}


def record(store: Store, run_id: int, log: RunLog, event: dict[str, Any]) -> bool:
    """Record one worker event of running run *run_id*; False when its ``seq`` was recorded already.

    Raises ``RunEnded`` when the run is no longer running (nothing is stored).
    """
    kind = event.get("type", "log")
    seq = event.get("seq")
    if kind == "log":
        level, message = event.get("level") or "info", str(event.get("message", ""))
        stored = store.record_worker_event(run_id, seq, "log",
                                           {"level": level, "message": message, "source": "worker"})
        if stored:
            log.echo(level, message)
        return stored
    data = {k: v for k, v in event.items() if k != "type"}
    stored = store.record_worker_event(run_id, seq, kind, data, **_run_fields(kind, event))
    if stored and kind == "started":
        device = event.get("device_name") or event.get("device")
        log.info(f"The worker started: Python {event.get('python')}, device {device}")
    return stored
