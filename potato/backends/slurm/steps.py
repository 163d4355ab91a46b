"""The slurm backend's steps: the agent on the login node submits the worker with sbatch.

Connecting, copying the code, relaying, fetching artifacts and cleaning up are
the ssh backend's steps, against the login node. What differs: the login node
needs ``sbatch``/``squeue``/``scancel`` rather than GPUs (those come from
``gres``), ``packages`` is not supported (a venv built on the login node may
not run on the compute nodes), and the agent is started with
``--slurm-config``, the backend's SLURM keys, so that it submits the worker
(``potato/training/slurm.py``) instead of running it.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from potato.backends.base import RunContext
from potato.backends.ssh import steps as ssh
from potato.backends.ssh.steps import RemoteAgent, SshSession
from potato.errors import MissingSlurmCommand
from potato.training.job_paths import JobPaths
from potato.training.slurm import SBATCH_FLAGS

REQUIRED_COMMANDS = ("sbatch", "squeue", "scancel")
# The backend's keys the agent submits with: the sbatch flags, and what job.sh runs.
AGENT_KEYS = (*SBATCH_FLAGS, "prelude", "job_python", "poll_interval_s")

connect = ssh.connect
stop = ssh.stop
fetch_artifacts = ssh.fetch_artifacts
clean_up = ssh.clean_up


# The agent's note on submitting ("Submitted SLURM job <id>"), which reaches the run log.
SUBMITTED = re.compile(r"Submitted SLURM job (\d+)")


@dataclass
class SlurmAgent(RemoteAgent):
    """The agent on the login node, and how far its log events were read for the job's id."""

    events_seen: int = 0


def make_slurm_config(ctx: RunContext, session: SshSession) -> dict:
    """slurm.json for the agent: the backend's SLURM keys and where the code is."""
    config = {key: ctx.backend.get(key) for key in AGENT_KEYS if ctx.backend.get(key) not in (None, "", ())}
    config["prelude"] = list(config.get("prelude") or ())
    config["code_dir"] = session.code_dir()
    return config


def pick_gpu(ctx: RunContext, session: SshSession) -> str:
    ctx.set_step(f"checking {session.host}: Python and SLURM")
    report = ssh.probe_host(ctx, session)
    commands = report.get("commands") or {}
    for name in REQUIRED_COMMANDS:
        if not commands.get(name):
            raise MissingSlurmCommand(session.host, name)
    if not commands.get("scontrol"):
        ctx.log.info(f"{session.host} has no scontrol: a job the scheduler ends is explained from slurm.out")
    gres = ctx.backend.get("gres")
    used = f"gres {gres}, from the scheduler" if gres else "no GPU (no gres)"
    ctx.log.info(f"The job gets {used}; the worker runs {ctx.backend.get('job_python')} on a compute node")
    ctx.store.update_run(ctx.run_id, host_python=report["python"], gpu=used)
    return used


def sync_code(ctx: RunContext, session: SshSession) -> str:
    # The trainer's packages live on the compute nodes, which the login node cannot see.
    return ssh.copy_code(ctx, session)


def spawn(ctx: RunContext, session: SshSession) -> SlurmAgent:
    path = JobPaths(ssh.make_job_dir(session, ctx)).slurm_config
    session.connection.run(f"cat > {shlex.quote(path)}", input=json.dumps(make_slurm_config(ctx, session)).encode())
    started = ssh.start_agent(ctx, session, ["--slurm-config", path])
    return SlurmAgent(process=started.process, log_file=started.log_file)


def poll(ctx: RunContext, session: SshSession, agent: SlurmAgent) -> int | None:
    if not ctx.run.slurm_job_id:
        record_job_id(ctx, agent)
    return ssh.poll(ctx, session, agent)


def record_job_id(ctx: RunContext, agent: SlurmAgent) -> str | None:
    """Keep the job id the agent reported in the store: if the flow dies, the job is still cancelled."""
    for event in ctx.store.events(ctx.run_id, after=agent.events_seen):
        agent.events_seen = event.seq
        found = SUBMITTED.match(str(event.data.get("message", ""))) if event.kind == "log" else None
        if found:
            ctx.store.update_run(ctx.run_id, slurm_job_id=found.group(1))
            return found.group(1)
    return None
