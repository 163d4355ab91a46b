"""``potato training check`` for an ssh backend: log in, probe the host, say whether a run could start.

The Training page's Check button runs the same check (``potato.backends.checks``).
"""

from __future__ import annotations

from potato.backend_types.contract import CheckReport
from potato.backends.ssh import steps as ssh
from potato.backends.ssh import trainer_needs
from potato.backends.ssh.gpus import choose_for_backend
from potato.backends.ssh.openssh import Connection, SshTarget
from potato.config import BackendConfig, ProjectConfig
from potato.errors import PotatoError
from potato.training.trainers.registry import TRAINERS, module_names


def login_and_probe(backend: BackendConfig, trainers: list[str], first_line: str,
                    questions: dict | None = None) -> tuple[CheckReport, dict | None]:
    """A report that starts with *first_line*, and what the host has (None when logging in or probing failed:
    then the report's last line says why); *questions*: the trainers' (``trainer_needs.probe_questions``)."""
    report = CheckReport(backend=backend.name, type=backend.type, ok=False, lines=[first_line])
    target = SshTarget.from_backend(backend)
    connection = Connection(target)
    try:
        connection.open()
        session = ssh.SshSession(target=target, connection=connection, python=backend.get("python", "python3"))
        return report, ssh.probe(session, backend.get("remote_dir"), trainers, gpus=ssh.wants_gpus(backend),
                                 questions=questions)
    except PotatoError as exc:
        report.lines.append(str(exc))
        return report, None
    finally:
        connection.close()


def check_ssh(config: ProjectConfig, backend: BackendConfig) -> CheckReport:
    """Log in, probe the host: its Python, every GPU, the GPU a run would take, missing packages (those of
    the trainers the project's runs use), and what those trainers check there (4-bit, the GPU memory a run
    needs: ``trainer_needs``)."""
    options = trainer_needs.trainers_options(config)
    trainers = list(options)
    questions = trainer_needs.probe_questions(options, four_bit=not backend.get("packages"))
    report, probe = login_and_probe(backend, trainers, f"{backend.name}: ssh to {backend.host}", questions)
    lines = report.lines
    if probe is not None:
        lines.append(f"Python {probe['python']} ({probe['executable']})")
        report.data.update(python=probe["python"], missing=probe["missing"])
        needs = trainer_needs.assess(options, probe, backend.host)
        try:
            gpus = ssh.host_gpus(probe, backend.host)
            lines += [gpu.describe() for gpu in gpus] or ["No GPU (no nvidia-smi, or it found no devices)"]
            report.data["gpus"] = [g.__dict__ for g in gpus]
            choice = choose_for_backend(gpus, backend, needed_mb=needs.gpu_mb if gpus else None, needed_by=needs.by)
            lines.append(f"A run would take {choice.describe(gpus)}")
            report.data["would_use"] = list(choice.indices)
            report.ok = True
        except PotatoError as exc:
            lines.append(f"A run could not start: {exc}")
        lines += needs.notes + [f"A run could not start: {problem}" for problem in needs.problems]
        report.data.update(gpu_memory_mb=needs.gpu_mb, four_bit=needs.four_bit)
        report.ok = report.ok and not needs.problems
        missing, packages = probe["missing"], list(backend.get("packages") or ())
        if missing:
            where = "; packages installs them into a venv on the first run" if packages else (
                ": point python at an interpreter that has them, or list them under packages")
            lines.append(f"Training packages missing from {backend.get('python', 'python3')}: "
                         f"{module_names(missing)}{where}")
            report.ok = report.ok and bool(packages)
        else:
            needed = dict.fromkeys(m for name in trainers for m in TRAINERS[name].required_modules)
            lines.append("Training packages: all there (" + ", ".join(needed) + ")")
    return report
