"""The run bundle: what a worker trains on, built from the items, the answers and the holdout split.

- ``build``          the flow's build-bundle step
- ``pack``           the bundle as a reproducible ``.tar.gz``, and its manifest
"""
