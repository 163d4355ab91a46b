"""An offline W&B run read back with W&B's own tools: ``wandb leet inspect`` and the client's record protobuf.

``wandb leet inspect RUN_DIR`` prints each record of the run's ``.wandb``
transaction log in protobuf's text format when its output is not a
terminal; each is parsed into W&B's own ``Record`` message, and the few
things the tests check are gathered from them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WANDB = Path(sys.executable).with_name("wandb")


@dataclass
class OfflineRun:
    """What one offline run's transaction log holds."""

    name: str = ""
    project: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: dict[str, list[tuple[int, Any]]] = field(default_factory=dict)  # key -> (the row's step metric, value)
    tables: dict[str, str] = field(default_factory=dict)  # a logged table's key -> its file in the run's files
    summary: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    artifacts: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # name -> (type, its files)
    exit_code: int | None = None


def records(run_dir: Path) -> list[Any]:
    from google.protobuf import text_format
    from wandb.proto import wandb_internal_pb2

    shown = subprocess.run([str(WANDB), "leet", "inspect", str(run_dir)], capture_output=True, text=True,
                           timeout=60, stdin=subprocess.DEVNULL, check=True).stdout
    out = []
    for block in re.split(r"^# record \d+: \w+\n", shown, flags=re.M)[1:]:
        record = wandb_internal_pb2.Record()
        text_format.Parse(block, record)
        out.append(record)
    return out


def read_offline_run(run_dir: Path) -> OfflineRun:
    run = OfflineRun()
    for record in records(run_dir):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.name, run.project = record.run.display_name, record.run.project
            run.config.update({u.key: json.loads(u.value_json) for u in record.run.config.update})
        elif kind == "config":
            run.config.update({u.key: json.loads(u.value_json) for u in record.config.update})
        elif kind == "history":
            row = {}
            for item in record.history.item:
                if len(item.nested_key) > 1:  # a table: its own fields under its key
                    if item.nested_key[1] == "path":
                        run.tables[item.nested_key[0]] = json.loads(item.value_json)
                else:
                    row[item.key or item.nested_key[0]] = json.loads(item.value_json)
            steps = [v for k, v in row.items() if k.endswith("train/step")]
            for key, value in row.items():
                if not key.startswith("_") and not key.endswith("train/step"):
                    run.history.setdefault(key, []).append((steps[0] if steps else row.get("_step"), value))
        elif kind == "summary":
            run.summary.update({(u.key or u.nested_key[0]): json.loads(u.value_json)
                                for u in record.summary.update if len(u.nested_key) <= 1})
        elif kind == "files":
            run.files += [f.path for f in record.files.files]
        elif kind == "artifact":
            run.artifacts[record.artifact.name] = (record.artifact.type,
                                                   sorted(c.path for c in record.artifact.manifest.contents))
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run
