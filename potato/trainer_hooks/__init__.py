"""The server's half of a trainer that declares hooks (``prepare``, ``record``) in the trainer registry.

A trainer's worker half runs wherever the run trains (``potato.training.trainers``);
what it must do on the annotation server itself — read an earlier run's
files before the bundle ships, rewrite that run's results afterwards — is a
module here named for the trainer, which the registry names as
``"potato.trainer_hooks.<trainer>:<function>"``.
"""
