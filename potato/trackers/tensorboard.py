"""Report a run to TensorBoard: an event file per run under the project's log directory.

``tensorboard --logdir annotation_output/training/tensorboard`` shows every
run of the project as ``run-N`` (``TENSORBOARD_LOGGING_DIR``, the name
transformers reads, puts them elsewhere). Written with TensorBoard's own
event-file writer (the ``tensorboard`` package: the ``trackers`` extra, or
``pip install tensorboard``): each training step's numbers as
scalars at their step and wall time, the holdout scores at step 0, the
learning curve with the number of training items as its step, and the
run's report and params as text.
"""

from __future__ import annotations

import os
from pathlib import Path

from potato.config import ProjectConfig
from potato.errors import TrackerError
from potato.training.escaping import escaped
from potato.trackers.tracked_run import TrackedRun

LOGDIR = "tensorboard"


def log_dir(config: ProjectConfig, env: dict[str, str] | None = None) -> Path:
    chosen = (os.environ if env is None else env).get("TENSORBOARD_LOGGING_DIR")
    return Path(chosen) if chosen else config.training_dir / LOGDIR


def report(run: TrackedRun, config: ProjectConfig, env: dict[str, str] | None = None) -> str:
    """Write *run*'s event file; return the line the run log keeps."""
    try:
        from tensorboard.compat.proto import types_pb2
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise TrackerError("the tensorboard package is not installed on the annotation server: pip install "
                           "tensorboard (or the trackers extra) into its environment") from None

    def scalars(values: dict[str, float]) -> Summary:
        return Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values.items()])

    def text(tag: str, body: str) -> Summary:
        tensor = TensorProto(dtype=types_pb2.DT_STRING, string_val=[escaped(body).encode("utf-8")],
                             tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        return Summary(value=[Summary.Value(tag=tag, metadata=meta, tensor=tensor)])

    where = log_dir(config, env) / run.name
    try:
        where.mkdir(parents=True, exist_ok=True)
        writer = EventFileWriter(str(where))
    except OSError as exc:
        raise TrackerError(f"cannot write TensorBoard's files in {where}: {exc.strerror or exc}") from None
    end = run.steps[-1].t if run.steps else run.started_at
    try:
        for step in run.steps:
            writer.add_event(Event(wall_time=step.t, step=step.step, summary=scalars(step.values)))
        if run.scores:
            writer.add_event(Event(wall_time=end, step=0, summary=scalars(run.scores)))
        for name, items, value in run.curve:
            writer.add_event(Event(wall_time=end, step=items, summary=scalars({name: value})))
        writer.add_event(Event(wall_time=end, step=0, summary=text(
            "params", "\n".join(f"- **{k}**: {v}" for k, v in run.params.items()))))
        if "report.md" in run.files:
            writer.add_event(Event(wall_time=end, step=0, summary=text("report", run.files["report.md"].decode())))
    finally:
        writer.close()
    return f"TensorBoard: {where} (tensorboard --logdir {where.parent})"
