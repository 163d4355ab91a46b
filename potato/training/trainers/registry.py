"""The trainers: which there are, what each trains and needs, declared without importing any.

Naming a trainer must not import torch. The server lists trainers on the
Training page and in its API, ``potato validate`` pairs them with schemas,
an ssh host is probed for a trainer's packages and a run is refused on a
backend a trainer cannot run on, all from the declarations below; only the
worker imports a trainer's module, when it trains. (Potato 2.12.1 registers
its trainers the same way, for the same reason: its
``potato/training/registry.py``.)

A trainer is a module with ``NAME``, ``DEFAULT_OPTIONS``,
``check_options(options) -> list[str]`` (problems, empty when fine; it may
add ``check_run_options`` for what a run's whole options must hold, e.g. a
``model``) and ``train(job, events)``, stdlib-only at import (it is copied to GPU hosts;
docs/architecture.md, "The job directory"), plus one ``TrainerInfo`` in
``TRAINERS``. The declaration is the home of what the server needs to know
before anything is imported: the answer kinds it trains
(``potato.training.answer_kinds``), its packages (the worker imports them before it
trains, the ssh probe looks for them), the pip extra that installs them,
whether it runs only on this machine and whether it computes on a torch
device. A module may repeat ``REQUIRED_MODULES`` and ``USES_DEVICE``; a test
holds them equal to its declaration.

Hooks run on the annotation server, named ``"module:function"`` so that the
declaration imports nothing; each takes the run's context
(``potato.backends.base.RunContext``):

- ``prepare``: at build-bundle, once the bundle is built; adds what only the
  server has (decision-calibrate: an earlier run's predictions).
- ``record``: at record-results, in place of the usual holdout evaluation
  and writeback (decision-calibrate rewrites an earlier run's instead).
- ``gpu_memory_mb``: ``f(options, host) -> MB or None``, how much GPU memory a
  run with these options needs (``host``: the GPU host's probe report, None for
  this machine); ``gpus: auto`` asks a GPU to have that much free when it is
  more than ``min_free_gpu_mb``.
- ``host_questions``: ``f(options) -> dict``, what the ssh probe looks up on
  the host for such a run (potato/training/probe.py: ``models``, ``four_bit``).
- ``host_check``: ``f(options, host, name) -> HostCheck``, what the probe's
  answers mean for the run on host *name*: problems that stop it before
  anything is copied, and lines for the run log and ``potato training check``.
- ``rough_time``: ``f(options, host, counts) -> line or None``, about how long a
  run computes on the host of probe report ``host`` (its ``speed``), for
  ``counts`` of items (``potato training check local``).

Part of the remote half: Python 3.8, standard library only.
"""

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple

from potato.training.answer_kinds import (
    BEST_WORST,
    COMPARISON,
    CONTINUOUS,
    MULTILABEL,
    NOMINAL,
    ORDINAL,
    RANKING,
    SPAN,
    TEXT,
)

TEXT_EXTRA = "pip install 'potato-annotation[train-text]'"
SKLEARN_EXTRA = "pip install 'potato-annotation[train-sklearn]'"
LLM_EXTRA = "pip install 'potato-annotation[train-llm]'"

# Import names whose pip package is named otherwise: what a message about a missing module names too,
# since the backend's ``packages`` and pip take the package's name (``pip install sklearn`` fails).
PIP_NAMES = {"sklearn": "scikit-learn", "sentence_transformers": "sentence-transformers"}


