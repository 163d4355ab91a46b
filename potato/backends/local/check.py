"""``potato training check local``: the device local runs use, and what the project's trainers need here.

A trainer that asks things of its host (hf-llm-finetune: its model's
config.json, whether bitsandbytes loads 4-bit weights) is answered by the
same probe an ssh run runs on its host (potato/training/probe.py), run here
in a child process, since it imports torch and bitsandbytes and the server
that serves the Check button must not. The trainer's hooks then say what the
answers mean, as for an ssh host: the model's size, 4-bit, the GPU memory a
run needs, whatever stops a run; and, from the project's items and the pace
of a matrix product on this machine, a rough time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from potato.backend_types.contract import CheckReport
from potato.backends.ssh.trainer_needs import assess, probe_questions, trainers_options
from potato.config import BackendConfig, ProjectConfig
from potato.errors import ProjectDataError
from potato.runs.paths import importing_this_potato
from potato.training.device import describe_local_device
from potato.training.trainers.registry import TRAINERS, hook

# Importing torch and bitsandbytes and timing a matrix product: seconds, more on a busy machine.
PROBE_TIMEOUT_S = 180
THIS_MACHINE = "this machine"


def check(config: ProjectConfig, backend: BackendConfig) -> CheckReport:
    """The device local runs would use; for trainers that ask, what they need of this machine."""
    setting = config.model_training.device
    description = describe_local_device(setting)
    report = CheckReport(
        backend=backend.name, type=backend.type, ok=True,
        lines=[f"{backend.name}: this machine, {description}"],
        data={"device_setting": setting, "device": description},
    )
    options = trainers_options(config)
    questions = probe_questions(options)
    if not questions:
        return report
    probe = probe_here(options, questions)
    if isinstance(probe, str):
        report.lines.append(probe)
        return report
    needs = assess(options, probe, THIS_MACHINE)
    report.lines += needs.notes + [f"A run could not start: {problem}" for problem in needs.problems]
    report.ok = not needs.problems
    report.data.update(gpu_memory_mb=needs.gpu_mb, four_bit=needs.four_bit, speed=probe.get("speed"))
    counts = item_counts(config)
    for name, opts in options.items():
        estimate = hook(TRAINERS[name], "rough_time")
        said = estimate(dict(opts), probe, counts) if estimate is not None and counts else None
        if said:
            report.lines.append(said)
    return report


def probe_here(options: dict[str, dict], questions: dict) -> dict | str:
    """The probe's report of this machine for *questions* (and the speed of a matrix product), or why not."""
    packages = sorted({m for name in options for m in TRAINERS[name].required_modules})
    argv = [sys.executable, "-m", "potato.training.probe", "~/.cache/potato-training", "", json.dumps(packages),
            "gpus", json.dumps(dict(questions, speed=True))]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, env=importing_this_potato(dict(os.environ)))
        return json.loads(done.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        return f"The trainers' check of this machine did not answer within {PROBE_TIMEOUT_S} s"
    except (ValueError, IndexError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"The trainers' check of this machine failed: {tail}"


def item_counts(config: ProjectConfig) -> dict[str, Any]:
    """What a rough time is reckoned on: items trained on per epoch (labelled, not held out), items
    predicted, and their mean length in characters; empty when the items cannot be read."""
    from potato.annotations.labels import UserStateError, annotated_ids, find_user_states
    from potato.bundle.holdout import holdout_rule
    from potato.items.read import iter_items
    try:
        texts = {item.id: len(item.text or "") for item in iter_items(config)}
        labelled: set[str] = set()
        for _, path in find_user_states(config.output_annotation_dir):
            labelled |= annotated_ids(path)
        labelled = sorted(labelled & texts.keys())
        held_out, _ = holdout_rule(config)
        train = len(labelled) - sum(held_out(labelled))
    except (ProjectDataError, UserStateError, OSError, ValueError):
        return {}
    predict = len(texts) if config.model_training.writeback.include_unlabeled else len(labelled)
    return {"train": train, "predict": predict, "chars": sum(texts.values()) / len(texts) if texts else 0}
