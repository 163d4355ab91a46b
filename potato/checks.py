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


def _probe_host(backend: BackendConfig, trainer: str, report: CheckReport) -> dict | None:
    """Log in and probe the host once; a failure becomes the report's last line and None."""
    from potato.errors import PotatoError
    from potato.tasks import ssh
    from potato.tasks.openssh import Connection, SshTarget

    target = SshTarget.from_backend(backend)
    connection = Connection(target)
    try:
        connection.open()
        session = ssh.SshSession(target=target, connection=connection, python=backend.get("python", "python3"))
        return ssh.probe(session, backend.get("remote_dir"), trainer, gpus=ssh.wants_gpus(backend))
    except PotatoError as exc:
        report.lines.append(str(exc))
        return None
    finally:
        connection.close()


def check_ssh(config: ProjectConfig, backend: BackendConfig, trainer: str = "hf-text-classification") -> CheckReport:
    """Log in, probe the host: its Python, every GPU, the GPU a run would take, missing packages."""
    from potato.errors import PotatoError
    from potato.tasks import ssh
    from potato.tasks.gpus import choose_for_backend

    report = CheckReport(backend=backend.name, type="ssh", ok=False, lines=[f"{backend.name}: ssh to {backend.host}"])
    lines = report.lines
    probe = _probe_host(backend, trainer, report)
    if probe is not None:
        lines.append(f"Python {probe['python']} ({probe['executable']})")
        report.data.update(python=probe["python"], missing=probe["missing"])
        try:
            gpus = ssh.host_gpus(probe, backend.host)
            lines += [gpu.describe() for gpu in gpus] or ["No GPU (no nvidia-smi, or it found no devices)"]
            report.data["gpus"] = [g.__dict__ for g in gpus]
            choice = choose_for_backend(gpus, backend)
            lines.append(f"A run would take {choice.describe(gpus)}")
            report.data["would_use"] = list(choice.indices)
            report.ok = True
        except PotatoError as exc:
            lines.append(f"A run could not start: {exc}")
        missing, packages = probe["missing"], list(backend.get("packages") or ())
        if missing:
            where = "; packages installs them into a venv on the first run" if packages else (
                ": point python at an interpreter that has them, or list them under packages")
            lines.append(f"Training packages missing from {backend.get('python', 'python3')}: "
                         f"{', '.join(missing)}{where}")
            report.ok = report.ok and bool(packages)
        else:
            lines.append("Training packages: all there (" + ", ".join(ssh.TRAINER_PACKAGES.get(trainer, ())) + ")")
    return report


def check_slurm(config: ProjectConfig, backend: BackendConfig, trainer: str = "hf-text-classification") -> CheckReport:
    """Log in to the login node: sbatch/squeue/scancel on PATH, remote_dir, its Python, job_python (SPEC §8)."""
    from potato.errors import MissingSlurmCommand

    report = CheckReport(backend=backend.name, type="slurm", ok=False,
                         lines=[f"{backend.name}: slurm on {backend.host}"])
    lines = report.lines
    probe = _probe_host(backend, trainer, report)
    if probe is not None:
        lines.append(f"Login node: Python {probe['python']} ({probe['executable']}), for the agent")
        commands = probe.get("commands") or {}
        missing = [name for name in ("sbatch", "squeue", "scancel") if not commands.get(name)]
        for name in missing:
            lines.append(str(MissingSlurmCommand(backend.host, name)))
        if not missing:
            lines.append("sbatch, squeue, scancel: on PATH (" + str(commands["sbatch"]).rsplit("/", 1)[0] + ")")
        lines.append("scontrol: on PATH" if commands.get("scontrol") else
                     "scontrol: not found; a job the scheduler ends is explained from slurm.out alone")
        remote_dir = str(backend.get("remote_dir"))
        under_tmp = remote_dir.rstrip("/") in ("/tmp", "/var/tmp") or remote_dir.startswith(("/tmp/", "/var/tmp/"))
        lines.append(f"remote_dir {remote_dir}: " + ("under /tmp or /var/tmp, which each node has its own of; "
                                                     "use storage the compute nodes share" if under_tmp else
                                                     "not node-local"))
        lines.append(f"Jobs run {backend.get('job_python')} on the compute nodes (their packages cannot be "
                     "checked from the login node: a short first run shows them)")
        gres = backend.get("gres")
        lines.append(f"GPUs: {gres} per job" if gres else "GPUs: none (no gres: the job gets no GPU)")
        report.data.update(python=probe["python"], commands=commands, job_python=backend.get("job_python"))
        report.ok = not missing and not under_tmp
    return report


CHECKS = {
    "slurm": check_slurm,
    "ssh": check_ssh,
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
