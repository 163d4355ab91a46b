"""Smoke tests of the real test services: what a user of them would see.

If these fail, every ssh/slurm integration test fails for the same reason;
read these first.
"""

import http.server
import secrets
import shlex
import subprocess
import textwrap
import threading

import pytest

from tests.support.runs import wait_for


def _wait_for(predicate, what, deadline_s=30.0):
    return wait_for(predicate, deadline_s, what)


# ----------------------------------------------------------------- sshd


@pytest.mark.sshd
def test_login_with_the_right_key_as_the_unprivileged_user(sshd_service):
    result = sshd_service.run("whoami")
    assert (result.returncode, result.stdout, result.stderr) == (0, "potatotest\n", "")


@pytest.mark.sshd
def test_ssh_argv_quotes_each_word_for_the_remote_shell(sshd_service):
    argv = sshd_service.ssh_argv("printf", "%s|", "a b", "it's", "$HOME")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                            stdin=subprocess.DEVNULL)
    assert (result.returncode, result.stdout) == (0, "a b|it's|$HOME|")


@pytest.mark.sshd
def test_remote_exit_status_comes_back(sshd_service):
    assert sshd_service.run("exit 7").returncode == 7


@pytest.mark.sshd
def test_login_with_a_wrong_key_is_refused(sshd_service):
    # Not `-F ssh_config` plus `-i`: that would offer both keys.
    argv = ["ssh", "-p", str(sshd_service.port), "-i", str(sshd_service.wrong_identity_file),
            *sshd_service.ssh_options, f"{sshd_service.user}@{sshd_service.host}", "true"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 255
    lines = [line.rstrip("\r") for line in result.stderr.splitlines()]
    assert "potatotest@127.0.0.1: Permission denied (publickey)." in lines


@pytest.mark.sshd
def test_ssh_options_without_config_file_log_in(sshd_service):
    argv = ["ssh", "-p", str(sshd_service.port), "-i", str(sshd_service.identity_file),
            "-l", sshd_service.user, *sshd_service.ssh_options, sshd_service.host, "id", "-un"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                            stdin=subprocess.DEVNULL)
    assert (result.returncode, result.stdout) == (0, "potatotest\n")


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"hello from the server, path {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def local_http_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.mark.sshd
def test_reverse_unix_socket_forward_reaches_a_local_server(sshd_service, local_http_server):
    # A fresh path each run: the socket file stays behind on the host after
    # the session and sshd (like real hosts) won't unlink it (measured).
    sock = f"/tmp/potato-smoke-{secrets.token_hex(6)}.sock"
    client = textwrap.dedent(f"""\
        import http.client, socket, os, stat
        class C(http.client.HTTPConnection):
            def connect(self):
                self.sock = socket.socket(socket.AF_UNIX)
                self.sock.connect({sock!r})
        c = C("localhost")
        c.request("GET", "/ping")
        r = c.getresponse()
        print(r.status, r.read().decode())
        print(oct(stat.S_IMODE(os.stat({sock!r}).st_mode)), os.stat({sock!r}).st_uid == os.getuid())
        """)
    try:
        result = sshd_service.run(
            f"python3 -c {shlex.quote(client)} && stat -c %a {sock}",
            options=("-o", "ExitOnForwardFailure=yes",
                     "-R", f"{sock}:127.0.0.1:{local_http_server}"))
        assert result.returncode == 0, result.stderr
        assert result.stdout == "200 hello from the server, path /ping\n0o600 True\n600\n"
    finally:
        sshd_service.run(f"rm -f {sock}")


@pytest.mark.sshd
def test_a_taken_socket_path_fails_the_forward(sshd_service, local_http_server):
    sock = f"/tmp/potato-smoke-{secrets.token_hex(6)}.sock"
    try:
        assert sshd_service.run(f"touch {sock}").returncode == 0
        result = sshd_service.run(
            "echo should-not-run",
            options=("-o", "ExitOnForwardFailure=yes",
                     "-R", f"{sock}:127.0.0.1:{local_http_server}"))
        assert result.returncode == 255
        assert result.stdout == ""
        assert f"Error: remote port forwarding failed for listen path {sock}" in (
            result.stderr.replace("\r", ""))
    finally:
        sshd_service.run(f"rm -f {sock}")


@pytest.mark.sshd
def test_the_unprivileged_user_can_run_the_repo_python_with_torch(sshd_service):
    result = sshd_service.run(
        f"{sshd_service.python} -c 'import torch, potato; print(torch.__version__.split(\"+\")[0])'",
        timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("2.")


# -------------------------------------------------------- fake nvidia-smi

A100 = {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 81920,
        "memory_used": 1024, "memory_free": 80896, "utilization_gpu": 3,
        "pci_bus_id": "00000000:07:00.0", "compute_cap": "8.0"}
T4 = {"index": 1, "name": "Tesla T4", "memory_total": 15360, "memory_used": 15000,
      "memory_free": 360, "utilization_gpu": 97, "pci_bus_id": "00000000:08:00.0",
      "compute_cap": "7.5", "uuid": "GPU-11111111-2222-3333-4444-555555555555"}
QUERY = "--query-gpu=index,name,memory.total,memory.used,memory.free,utilization.gpu"


@pytest.mark.sshd
def test_no_nvidia_smi_without_fake_gpus(sshd_service):
    result = sshd_service.run("command -v nvidia-smi")
    assert result.returncode == 1


@pytest.mark.sshd
def test_fake_nvidia_smi_over_ssh(sshd_service, fake_gpus):
    fake_gpus([A100, T4])
    result = sshd_service.run(f"nvidia-smi {QUERY},uuid,compute_cap --format=csv,noheader,nounits")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("0, NVIDIA A100-SXM4-80GB, 81920, 1024, 80896, 3, GPU-")
    assert lines[0].endswith(", 8.0")
    assert lines[1] == ("1, Tesla T4, 15360, 15000, 360, 97, "
                        "GPU-11111111-2222-3333-4444-555555555555, 7.5")
    # Login shells (/etc/profile resets PATH) find it too.
    login = sshd_service.run(f"bash -lc 'nvidia-smi {QUERY} --format=csv,noheader,nounits'")
    assert login.stdout == ("0, NVIDIA A100-SXM4-80GB, 81920, 1024, 80896, 3\n"
                            "1, Tesla T4, 15360, 15000, 360, 97\n")


@pytest.mark.sshd
def test_fake_nvidia_smi_with_units_and_header(sshd_service, fake_gpus):
    fake_gpus([A100])
    result = sshd_service.run("nvidia-smi --query-gpu=index,memory.free,utilization.gpu "
                              "--format=csv")
    assert result.stdout == ("index, memory.free [MiB], utilization.gpu [%]\n"
                             "0, 80896 MiB, 3 %\n")


@pytest.mark.sshd
def test_fake_nvidia_smi_errors_like_the_real_tool(sshd_service, fake_gpus):
    fake_gpus([A100])
    bad = sshd_service.run("nvidia-smi --query-gpu=index,foo.bar --format=csv,noheader")
    assert (bad.returncode, bad.stdout) == (2, 'Field "foo.bar" is not a valid field to query.\n\n')
    fake_gpus([])
    none = sshd_service.run(f"nvidia-smi {QUERY} --format=csv,noheader,nounits")
    assert (none.returncode, none.stdout) == (6, "No devices were found\n")


# ----------------------------------------------------------------- SLURM


def _job_script(body: str) -> str:
    return "#!/bin/bash\n" + textwrap.dedent(body)


def _submit_over_ssh(sshd_service, slurm_service, name, script, *flags):
    job_dir = slurm_service.shared_dir / f"{name}-{secrets.token_hex(4)}"
    mk = sshd_service.run(f"mkdir -p {job_dir} && cat > {job_dir}/job.sh",
                          input=script)
    assert mk.returncode == 0, mk.stderr
    sub = sshd_service.run(
        f"cd {job_dir} && sbatch --parsable --output={job_dir}/slurm.out "
        f"{' '.join(flags)} job.sh")
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    assert job_id.isdigit(), sub.stdout
    return job_id, job_dir


def _squeue_state(sshd_service, job_id):
    result = sshd_service.run(f"squeue -h -j {job_id} -o '%T %r %N'")
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.sshd
@pytest.mark.slurm
def test_sbatch_over_ssh_runs_then_leaves_the_queue(sshd_service, slurm_service):
    job_id, job_dir = _submit_over_ssh(sshd_service, slurm_service, "smoke", _job_script("""\
        echo "user=$(whoami) cwd=$(pwd)"
        while [ ! -e go ]; do sleep 0.1; done
        echo finished
        """))
    state = _wait_for(lambda: _squeue_state(sshd_service, job_id).startswith("RUNNING")
                      and _squeue_state(sshd_service, job_id), f"job {job_id} RUNNING")
    assert state == f"RUNNING None {slurm_service.node}"
    assert sshd_service.run(f"touch {job_dir}/go").returncode == 0
    _wait_for(lambda: _squeue_state(sshd_service, job_id) == "", f"job {job_id} to leave squeue")
    out = sshd_service.run(f"cat {job_dir}/slurm.out").stdout
    assert out == f"user=potatotest cwd={job_dir}\nfinished\n"
    show = sshd_service.run(f"scontrol show job {job_id}")
    assert "JobState=COMPLETED Reason=None" in show.stdout
    assert "ExitCode=0:0" in show.stdout


@pytest.mark.sshd
@pytest.mark.slurm
def test_gres_gpu_jobs_get_cuda_visible_devices(sshd_service, slurm_service):
    script = _job_script('echo "CVD=${CUDA_VISIBLE_DEVICES-unset}"\n')
    with_gpu, d1 = _submit_over_ssh(sshd_service, slurm_service, "gpu", script, "--gres=gpu:1")
    without, d2 = _submit_over_ssh(sshd_service, slurm_service, "cpu", script)
    for job_id in (with_gpu, without):
        _wait_for(lambda: _squeue_state(sshd_service, job_id) == "", f"job {job_id} to finish")
    assert sshd_service.run(f"cat {d1}/slurm.out").stdout in ("CVD=0\n", "CVD=1\n")
    assert sshd_service.run(f"cat {d2}/slurm.out").stdout == "CVD=unset\n"


@pytest.mark.sshd
@pytest.mark.slurm
def test_asking_for_more_gpus_than_exist_is_refused(sshd_service, slurm_service):
    result = sshd_service.run(f"cd {slurm_service.shared_dir} && "
                              "sbatch --gres=gpu:3 --wrap=true")
    assert result.returncode == 1
    assert result.stderr.strip() == ("sbatch: error: Batch job submission failed: "
                                     "Requested node configuration is not available")


@pytest.mark.sshd
@pytest.mark.slurm
def test_urgent_partition_preempts_debug_and_requeue(sshd_service, slurm_service):
    d = slurm_service.shared_dir

    def submit(partition, cpus):
        result = sshd_service.run(
            f"cd {d} && sbatch --parsable -p {partition} -c {cpus} "
            f"-o {d}/{partition}-%j.out --open-mode=append --wrap='sleep 300'")
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    def state(job_id):
        return sshd_service.run(f"squeue -h -t all -j {job_id} -o '%T %r'").stdout.strip()

    jobs = []
    try:
        low = submit("debug", 1)          # PreemptMode=CANCEL
        jobs.append(low)
        requeued = submit("requeue", 1)   # PreemptMode=REQUEUE
        jobs.append(requeued)
        _wait_for(lambda: state(low) == "RUNNING None" and state(requeued) == "RUNNING None",
                  "both low-tier jobs RUNNING")
        high = submit("urgent", 2)        # needs both CPUs: preempts the two
        jobs.append(high)
        _wait_for(lambda: state(high) == "RUNNING None", "the urgent job RUNNING")
        assert state(low) == "PREEMPTED None"
        assert state(requeued) == "PENDING BeginTime"
        out = sshd_service.run(f"cat {d}/debug-{low}.out").stdout
        assert out.startswith(f"slurmstepd-{slurm_service.node}: error: *** JOB {low} ON "
                              f"{slurm_service.node} CANCELLED AT ")
        assert out.endswith(" DUE TO PREEMPTION ***\n")
    finally:
        slurm_service.run("scancel", *jobs)
        slurm_service.wait_idle()


@pytest.mark.slurm
def test_sinfo_lists_the_partitions_and_gres(slurm_service):
    result = slurm_service.run("sinfo", "-h", "-o", "%P %G %D")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "debug* gpu:2 1\nrequeue gpu:2 1\nurgent gpu:2 1\n"


@pytest.mark.sshd
def test_plain_ssh_alias_after_ssh_user_config(sshd_service, ssh_user_config):
    argv = ["ssh", ssh_user_config, "whoami"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                            stdin=subprocess.DEVNULL)
    assert (result.returncode, result.stdout) == (0, "potatotest\n")
