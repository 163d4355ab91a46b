"""Backends: where a run executes, one package of steps per type (``local``, ``ssh``, ``slurm``, ``agent``).

A type is declared in ``potato.backend_types`` (``contract.BackendType``: its
keys, menu text, capabilities, and where its code is, in
``backend_types/<type>.py``) and listed once in its ``registry``; the type's
``steps`` module here implements the flow's steps (``base.Steps``). Nothing
else in Potato names a type: the code that differs by backend reads the
declaration's capability flags. docs/backends.md lists each type's keys;
docs/architecture.md says how a new type is added.
"""
