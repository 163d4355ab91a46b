"""What a run's trainers need of an ssh host: the questions they add to the probe, and what its answers mean.

A trainer declares them (potato/training/trainers/registry.py: ``host_questions``,
``host_check``, ``gpu_memory_mb``); hf-llm-finetune asks for its model's
config.json and whether bitsandbytes loads 4-bit weights there. The answers
come back in the probe's one round trip, so a run that cannot train on the
host stops before its code is copied, and ``gpus: auto`` asks of a GPU the
memory the run needs when that is more than ``min_free_gpu_mb``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from potato.runs.jobs import trainer_options
from potato.trainer_choice import project_trainers
from potato.training.trainers.registry import TRAINERS, hook


@dataclass
class HostNeeds:
    """What the probe's answers mean for a run: ``problems`` stop it, ``notes`` are said, and ``gpu_mb`` is
    the GPU memory its trainers estimate one process needs (``by``: whose estimate), None when none does;
    ``four_bit``: bitsandbytes' answer, when it was asked."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gpu_mb: int | None = None
    by: str = ""
    four_bit: dict | None = None


def trainers_options(config: Any) -> dict[str, dict]:
    """The trainers the project's runs use, each with the options a run would give it (what a check assumes)."""
    return {name: trainer_options(config, None, name) for name in project_trainers(config)}


def probe_questions(options: Mapping[str, Mapping[str, Any]], *, four_bit: bool = True) -> dict:
    """The probe's questions for trainers ``{name: options}``; *four_bit* False leaves bitsandbytes alone
    (the run's interpreter is not the probed one: a ``packages`` venv, a SLURM compute node)."""
    models: list[str] = []
    ask_four_bit = False
    for name, opts in options.items():
        ask = hook(TRAINERS[name], "host_questions")
        if ask is None:
            continue
        asked = ask(dict(opts))
        models += [m for m in asked.get("models") or () if m not in models]
        ask_four_bit = ask_four_bit or bool(asked.get("four_bit"))
    questions: dict[str, Any] = {}
    if models:
        questions["models"] = models
    if ask_four_bit and four_bit:
        questions["four_bit"] = True
    return questions


# What a host says about a model or bitsandbytes is quoted in messages: one line, this long at most.
MAX_SAID = 300


def _answers(report: dict) -> dict:
    """The probe's answers to the trainers' questions in the shapes the hooks read; anything else the host
    sent in their place (it is the host's output) is dropped, and what it says is cut to one short line."""
    def said(value: Any) -> Any:
        return value if not isinstance(value, str) else value.splitlines()[0][:MAX_SAID] if value else value

    models = report.get("models")
    models = {str(name): {key: (value if key == "config" else said(value)) for key, value in entry.items()}
              for name, entry in models.items() if isinstance(entry, dict)} if isinstance(models, dict) else {}
    four_bit = report.get("four_bit")
    four_bit = {key: said(value) for key, value in four_bit.items()} if isinstance(four_bit, dict) else None
    return dict(report, models=models, four_bit=four_bit, executable=said(str(report.get("executable") or "")))


def assess(options: Mapping[str, Mapping[str, Any]], report: dict, host: str) -> HostNeeds:
    """What the probe's *report* of *host* means for trainers ``{name: options}``."""
    report = _answers(report)
    needs = HostNeeds(four_bit=report["four_bit"])
    for name, opts in options.items():
        info = TRAINERS[name]
        check = hook(info, "host_check")
        if check is not None:
            said = check(dict(opts), report, host)
            needs.problems += said.problems
            needs.notes += said.notes
        estimate = hook(info, "gpu_memory_mb")
        mb = estimate(dict(opts), report) if estimate is not None else None
        if mb is not None and (needs.gpu_mb is None or mb > needs.gpu_mb):
            model = opts.get("model")
            needs.gpu_mb, needs.by = mb, f"{name}'s estimate for {model}" if model else f"{name}'s estimate"
    return needs
