"""What every trainer's ``check_options`` checks first: a mapping, of keys the trainer knows.

One place, so every trainer words these problems the same way; each
trainer then checks its own values (``is_int``/``is_number`` refuse
booleans, which Python counts as integers).
"""

from typing import Any, Dict, List, Optional, Tuple


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
