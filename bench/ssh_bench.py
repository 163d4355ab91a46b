"""ssh backend benchmarks against the real test sshd (run by hand, as root, never in CI's pass/fail):

    .venv/bin/python -m pytest -p tests.support.service_fixtures -p tests.support.prefect_fixtures \\
        bench/ssh_bench.py -s -q

(a) artifact fetch of a 300 MB model against ``ssh host cat file > out`` (target ≥ 0.8×);
(d) artifact fetch of 200 small files (a tokenizer's and config's worth, ~7 MB) against
    ``tar cf - …`` through the run's master ``| tar xf -`` (what the fetch did before it
    unpacked the host's tar stream itself, checking every member; target ≥ 0.8×);
(b) a warm ssh run (code already on the host) against a local run of the same job (target ≤ 1 s added);
(c) the first run's code sync: time to copy the remote half to a host that has none.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from potato.backends.base import RunContext
from potato.backends.ssh import fetch
from potato.backends.ssh import steps as ssh
from potato.backends.ssh.code import code_archive
from potato.backends.ssh.openssh import Connection, SshTarget
from potato.config import load_config
from potato.runs.paths import open_store, run_paths
from potato.runs.queue import create_run
from potato.runs.runlog import RunLog
from tests.support.runs import potato, store_of, tiny_project

SIZE_MB = 300


def _ctx(config_yaml: Path, backend: str) -> RunContext:
    cfg = load_config(config_yaml)
    store = open_store(cfg)
    run = create_run(cfg, store, backend=backend)
    store.transition(run.id, "cancelled", from_states=("queued",))  # a record for the context only
    return RunContext(cfg, store, store.get_run(run.id), cfg.model_training.backends[backend],
                      RunLog(store, run.id, run_paths(cfg, run.id).dir / "run.log"))


def _project(root: Path, alias: str, python: str) -> Path:
    return tiny_project(root, trainer={"epochs": 2}, backends={
        "gpu-server": {"type": "ssh", "host": alias, "python": str(python)}})


def test_fetch_throughput_against_ssh_cat(sshd_service, ssh_user_config, tmp_path):
    home = Path(sshd_service.user_home)
    job = home / ".cache/potato-bench-job"
    (job / "artifacts").mkdir(parents=True, exist_ok=True)
    big = job / "artifacts" / "model.safetensors"
    with open(big, "wb") as fh:  # incompressible, like real weights
        for _ in range(SIZE_MB):
            fh.write(os.urandom(1 << 20))
    subprocess.run(["chown", "-R", sshd_service.user, str(job)], check=True)
    config_yaml = _project(tmp_path / "p", ssh_user_config, sshd_service.python)
    ctx = _ctx(config_yaml, "gpu-server")
    target = SshTarget.from_backend(ctx.backend)
    connection = Connection(target)
    connection.open()
    session = ssh.SshSession(target=target, connection=connection, python=sshd_service.python, job_dir=str(job))
    base, ours = [], []
    try:
        for _ in range(3):
            out = tmp_path / "cat.out"
            t0 = time.monotonic()
            with open(out, "wb") as fh:
                subprocess.run(["ssh", ssh_user_config, "cat", str(big)], stdout=fh, check=True)
            base.append(time.monotonic() - t0)
            out.unlink()
            t0 = time.monotonic()
            assert fetch.copy_artifacts(ctx, session, [(big.stat().st_size, "model.safetensors")]) == []
            ours.append(time.monotonic() - t0)
            assert (ctx.artifacts_dir / "model.safetensors").stat().st_size == SIZE_MB << 20
            shutil.rmtree(ctx.artifacts_dir)
    finally:
        connection.close()
        shutil.rmtree(job, ignore_errors=True)
    b, o = statistics.median(base), statistics.median(ours)
    print(f"\n(a) fetch {SIZE_MB} MB: ssh cat {SIZE_MB / b:.0f} MB/s ({b:.2f} s), ours {SIZE_MB / o:.0f} MB/s "
          f"({o:.2f} s): {b / o:.2f}× (target ≥ 0.8×)")


def test_fetch_of_small_files_against_tar(sshd_service, ssh_user_config, tmp_path):
    home = Path(sshd_service.user_home)
    job = home / ".cache/potato-bench-small"
    files = []
    for i in range(200):
        name = f"sentiment/part{i % 4}/file{i:03d}.json"
        path = job / "artifacts" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(4096 + (i * 997) % 61440))
        files.append((path.stat().st_size, name))
    subprocess.run(["chown", "-R", sshd_service.user, str(job)], check=True)
    ctx = _ctx(_project(tmp_path / "p", ssh_user_config, sshd_service.python), "gpu-server")
    target = SshTarget.from_backend(ctx.backend)
    connection = Connection(target)
    connection.open()
    session = ssh.SshSession(target=target, connection=connection, python=sshd_service.python, job_dir=str(job))
    names = "".join(f"./{name}\n" for _, name in files).encode()
    base, ours = [], []
    try:
        for _ in range(5):
            out = tmp_path / "tar.out"
            out.mkdir()
            t0 = time.monotonic()
            remote = connection.popen(f"cd {job}/artifacts && exec tar cf - -T -", stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE)  # through the same master, as before
            local = subprocess.Popen(["tar", "xf", "-", "-C", str(out)], stdin=remote.stdout)
            remote.stdout.close()
            remote.stdin.write(names)
            remote.stdin.close()
            assert local.wait() == 0 and remote.wait() == 0
            base.append(time.monotonic() - t0)
            shutil.rmtree(out)
            t0 = time.monotonic()
            assert fetch.copy_artifacts(ctx, session, files) == []
            ours.append(time.monotonic() - t0)
            shutil.rmtree(ctx.artifacts_dir)
    finally:
        connection.close()
        shutil.rmtree(job, ignore_errors=True)
    b, o = statistics.median(base), statistics.median(ours)
    total = sum(size for size, _ in files) / 1e6
    print(f"\n(d) fetch {len(files)} small files ({total:.1f} MB): ssh tar | tar {b:.3f} s, ours {o:.3f} s: "
          f"{b / o:.2f}× (target ≥ 0.8×)")


def test_first_code_sync(sshd_service, ssh_user_config):
    code_hash, archive = code_archive()
    remote_dir = f"{sshd_service.user_home}/.cache/potato-training"
    times = []
    for _ in range(3):
        shutil.rmtree(f"{remote_dir}/code", ignore_errors=True)
        connection = Connection(SshTarget(host=ssh_user_config))
        connection.open()
        try:
            t0 = time.monotonic()
            connection.run(ssh._install_code_command(remote_dir, code_hash), input=archive)
            times.append(time.monotonic() - t0)
        finally:
            connection.close()
    print(f"\n(c) first-run code sync: {len(archive) / 1024:.0f} KiB archive, median {statistics.median(times):.3f} s "
          f"(one round trip through the master connection)")


def test_warm_ssh_run_against_local(prefect_api, sshd_service, ssh_user_config, tmp_path):
    config_yaml = _project(tmp_path, ssh_user_config, sshd_service.python)
    model = Path(load_config(config_yaml).model_training.trainers["hf-text-classification"]["model"])
    shared = Path(tempfile.mkdtemp(prefix="potato-bench-model-"))
    shutil.copytree(model, shared / "model")
    for path in [shared, *shared.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    text = config_yaml.read_text().replace(str(model), str(shared / "model"))
    config_yaml.write_text(text)
    try:
        assert potato("training", "run", str(config_yaml), "--backend", "gpu-server").returncode == 0  # warm
        durations = {"local": [], "gpu-server": []}
        for _ in range(3):
            for backend in ("local", "gpu-server"):
                done = potato("training", "run", str(config_yaml), "--backend", backend)
                assert done.returncode == 0, done.stdout + done.stderr
                run = store_of(config_yaml).list_runs(limit=1)[0]
                durations[backend].append(run.finished_at - run.started_at)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    local, remote = statistics.median(durations["local"]), statistics.median(durations["gpu-server"])
    print(f"\n(b) run, started → finished: local {local:.2f} s, warm ssh {remote:.2f} s: "
          f"added {remote - local:.2f} s (target ≤ 1 s)")
