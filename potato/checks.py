"""``potato training check BACKEND`` (SPEC §8): can a run start there, and where would it run?

The CLI and the Training page's Check button both call ``check_backend``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from potato.config import BackendConfig, ProjectConfig


@dataclass
class CheckReport:
    backend: str
    type: str
    ok: bool
    lines: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "type": self.type, "ok": self.ok, "report": self.lines, **self.data}

    def text(self) -> str:
        return "\n".join(self.lines)


def check_local(config: ProjectConfig, backend: BackendConfig) -> CheckReport:
    from potato.training.device import describe_local_device

    setting = config.model_training.device
    description = describe_local_device(setting)
    return CheckReport(
        backend=backend.name, type="local", ok=True,
        lines=[f"{backend.name}: this machine, {description}"],
        data={"device_setting": setting, "device": description},
    )


def check_agent(config: ProjectConfig, backend: BackendConfig) -> CheckReport:
    from potato.tokens import check_agent as token_record

    return token_record(config, backend)


CHECKS = {
    "local": check_local,
    "agent": check_agent,
}


def check_backend(config: ProjectConfig, name: str) -> CheckReport:
    """Run the check of backend *name*; raise ``KeyError`` when the config has no such backend."""
    backend = config.model_training.backends[name]
    check = CHECKS.get(backend.type)
    if check is None:
        return CheckReport(
            backend=name, type=backend.type, ok=False,
            lines=[f"{name}: the {backend.type} backend is not available in this version of Potato"],
        )
    return check(config, backend)
