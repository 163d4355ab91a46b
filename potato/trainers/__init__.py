"""Trainers: the code that turns a run bundle into a model and predictions.

Part of the remote half (copied to GPU hosts): stdlib only at import time;
each trainer imports its ML packages lazily, inside its functions.
"""

# name -> module under potato.trainers; every module exposes
#   DEFAULT_OPTIONS (dict), check_options(options) -> list[str] (error texts, empty when fine),
#   REQUIRED_MODULES (tuple of import names) and train(job, events) -> None; optionally
#   USES_DEVICE = False for one that computes on no torch device (the worker then imports no torch).
TRAINERS = {
    "hf-text-classification": "potato.trainers.hf_text_classification",
    "decision-calibrate": "potato.trainers.decision_calibrate",
    "hf-llm-finetune": "potato.trainers.hf_llm_finetune",
}

# Trainers that run only on a backend of type local (SPEC §1): decision-calibrate
# reads an earlier run's predictions and holdout labels, which live on the
# annotation server, and the server rewrites them when it is done.
LOCAL_ONLY = frozenset({"decision-calibrate"})


def import_failure_message(trainer: str, missing: str) -> str:
    """SPEC §9's text for a trainer whose packages are missing, with the module named."""
    return "Trainer {!r} could not be imported (missing module: {})".format(trainer, missing)