@dataclass(frozen=True)
class TrainerInfo:
    """What the server knows of a trainer without importing it."""

    name: str
    module: str                                  # the trainer's module (NAME, DEFAULT_OPTIONS, check_options, train)
    kinds: Tuple[str, ...]                       # the answer kinds it trains (potato.training.answer_kinds)
    description: str = ""
    required_modules: Tuple[str, ...] = ()       # import names the worker needs beside the standard library
    # Of those, the ones the worker only looks up at start: the trainer imports them where a job's options
    # need them (peft, for ``lora``: importing it costs 180 MB of memory and seconds, and brings bitsandbytes).
    imported_when_used: Tuple[str, ...] = ()
    install_hint: str = ""                       # how to install them
    local_only: str = ""                         # why it runs only on this machine ("" when it runs anywhere)
    uses_device: bool = True                     # False: no torch device, threads or data-parallel processes
    learns: bool = True                          # False: it trains no model (cold-start orders items), so it is
                                                 # never offered as a trainer that can train a schema
    prepare: Optional[str] = None                # "module:function", see the module docstring
    record: Optional[str] = None
    gpu_memory_mb: Optional[str] = None
    host_questions: Optional[str] = None
    host_check: Optional[str] = None
    rough_time: Optional[str] = None


class HostCheck(NamedTuple):
    """A ``host_check`` hook's answer: ``problems`` stop a run on that host, ``notes`` are said."""

    problems: List[str]
    notes: List[str]


# The trainer a run that names none uses for each kind of answer (potato.trainer_choice plans runs with it).
DEFAULT_BY_KIND = {
    NOMINAL: "hf-text-classification",
    ORDINAL: "hf-text-classification",
    CONTINUOUS: "hf-text-classification",
    MULTILABEL: "hf-text-classification",
    SPAN: "hf-span-tagging",
    TEXT: "hf-llm-finetune",
    COMPARISON: "hf-reward-model",
    BEST_WORST: "hf-reward-model",
    RANKING: "hf-reward-model",
}

TRAINERS: Dict[str, TrainerInfo] = {info.name: info for info in (
    TrainerInfo(
        "hf-text-classification", "potato.training.trainers.hf_text_classification", (NOMINAL, ORDINAL, CONTINUOUS, MULTILABEL),
        "Fine-tunes a Hugging Face encoder on the item text (full or LoRA), one model per schema",
        required_modules=("torch", "transformers", "peft"), install_hint=TEXT_EXTRA,
        imported_when_used=("peft",)),
    TrainerInfo(
        "decision-calibrate", "potato.training.trainers.decision_calibrate", (NOMINAL,),
        "Recalibrates an earlier run's confidences, kept only if holdout log-loss and ECE fall",
        local_only=("it rewrites an earlier run's predictions, which are kept on this server. Start it on "
                    "'local' (it needs no GPU and takes seconds)"),
        uses_device=False, prepare="potato.trainer_hooks.decision_calibrate:prepare", record="potato.trainer_hooks.decision_calibrate:apply"),
    TrainerInfo(
        "sklearn-text", "potato.training.trainers.sklearn_text", (NOMINAL, ORDINAL, MULTILABEL),
        "A scikit-learn classifier over the item text (Potato 2.12's own trainer, with its params)",
        required_modules=("sklearn",), install_hint=SKLEARN_EXTRA, uses_device=False),
    TrainerInfo(
        "hf-span-tagging", "potato.training.trainers.hf_span_tagging", (SPAN,),
        "Fine-tunes a Hugging Face encoder to tag labelled spans of the item text (BIO tags, full or LoRA)",
        required_modules=("torch", "transformers", "peft"), install_hint=TEXT_EXTRA,
        imported_when_used=("peft",)),
    # bitsandbytes is not required: load_in_4bit auto loads 16-bit weights where it is missing (with a
    # warning), and true names it in its failure; sacrebleu is asked for only when a schema is text.
    TrainerInfo(
        "hf-llm-finetune", "potato.training.trainers.hf_llm_finetune", (NOMINAL, ORDINAL, MULTILABEL, TEXT, COMPARISON),
        "Fine-tunes a LoRA adapter on a causal language model (4-bit base weights where bitsandbytes works)",
        required_modules=("torch", "transformers", "peft"), install_hint=LLM_EXTRA,
        gpu_memory_mb="potato.training.trainers.hf_llm_finetune:gpu_memory_mb",
        host_questions="potato.training.trainers.hf_llm_finetune:host_questions",
        host_check="potato.training.trainers.hf_llm_finetune:host_check",
        rough_time="potato.training.trainers.hf_llm_finetune:rough_time"),
    TrainerInfo(
        "hf-reward-model", "potato.training.trainers.hf_reward_model", (COMPARISON, BEST_WORST, RANKING),
        "Fine-tunes a Hugging Face encoder into a reward model: a score per response, trained on which of two "
        "responses annotators preferred, on the best and the worst of a tuple, or on their orders (Bradley-Terry)",
        required_modules=("torch", "transformers", "peft"), install_hint=TEXT_EXTRA,
        imported_when_used=("peft",)),
    TrainerInfo(
        "cold-start", "potato.training.trainers.cold_start", (NOMINAL, ORDINAL, CONTINUOUS, MULTILABEL, SPAN, TEXT),
        "Before any model: orders the unlabelled items for model_review, a first batch of the most typical item "
        "of each cluster of the shipped encoder's embeddings (typical clustering); pre-fills nothing",
        required_modules=("torch", "transformers"), install_hint=TEXT_EXTRA, learns=False,
        record="potato.results.cold_start_writeback:record"),
)}


