"""The remote half: the training worker, its events, device choice (and the agent).

Everything under ``potato/training/`` and ``potato/training/trainers/``, and
``potato/training/answer_kinds.py`` (the kinds of answer both halves speak of), is
copied to GPU hosts and hashed for "sync code by hash"
(``potato/backends/ssh/code.py``). The rule for these
(checked by ``tests/unit/test_remote_half.py``):

- it runs on Python 3.8 (``vermin -t=3.8-``);
- importing any module here loads only the standard library (and other
  modules of the remote half) — trainers import torch / transformers / peft
  inside their functions;
- nothing here imports flask, prefect, click, yaml or any ``potato.*`` module
  outside the remote half (not even ``potato.errors``: what the remote half
  needs, it defines itself).
"""
