"""``did you mean `…`?``: the closest of the names a misspelled one could be (config keys, backends, trainers).

One home for the suggestion, so that ``potato validate``, a run request and
``potato training check`` word it alike. Standard library only: the error
classes (``potato.errors``) build their messages with it.
"""

import difflib
from typing import Any, Iterable

# difflib's default: `max_wal_seconds` finds `max_wall_seconds`, `gpu-sever` finds `gpu-server`,
# and a word that shares little with every choice gets no suggestion.
CUTOFF = 0.6


def closest(word: Any, choices: Iterable[Any]) -> "str | None":
    """The choice closest to *word*, or None when none is close enough."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=CUTOFF)
    return close[0] if close else None


def did_you_mean(word: Any, choices: Iterable[Any], end: str = "") -> str:
    """``"; did you mean `python`?"`` for the closest of *choices*, else *end*."""
    found = closest(word, choices)
    return "; did you mean `{}`?".format(found) if found else end