def load(info: TrainerInfo) -> ModuleType:
    """The trainer's module (stdlib-only at import: its packages load inside ``train``)."""
    return importlib.import_module(info.module)


def hook(info: TrainerInfo, which: str) -> Optional[Callable[..., Any]]:
    """The function the declaration names for hook *which* (``prepare``, ``record``, ``gpu_memory_mb``, …), or None."""
    path = getattr(info, which)
    if not path:
        return None
    module, _, function = path.partition(":")
    return getattr(importlib.import_module(module), function)


def hooks(names: Any, which: str) -> List[Callable[..., Any]]:
    """The hooks *which* that the trainers *names* (a run's: it may have several) declare."""
    found = (hook(TRAINERS[name], which) for name in names)
    return [function for function in found if function is not None]


def check_options(name: str, options: Any) -> List[str]:
    """The trainer's own problems with *options* (its ``check_options``); none when its module has no check."""
    try:
        module = load(TRAINERS[name])
    except ImportError:
        return []
    check = getattr(module, "check_options", None)
    return list(check(options)) if check else []


def check_run_schemas(name: str, options: Any, schemas: List[Tuple[str, str]]) -> List[str]:
    """The trainer's problems with the run's ``(schema, kind)`` pairs under its options (hf-llm-finetune's
    ``objective``: sft or dpo, each for its own kinds), from its ``check_run_schemas`` where it has one."""
    try:
        module = load(TRAINERS[name])
    except ImportError:
        return []
    check = getattr(module, "check_run_schemas", None)
    return list(check(options, schemas)) if check else []


def check_run_options(name: str, options: Any) -> List[str]:
    """The trainer's problems with all the options a run gives it: its ``check_run_options`` where it has one
    (what no run can do without, e.g. hf-llm-finetune's ``model``), else its ``check_options``."""
    try:
        module = load(TRAINERS[name])
    except ImportError:
        return []
    check = getattr(module, "check_run_options", None) or getattr(module, "check_options", None)
    return list(check(options)) if check else []


def missing_modules(info: TrainerInfo) -> List[str]:
    """The trainer's packages this interpreter cannot import (looked up, not imported)."""
    return [name for name in info.required_modules if importlib.util.find_spec(name) is None]


def trainers_for_kind(kind: str) -> List[TrainerInfo]:
    """The trainers that learn answers of *kind*, in registry order."""
    return [info for info in TRAINERS.values() if kind in info.kinds and info.learns]


def module_names(modules: Iterable[str]) -> str:
    """Import names as a message names them: ``torch, sklearn (pip package scikit-learn)``."""
    return ", ".join(name if name not in PIP_NAMES else "{} (pip package {})".format(name, PIP_NAMES[name])
                     for name in modules)


def import_failure_message(trainer: str, missing: str) -> str:
    """The message for a trainer whose packages are missing, with the module (and its pip package) named."""
    package = PIP_NAMES.get(missing)
    return "Trainer {!r} could not be imported (missing module: {}{})".format(
        trainer, missing, ", whose pip package is " + package if package else "")
