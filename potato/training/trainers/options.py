"""What every trainer's ``check_options`` checks first: a mapping, of keys the trainer knows.

One place, so every trainer words these problems the same way; each
trainer then checks its own values (``is_int``/``is_number`` refuse
booleans, which Python counts as integers).
"""

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_keys(options: Optional[Any], defaults: Dict[str, Any], trainer: str) -> Tuple[Dict[str, Any], List[str]]:
    """``(options as a mapping, problems)``: not a mapping is one problem (and ``{}`` to check on);
    each key the trainer does not know is one more, naming the valid ones."""
    options = options or {}
    if not isinstance(options, dict):
        return {}, ["options must be a mapping, got {!r}".format(options)]
    return options, ["{!r} is not an option of {}; valid options: {}".format(key, trainer, ", ".join(sorted(defaults)))
                     for key in options if key not in defaults]


def lora_problems(lora: Dict[str, Any], valid: Sequence[str]) -> List[str]:
    """What is wrong with a ``lora`` mapping (``r``, ``alpha``, ``dropout``, ``target_modules``), naming each key."""
    problems = ["lora.{} is not a LoRA option; valid: {}".format(key, ", ".join(valid)) for key in lora if key not in valid]
    if "r" in lora and not (is_int(lora["r"]) and lora["r"] > 0):
        problems.append("lora.r must be a positive integer, got {!r}".format(lora["r"]))
    if "alpha" in lora and not (is_number(lora["alpha"]) and lora["alpha"] > 0):
        problems.append("lora.alpha must be a positive number, got {!r}".format(lora["alpha"]))
    if "dropout" in lora and not (is_number(lora["dropout"]) and 0 <= lora["dropout"] < 1):
        problems.append("lora.dropout must be a number from 0 to below 1, got {!r}".format(lora["dropout"]))
    targets = lora.get("target_modules")
    if targets is not None and not (
        isinstance(targets, str)
        or (isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets))
    ):
        problems.append("lora.target_modules must be a list of module names, got {!r}".format(targets))
    return problems


def positive_int_problems(options: Dict[str, Any], keys: Sequence[str]) -> List[str]:
    """``<key> must be a positive integer, got …`` for each of ``keys`` set to anything else."""
    return ["{} must be a positive integer, got {!r}".format(key, options[key])
            for key in keys if key in options and not (is_int(options[key]) and options[key] > 0)]


def learning_rate_problems(options: Dict[str, Any]) -> List[str]:
    """A ``learning_rate`` that is set but not a positive finite number."""
    lr = options.get("learning_rate")
    if lr is not None and not (is_number(lr) and lr > 0 and math.isfinite(lr)):
        return ["learning_rate must be a positive number, got {!r}".format(lr)]
    return []


def model_problems(options: Dict[str, Any]) -> List[str]:
    """A ``model`` that is set but not a non-empty string (a local directory or a hub id)."""
    model = options.get("model")
    if model is not None and not (isinstance(model, str) and model.strip()):
        return ["model must be a local directory or a hub id, got {!r}".format(model)]
    return []


def seed_problems(options: Dict[str, Any]) -> List[str]:
    """A ``seed`` that is set but not an integer."""
    if "seed" in options and not is_int(options["seed"]):
        return ["seed must be an integer, got {!r}".format(options["seed"])]
    return []
