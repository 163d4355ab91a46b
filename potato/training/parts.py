"""A job with several trainers: each trains its own schemas, one after the other, and their outputs are merged.

A run that names no trainer trains each schema with its kind's default
trainer, so a run over a radio and a span schema needs two. Its job.json
then has ``parts`` (docs/architecture.md, "The job directory")::

    "trainer": "hf-text-classification + hf-span-tagging",
    "parts": [{"trainer": "hf-text-classification", "schemas": ["sentiment"], "options": {...}},
              {"trainer": "hf-span-tagging", "schemas": ["entities"], "options": {...}}]

The worker runs each part as a job of its own in ``parts/<n>/`` (its own
job.json, the run's bundle, its own predictions, scores and artifacts; a
data-parallel part leads its processes there), all reporting into the run's
one ``events.jsonl``: progress events name the part (``trainer``, ``part``,
``parts``) and each metrics event carries every schema scored so far. When
every part has succeeded the worker merges: ``predictions.jsonl`` in part
order, ``scores.json``, and ``artifacts/`` (each part's files moved up; a
name two parts both used is kept as ``<trainer>-<name>``). The first part
that fails or is cancelled ends the run as it ended.

Why one worker and not one job per trainer: the backends, the agent protocol
and a run's record stay one job each — one bundle download, one SLURM
allocation, one cancel — and trainers run one at a time anyway.

Part of the remote half: Python 3.8, standard library only.
"""

import json
import os
import shutil
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from potato.training import atomic_files
from potato.training.predictions import FINAL_NAME

PARTS_DIR = "parts"


def check_parts(value: Any) -> Optional[str]:
    """A problem with job.json's ``parts`` (None when it is absent or fine)."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) < 2:
        return "parts is {!r}; expected a list of two or more parts".format(value)
    for i, part in enumerate(value):
        where = "parts[{}]".format(i)
        if not isinstance(part, dict):
            return "{} is {!r}; expected an object with trainer, schemas and options".format(where, part)
        if not isinstance(part.get("trainer"), str):
            return "{}.trainer is {!r}; expected a trainer's name".format(where, part.get("trainer"))
        schemas = part.get("schemas")
        if not (isinstance(schemas, list) and schemas and all(isinstance(s, str) for s in schemas)):
            return "{}.schemas is {!r}; expected a list of schema names".format(where, schemas)
        if not isinstance(part.get("options", {}), dict):
            return "{}.options is {!r}; expected an object".format(where, part.get("options"))
    return None


def part_dir(job_dir: str, number: int) -> str:
    return os.path.join(job_dir, PARTS_DIR, str(number))


def write_part_job(job: Any, number: int, part: Dict[str, Any]) -> str:
    """``parts/<number>/job.json``: the run's job with this part's trainer, schemas and options; returns the dir."""
    directory = part_dir(job.dir, number)
    os.makedirs(directory, exist_ok=True)
    spec = {key: value for key, value in job.spec.items() if key != "parts"}
    spec.update(trainer=part["trainer"], schemas=list(part["schemas"]), options=dict(part.get("options") or {}),
                bundle=os.path.abspath(job.bundle_dir))
    atomic_files.write_text(os.path.join(directory, "job.json"), json.dumps(spec, indent=2))
    return directory


Outcome = Tuple[int, str, Optional[str]]


def train_parts(job: Any, events: Any, modules: Sequence[Any], read_job: Callable[[str], Any],
                train_one: Callable[[Any, Any, Any], Outcome]) -> Outcome:
    """Train each part of *job* with its trainer module, then merge; returns the run's outcome.

    *train_one(job, events, module)* trains one job (the worker's, which may
    lead a data-parallel run) and returns its outcome; it raises to fail or
    cancel, as for a job without parts.
    """
    scores = {}  # type: Dict[str, Any]
    directories = []  # type: List[Tuple[str, str]]
    total = len(job.parts)
    for number, (part, module) in enumerate(zip(job.parts, modules), 1):
        events.check_cancelled()
        directory = write_part_job(job, number, part)
        events.log("Part {} of {}: {} trains {}".format(number, total, part["trainer"], ", ".join(part["schemas"])))
        events.set_part({"trainer": part["trainer"], "part": number, "parts": total}, scores)
        try:
            outcome = train_one(read_job(directory), events, module)
        finally:
            events.set_part(None)
        if outcome[0] != 0:
            return outcome
        scores.update(_read_scores(directory))
        directories.append((part["trainer"], directory))
    merge_parts(job, directories, scores)
    events.metrics(scores)
    return outcome


def _read_scores(directory: str) -> Dict[str, Any]:
    try:
        with open(os.path.join(directory, "scores.json"), encoding="utf-8") as f:
            found = json.load(f)
    except FileNotFoundError:
        return {}
    return found if isinstance(found, dict) else {}


def merge_parts(job: Any, directories: Sequence[Tuple[str, str]], scores: Dict[str, Any]) -> None:
    """The run's ``predictions.jsonl`` (parts in order, renamed into place), ``scores.json`` and ``artifacts/``."""
    with atomic_files.replacing(os.path.join(job.dir, FINAL_NAME)) as out:
        for _, directory in directories:
            path = os.path.join(directory, FINAL_NAME)
            if os.path.isfile(path):
                with open(path, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
    job.write_scores(scores)
    os.makedirs(job.artifacts_dir, exist_ok=True)
    for trainer, directory in directories:
        source = os.path.join(directory, "artifacts")
        if not os.path.isdir(source):
            continue
        for name in sorted(os.listdir(source)):
            target = os.path.join(job.artifacts_dir, name)
            if os.path.exists(target):
                target = os.path.join(job.artifacts_dir, "{}-{}".format(trainer, name))
            os.replace(os.path.join(source, name), target)
