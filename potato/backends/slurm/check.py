"""``potato training check`` for a slurm backend: log in to the login node, check what submitting needs.

The compute nodes cannot be seen from the login node: their packages show
in a short first run.
"""

from __future__ import annotations

from potato.backend_types.contract import CheckReport
from potato.backend_types.slurm import under_node_local_dir
from potato.backends.slurm.steps import REQUIRED_COMMANDS
from potato.backends.ssh import trainer_needs
from potato.backends.ssh.check import login_and_probe
from potato.config import BackendConfig, ProjectConfig
from potato.errors import MissingSlurmCommand
from potato.training.trainers.registry import TRAINERS, hook


def check_slurm(config: ProjectConfig, backend: BackendConfig) -> CheckReport:
    """Log in to the login node: sbatch/squeue/scancel on PATH, remote_dir, its Python, job_python."""
    options = trainer_needs.trainers_options(config)
    # The login node's interpreter is not job_python on a compute node: bitsandbytes is judged by the job.
    questions = trainer_needs.probe_questions(options, four_bit=False)
    report, probe = login_and_probe(backend, list(options), f"{backend.name}: slurm on {backend.host}", questions)
    lines = report.lines
    if probe is not None:
        lines.append(f"Login node: Python {probe['python']} ({probe['executable']}), for the agent")
        commands = probe.get("commands") or {}
        missing = [name for name in REQUIRED_COMMANDS if not commands.get(name)]
        for name in missing:
            lines.append(str(MissingSlurmCommand(backend.host, name)))
        if not missing:
            lines.append(f"{', '.join(REQUIRED_COMMANDS)}: on PATH (" + str(commands["sbatch"]).rsplit("/", 1)[0] + ")")
        lines.append("scontrol: on PATH" if commands.get("scontrol") else
                     "scontrol: not found; a job the scheduler ends is explained from slurm.out alone")
        remote_dir = str(backend.get("remote_dir"))
        under_tmp = under_node_local_dir(remote_dir) is not None
        lines.append(f"remote_dir {remote_dir}: " + ("under /tmp or /var/tmp, which each node has its own of; "
                                                     "use storage the compute nodes share" if under_tmp else
                                                     "not node-local"))
        lines.append(f"Jobs run {backend.get('job_python')} on the compute nodes (their packages cannot be "
                     "checked from the login node: a short first run shows them)")
        gres = backend.get("gres")
        lines.append(f"GPUs: {gres} per job" if gres else "GPUs: none (no gres: the job gets no GPU)")
        # Read on the login node, which usually sees the nodes' shared storage: said, not refused (the job is).
        needs = trainer_needs.assess(options, probe, backend.host)
        lines += needs.notes + [f"Login node: {problem}" for problem in needs.problems]
        if any(hook(TRAINERS[name], "host_questions") for name in options):
            lines.append("4-bit: whether bitsandbytes works on the compute nodes shows in the job's log "
                         "(the login node cannot see their packages)")
        report.data["gpu_memory_mb"] = needs.gpu_mb
        report.data.update(python=probe["python"], commands=commands, job_python=backend.get("job_python"))
        report.ok = not missing and not under_tmp
    return report
