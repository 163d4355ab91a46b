"""The backend types, declared: each type's keys, menu text, capabilities and where its code is.

A declaration imports none of its type's code (it names it as
``"module:function"``), so reading a config (``potato validate``, the config
loader) needs every type's keys and nothing of ssh, SLURM or the agent
protocol. ``registry`` lists the types once; ``contract`` is what a
declaration is; ``keys`` the keys several types share. The steps of each
type are in ``potato.backends.<type>``.
"""
