"""The training agent: claims a job from the annotation server, runs the worker, reports back.

Two ways to start it:

* by an ssh run, on the GPU host (SPEC §5):
  ``python -m potato.training.agent --socket /tmp/potato-….sock --backend gpu-server``
  in the run's job directory, with the run's token as the first line of
  standard input (never on the command line: every account on a shared
  server can read command lines). The socket is the ssh reverse forward to
  the server. When standard input closes, the ssh connection is gone: the
  agent stops its worker and exits, so nothing outlives the run.
* by hand, on a machine the server cannot reach (SPEC §7):
  ``potato training agent --server URL --backend NAME`` polls for jobs.

It speaks the protocol of docs/agent-protocol.md. Part of the remote half:
Python 3.8, standard library only.
"""

import argparse
import hashlib
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from potato.training.events import read_events

PREFIX = "/training/agent/v1"
POST_INTERVAL_S = 0.5       # new events wait at most this long before they are posted
HEARTBEAT_INTERVAL_S = 5.0  # an empty batch when the worker is quiet
UNREACHABLE_LIMIT_S = 300   # SPEC §7: cancel the run after this long without the server
DOWNLOAD_ATTEMPTS = 5       # SPEC §7: an interrupted download resumes up to 5 times
DEFAULT_GRACE_S = 20
CHUNK = 1024 * 1024


class ProtocolError(Exception):
    """The server refused a request; the message is the server's own error text."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Unreachable(Exception):
    """The server could not be reached at all."""


def log(message: str) -> None:
    """One line on stderr (the server keeps it as agent.log); never fail over a closed pipe."""
    line = "{} potato-agent: {}\n".format(time.strftime("%H:%M:%S"), message)
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


# ------------------------------------------------------------------ HTTP


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._unix_path)
        self.sock = sock


class Client:
    """The protocol's HTTP client, over a URL or a UNIX socket."""

    def __init__(self, token: str, server: Optional[str] = None, unix_socket: Optional[str] = None,
                 timeout: float = 60.0):
        if not token:
            raise ValueError("no token")
        self.token = token
        self.unix_socket = unix_socket
        self.timeout = timeout
        parts = urlsplit(server or "http://localhost")
        self.scheme = parts.scheme or "http"
        self.netloc = parts.netloc
        self.base_path = parts.path.rstrip("/")

    def _connection(self) -> http.client.HTTPConnection:
        if self.unix_socket:
            return _UnixConnection(self.unix_socket, self.timeout)
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.netloc, timeout=self.timeout)
        return http.client.HTTPConnection(self.netloc, timeout=self.timeout)

    def request(self, method: str, path: str, body: Any = None, headers: Optional[Dict[str, str]] = None,
                into: Any = None) -> Tuple[int, Dict[str, str], bytes]:
        """Send one request; with *into* (a file), stream a 2xx answer's body there."""
        all_headers = {"Authorization": "Bearer " + self.token, "User-Agent": "potato-agent"}
        all_headers.update(headers or {})
        conn = self._connection()
        try:
            conn.request(method, self.base_path + path, body=body, headers=all_headers)
            response = conn.getresponse()
            answer_headers = {k.lower(): v for k, v in response.getheaders()}
            if into is not None and 200 <= response.status < 300:
                while True:
                    chunk = response.read(CHUNK)
                    if not chunk:
                        break
                    into.write(chunk)
                return response.status, answer_headers, b""
            return response.status, answer_headers, response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise Unreachable("{}: {}".format(type(exc).__name__, exc)) from exc
        finally:
            conn.close()

    def json(self, method: str, path: str, obj: Any = None) -> Dict[str, Any]:
        body = None if obj is None else json.dumps(obj).encode("utf-8")
        headers = {"Content-Type": "application/json"} if body is not None else {}
        status, _, data = self.request(method, path, body, headers)
        try:
            answer = json.loads(data.decode("utf-8")) if data else {}
        except ValueError:
            answer = {"error": data[:300].decode("utf-8", "replace")}
        if status >= 400:
            raise ProtocolError(status, str(answer.get("error") or "HTTP {}".format(status)))
        return answer

    def download(self, path: str, dest: str, sha256: Optional[str] = None) -> None:
        """Download *path* to *dest*, resuming with ``Range`` after an interruption (5 tries)."""
        attempt = 0
        while True:
            have = os.path.getsize(dest) if os.path.exists(dest) else 0
            headers = {"Range": "bytes={}-".format(have)} if have else {}
            try:
                with open(dest, "ab") as out:
                    status, _, data = self.request("GET", path, headers=headers, into=out)
                if status == 416:  # we already have it all
                    break
                if status >= 400:
                    raise ProtocolError(status, data.decode("utf-8", "replace")[:300])
                if have and status == 200:  # the server ignored Range: start over
                    with open(dest, "rb+") as fh:
                        fh.seek(0)
                        content = fh.read()[have:]
                        fh.seek(0)
                        fh.write(content)
                        fh.truncate()
                break
            except Unreachable as exc:
                attempt += 1
                if attempt > DOWNLOAD_ATTEMPTS:
                    raise
                log("bundle download interrupted ({}); resuming, try {} of {}".format(exc, attempt, DOWNLOAD_ATTEMPTS))
                time.sleep(min(2 ** attempt, 10))
        if sha256 and _sha256(dest) != sha256:
            raise ProtocolError(0, "the bundle's checksum does not match what the server announced")

    def upload(self, path: str, source: str) -> Dict[str, Any]:
        size = os.path.getsize(source)
        with open(source, "rb") as fh:
            status, _, data = self.request("PUT", path, body=fh, headers={
                "Content-Type": "application/x-ndjson", "Content-Length": str(size)})
        answer = json.loads(data.decode("utf-8")) if data else {}
        if status >= 400:
            raise ProtocolError(status, str(answer.get("error") or "HTTP {}".format(status)))
        return answer


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _extract(archive: str, dest: str) -> None:
    """Unpack the bundle, refusing members that would land outside *dest*."""
    root = os.path.realpath(dest)
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            target = os.path.realpath(os.path.join(root, member.name))
            if not (target == root or target.startswith(root + os.sep)) or member.issym() or member.islnk():
                raise ProtocolError(0, "the bundle holds an unsafe member: {!r}".format(member.name))
        tar.extractall(root)


