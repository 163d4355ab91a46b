"""``potato training check BACKEND``: can a run start there, and where would it run?

The CLI and the Training page's Check button both call ``check_backend``,
which runs the check the backend's type declares.
"""

from __future__ import annotations

from potato.backend_types.contract import CheckReport
from potato.backend_types.type_registry import resolve
from potato.config import ProjectConfig


def check_backend(config: ProjectConfig, name: str) -> CheckReport:
    """Run the check of backend *name*; raise ``KeyError`` when the config has no such backend."""
    backend = config.model_training.backends[name]
    return resolve(backend.type_info.check)(config, backend)
