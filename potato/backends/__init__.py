"""Backends: where a run executes, one package per type (``local``, ``ssh``, ``slurm``, ``agent``).

A type is declared in its package's ``__init__`` (``contract.BackendType``:
its keys, menu text, capabilities, and where its code is) and listed once in
``registry``; its ``steps`` module implements the flow's steps
(``base.Steps``). Nothing else in Potato names a type: the code that differs
by backend reads the declaration's capability flags. docs/backends.md lists
each type's keys; docs/architecture.md says how a new type is added.
"""