# ------------------------------------------------------------------ one job


class Worker:
    """The worker as a process of this machine, in its own process group."""

    def __init__(self, python: str, job_dir: str):
        self.job_dir = job_dir
        self.log_file = open(os.path.join(job_dir, "worker.log"), "ab")
        self.process = subprocess.Popen(
            [python, "-m", "potato.training.worker", job_dir],
            cwd=job_dir, stdin=subprocess.DEVNULL, stdout=self.log_file, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        # So that the server's clean-up can end the worker's group even if this agent dies.
        with open(os.path.join(job_dir, "worker.pid"), "w") as fh:
            fh.write("{}\n".format(self.process.pid))
        log("worker started (pid {})".format(self.process.pid))

    def poll(self) -> Optional[int]:
        code = self.process.poll()
        # exit_code is written last; the interpreter's teardown need not be waited for.
        return code if code is not None else _exit_code(self.job_dir)

    def terminate(self) -> None:
        self.signal_group(signal.SIGTERM)

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except OSError:
            pass

    def finish(self, wait: float = 10.0) -> None:
        """Let a worker that reported its end exit on its own, then make sure its group is gone."""
        try:
            self.process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
        self.stop(0)

    def stop(self, grace: float) -> int:
        """SIGTERM the worker's group, SIGKILL it after *grace* seconds; return the exit code."""
        if self.process.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log("the worker still ran {:g} s after SIGTERM; sending SIGKILL".format(grace))
        self.signal_group(signal.SIGKILL)  # whatever it started goes too
        code = self.process.wait()
        self.log_file.close()
        return code


class SlurmWorker:
    """The worker as a SLURM job (SPEC §6); its notes to the run log go out with the next post."""

    def __init__(self, slurm_config: Dict[str, Any], job_dir: str, run_id: Any, notes: List[Dict[str, Any]]):
        from potato.training.slurm import SlurmJob

        def note(message: str) -> None:
            log(message)
            notes.append({"type": "log", "level": "info", "message": message})

        self.job = SlurmJob(slurm_config, job_dir, run_id, note)

    def poll(self) -> Optional[int]:
        return self.job.poll()  # raises SlurmCommandError when the scheduler ended the job early

    def terminate(self) -> None:
        self.job.signal_term()

    def stop(self, grace: float) -> int:
        return self.job.stop(grace)

    def finish(self) -> None:
        pass


class JobFailed(Exception):
    """The job ended without the worker's exit code; the message says why."""


def run_job(client: Client, claim: Dict[str, Any], job_dir: str, start: Any, lost: threading.Event) -> int:
    """Run one claimed job in *job_dir*; ``start(job_dir, notes)`` starts the worker. Returns its exit code."""
    run_id = claim["run_id"]
    urls = claim["urls"]
    grace = float(claim.get("grace_seconds") or DEFAULT_GRACE_S)
    os.makedirs(job_dir, exist_ok=True)
    archive = os.path.join(job_dir, "bundle.tar.gz")
    log("run {}: downloading the bundle ({} bytes)".format(run_id, claim.get("bundle_bytes")))
    client.download(claim["bundle_url"], archive, claim.get("bundle_sha256"))
    bundle_dir = os.path.join(job_dir, "bundle")
    os.makedirs(bundle_dir, exist_ok=True)
    _extract(archive, bundle_dir)
    os.remove(archive)
    job = dict(claim["job"], bundle="bundle")
    with open(os.path.join(job_dir, "job.json"), "w", encoding="utf-8") as fh:
        json.dump(job, fh, indent=2)

    pending = []  # type: List[Dict[str, Any]]
    try:
        worker = start(job_dir, pending)
    except Exception as exc:  # e.g. sbatch refused the job
        return _fail(client, claim, run_id, pending, str(exc))
    events_path = os.path.join(job_dir, "events.jsonl")
    offset = 0
    last_contact = time.monotonic()
    last_post = last_contact - POST_INTERVAL_S  # the first events go out at once
    stopping_since = None  # type: Optional[float]
    code = None  # type: Optional[int]
    failure = None  # type: Optional[str]
    while True:
        if lost.is_set():
            log("run {}: the connection to the server is gone, or the agent was told to stop; "
                "stopping the worker".format(run_id))
            code = worker.stop(grace)
            # Tell the server if it can still hear us (an agent stopped by hand), so the run
            # fails now rather than after heartbeat_timeout_s.
            _fail(client, claim, run_id, pending, "The agent on {} was stopped before the worker finished".format(
                socket.gethostname()))
            return code
        try:
            code = worker.poll()
        except Exception as exc:  # the scheduler ended the job before the worker finished
            failure, code = str(exc), 1
        new, offset = read_events(events_path, offset)
        pending.extend(new)
        now = time.monotonic()
        finished = any(e.get("type") == "done" for e in pending)
        due = (pending and (finished or now - last_post >= POST_INTERVAL_S)) or now - last_post >= HEARTBEAT_INTERVAL_S
        if due or code is not None:
            try:
                answer = client.json("POST", urls["events"], {"events": pending[:1000]})
                del pending[:1000]  # in place: the SLURM job appends its notes to this same list
                last_post = last_contact = now
                if answer.get("cancel") and stopping_since is None and code is None:
                    log("run {}: the server asks to stop; SIGTERM to the worker".format(run_id))
                    stopping_since = now
                    worker.terminate()
            except Unreachable as exc:
                if now - last_contact > UNREACHABLE_LIMIT_S:
                    log("run {}: no contact with the server for {} s ({}); cancelling the run".format(
                        run_id, UNREACHABLE_LIMIT_S, exc))
                    return worker.stop(grace)
            except ProtocolError as exc:
                log("run {}: the server refused events: {}".format(run_id, exc))
                if exc.status in (401, 403, 404):
                    return worker.stop(grace)
                del pending[:]
        if stopping_since is not None and code is None and now - stopping_since > grace:
            code = worker.stop(0)
        if code is not None and not pending:
            break
        time.sleep(0.2)
    _report(client, claim, job_dir, code, failure)
    worker.finish()
    return code


def _fail(client: Client, claim: Dict[str, Any], run_id: Any, notes: List[Dict[str, Any]], error: str) -> int:
    log("run {}: {}".format(run_id, error))
    try:
        client.json("POST", claim["urls"]["events"], {"events": notes})
        client.json("POST", claim["urls"]["result"], {"exit_code": 1, "error": error})
    except (ProtocolError, Unreachable) as exc:
        log("run {}: could not report the failure: {}".format(run_id, exc))
    return 1


def _exit_code(job_dir: str) -> Optional[int]:
    try:
        with open(os.path.join(job_dir, "exit_code"), encoding="utf-8") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def _report(client: Client, claim: Dict[str, Any], job_dir: str, code: int, error: Optional[str] = None) -> None:
    urls = claim["urls"]
    predictions = os.path.join(job_dir, "predictions.jsonl")
    if os.path.exists(predictions):
        try:
            client.upload(urls["predictions"], predictions)
        except ProtocolError as exc:
            log("run {}: predictions refused: {}".format(claim["run_id"], exc))
    scores = None
    try:
        with open(os.path.join(job_dir, "scores.json"), encoding="utf-8") as fh:
            scores = json.load(fh)
    except (OSError, ValueError):
        pass
    artifacts = os.path.join(job_dir, "artifacts")
    result = {"exit_code": code, "scores": scores}  # type: Dict[str, Any]
    if error:
        result["error"] = error
    if os.path.isdir(artifacts):
        result["artifact_uri"] = "{}:{}".format(socket.gethostname(), os.path.abspath(artifacts))
    client.json("POST", urls["result"], result)


# ------------------------------------------------------------------ main


def _agent_info(workdir: str) -> Dict[str, str]:
    return {"host": socket.gethostname(), "python": platform.python_version(), "workdir": workdir}


def _watch_stdin(lost: threading.Event) -> None:
    """Standard input closes when the ssh session ends: that is how a dropped connection shows."""
    try:
        while sys.stdin.buffer.read(65536):
            pass
    except (OSError, ValueError):
        pass
    lost.set()


def _starter(args: argparse.Namespace, run_id: Any) -> Any:
    """How this agent starts a job's worker: a process here, or a SLURM job (--slurm-config)."""
    if args.slurm_config:
        with open(args.slurm_config, encoding="utf-8") as fh:
            slurm_config = json.load(fh)
        return lambda job_dir, notes: SlurmWorker(slurm_config, job_dir, run_id, notes)
    python = args.python or sys.executable
    return lambda job_dir, notes: Worker(python, job_dir)


def run_for_ssh(args: argparse.Namespace) -> int:
    token = sys.stdin.readline().strip()
    lost = threading.Event()
    threading.Thread(target=_watch_stdin, args=(lost,), daemon=True).start()
    signal.signal(signal.SIGHUP, lambda *a: lost.set())
    signal.signal(signal.SIGTERM, lambda *a: lost.set())
    client = Client(token, unix_socket=args.socket)
    job_dir = os.path.abspath(args.workdir or os.getcwd())
    with open(os.path.join(job_dir, "agent.pid"), "w") as fh:
        fh.write("{}\n".format(os.getpid()))
    try:
        answer = client.json("POST", "{}/backends/{}/claim".format(PREFIX, args.backend),
                             {"agent": _agent_info(job_dir)})
    except (ProtocolError, Unreachable) as exc:
        log("could not claim the run: {}".format(exc))
        return 2
    claim = answer.get("job")
    if not claim:
        log("the server has no job for this agent")
        return 2
    return run_job(client, claim, job_dir, _starter(args, claim["run_id"]), lost)


def run_polling(args: argparse.Namespace) -> int:
    token = os.environ.get("POTATO_TRAINING_TOKEN", "")
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as fh:
            token = fh.read().strip()
    if not token:
        log("no token: set POTATO_TRAINING_TOKEN or pass --token-file (from `potato training register`)")
        return 2
    workdir = os.path.abspath(os.path.expanduser(args.workdir or "~/.cache/potato-training"))
    client = Client(token, server=args.server)
    # Ctrl-C or SIGTERM: stop the running job's worker (it lives in its own session), then exit.
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *a: stop.set())
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    claim_path = "{}/backends/{}/claim".format(PREFIX, args.backend)
    log("polling {} for jobs of backend {!r}".format(args.server, args.backend))
    while not stop.is_set():
        try:
            answer = client.json("POST", claim_path, {"agent": _agent_info(workdir)})
        except Unreachable as exc:
            log("cannot reach {}: {}; trying again".format(args.server, exc))
            stop.wait(5)
            continue
        except ProtocolError as exc:
            log("the server refused: {}".format(exc))
            return 2
        claim = answer.get("job")
        if not claim:
            stop.wait(float(answer.get("poll_interval_s") or 1.0))
            continue
        job_dir = os.path.join(workdir, "jobs", str(claim["run_id"]))
        shutil.rmtree(job_dir, ignore_errors=True)
        code = run_job(client, claim, job_dir, _starter(args, claim["run_id"]), stop)
        if not args.keep:
            shutil.rmtree(os.path.join(job_dir, "bundle"), ignore_errors=True)
        log("run {}: worker exited with {}".format(claim["run_id"], code))
        if args.once:
            return 0
    log("stopped")
    return 0


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m potato.training.agent")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--socket", help="the server's protocol socket (ssh/slurm runs; token on stdin)")
    parser.add_argument("--server", help="the server's URL (agent backends)")
    parser.add_argument("--token-file")
    parser.add_argument("--python", help="the worker's interpreter (default: this one)")
    parser.add_argument("--workdir")
    parser.add_argument("--once", action="store_true")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--slurm-config", help="submit the worker with sbatch; a JSON object of the slurm keys")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = make_parser().parse_args(argv)
    if args.socket:
        return run_for_ssh(args)
    if args.server:
        return run_polling(args)
    log("give --socket (started by an ssh run) or --server URL")
    return 2


if __name__ == "__main__":
    sys.exit(main())
