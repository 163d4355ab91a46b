"""The training agent: claims a job from the annotation server, runs the worker, reports back.

Two ways to start it:

* by an ssh run, on the GPU host:
  ``python -m potato.training.agent --socket /tmp/potato-….sock --backend gpu-server``
  in the run's job directory, with the run's token as the first line of
  standard input (never on the command line: every account on a shared
  server can read command lines). The socket is the ssh reverse forward to
  the server. When standard input closes, the ssh connection is gone: the
  agent stops its worker and exits, so nothing outlives the run.
* by hand, on a machine the server cannot reach:
  ``potato training agent --server URL --backend NAME`` polls for jobs.

It speaks the protocol of docs/agent-protocol.md (the HTTP side and what
each answer means: ``potato.training.client``). It trusts its server only so
far: a claim is checked field by field before anything acts on it
(``claims``), the bundle is unpacked only as regular files inside the job
directory (``safe_paths``), and the worker (or SLURM job) never sees the
agent's token. A server that is busy or away is waited for, up to the
offline limit, without stopping the worker; a server that says the run is
over for this agent gets the worker stopped at once.

Part of the remote half: Python 3.8, standard library only.
"""

import argparse
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
from typing import Any, Dict, List, Optional

from potato.training.agent_protocol import MAX_EVENTS_PER_BATCH, PREFIX
from potato.training.atomic_files import anonymous_file
from potato.training.claims import BadClaim, check_claim
from potato.training.client import (
    REQUEST_TIMEOUT_S, UNREACHABLE_LIMIT_S, Client, DownloadCut, Link, Offline, ProtocolError, Unreachable, is_gone,
    is_transient,
)
from potato.training.escaping import open_text
from potato.training.events import read_events
from potato.training.job_paths import BUNDLE, JobPaths, read_exit_code
from potato.training.safe_paths import UnsafeName, extract_tar

POST_INTERVAL_S = 0.5       # new events wait at most this long before they are posted
HEARTBEAT_INTERVAL_S = 5.0  # an empty batch when the worker is quiet
DEFAULT_GRACE_S = 20
TOKEN_VARIABLE = "POTATO_TRAINING_TOKEN"


def log(message: str) -> None:
    """One line on stderr (the server keeps it as agent.log); never fail over a closed pipe."""
    line = "{} potato-agent: {}\n".format(time.strftime("%H:%M:%S"), message)
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def worker_environment() -> Dict[str, str]:
    """This agent's environment minus its token: a worker (or a SLURM job) never needs it, so never gets it."""
    return {k: v for k, v in os.environ.items() if k != TOKEN_VARIABLE}


def _extract(archive: str, dest: str) -> None:
    """Unpack the bundle: regular files and directories inside *dest* only (``safe_paths``), else refuse it."""
    with tarfile.open(archive, "r:gz") as tar:
        extract_tar(tar, dest)


# ------------------------------------------------------------------ one job


def _die_with_parent() -> Optional[Any]:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when this agent dies (Linux), else None.

    The worker runs in a session of its own (so that its whole group can be
    signalled); without this an agent killed with -9 would leave it training
    on a machine the server cannot reach, for good.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in the child
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_death_signal() -> None:
        prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the agent died before the line above
            os._exit(1)

    return set_death_signal


class Worker:
    """The worker as a process of this machine, in its own process group; it dies with the agent."""

    def __init__(self, python: str, job_dir: str):
        self.job_dir = job_dir
        self.log_file = open(JobPaths(job_dir).worker_log, "ab")
        self.process = subprocess.Popen(
            [python, "-m", "potato.training.worker", job_dir],
            cwd=job_dir, stdin=subprocess.DEVNULL, stdout=self.log_file, stderr=subprocess.STDOUT,
            start_new_session=True, env=worker_environment(), preexec_fn=_die_with_parent(),
        )
        # So that the server's clean-up can end the worker's group even if this agent dies.
        with open(JobPaths(job_dir).worker_pid, "w") as fh:
            fh.write("{}\n".format(self.process.pid))
        log("worker started (pid {})".format(self.process.pid))

    def poll(self) -> Optional[int]:
        code = self.process.poll()
        # exit_code is written last; the interpreter's teardown need not be waited for.
        return code if code is not None else read_exit_code(self.job_dir)

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
    """The worker as a SLURM job; its notes to the run log go out with the next post."""

    def __init__(self, slurm_config: Dict[str, Any], job_dir: str, run_id: Any, notes: List[Dict[str, Any]]):
        from potato.training.slurm import SlurmJob

        def note(message: str) -> None:
            log(message)
            notes.append({"type": "log", "level": "info", "message": message})

        self.job = SlurmJob(slurm_config, job_dir, run_id, note, env=worker_environment())

    def poll(self) -> Optional[int]:
        return self.job.poll()  # raises SlurmCommandError when the scheduler ended the job early

    def terminate(self) -> None:
        self.job.signal_term()

    def stop(self, grace: float) -> int:
        return self.job.stop(grace)

    def finish(self) -> None:
        pass


def run_job(client: Client, claim: Dict[str, Any], job_dir: str, start: Any, lost: threading.Event,
            offline_limit: float = UNREACHABLE_LIMIT_S) -> int:
    """Run one checked claim in *job_dir*; ``start(job_dir, notes)`` starts the worker. Returns its exit code.

    Past *offline_limit* seconds without the server the worker is stopped.
    """
    link = Link(offline_limit)
    try:
        _fetch_bundle(client, claim, job_dir)
    except (ProtocolError, Unreachable, DownloadCut, UnsafeName, tarfile.TarError, OSError, EOFError) as exc:
        said = (ProtocolError, DownloadCut, UnsafeName)
        why = str(exc) if isinstance(exc, said) else "{}: {}".format(type(exc).__name__, exc)
        return _fail(client, link, claim, [], "The agent on {} could not get the run's bundle: {}".format(
            socket.gethostname(), why))
    pending = []  # type: List[Dict[str, Any]]
    try:
        worker = start(job_dir, pending)
    except Exception as exc:  # e.g. sbatch refused the job
        return _fail(client, link, claim, pending, str(exc))
    return _relay(client, link, claim, job_dir, worker, pending, lost)


def _fetch_bundle(client: Client, claim: Dict[str, Any], job_dir: str) -> None:
    """Download the bundle into *job_dir*, unpack it into ``bundle/`` and write ``job.json``."""
    os.makedirs(job_dir, exist_ok=True)
    paths = JobPaths(job_dir)
    archive = paths.bundle_archive
    log("run {}: downloading the bundle ({} bytes)".format(claim["run_id"], claim.get("bundle_bytes")))
    client.download(claim["bundle_url"], archive, claim.get("bundle_sha256"), log=log)
    os.makedirs(paths.bundle, exist_ok=True)
    _extract(archive, paths.bundle)
    os.remove(archive)
    job = dict(claim["job"], bundle=BUNDLE)
    with open_text(paths.job) as fh:
        json.dump(job, fh, indent=2)


def _relay(client: Client, link: Link, claim: Dict[str, Any], job_dir: str, worker: Any,
           pending: List[Dict[str, Any]], lost: threading.Event) -> int:
    """Post the worker's events until it has ended and all are sent; then report. Returns its exit code."""
    run_id, urls = claim["run_id"], claim["urls"]
    grace = claim.get("grace_seconds")
    grace = DEFAULT_GRACE_S if grace is None else float(grace)
    events_path = JobPaths(job_dir).events
    offset = 0
    last_post = time.monotonic() - POST_INTERVAL_S  # the first events go out at once
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
            _fail(client, None, claim, pending, "The agent on {} was stopped before the worker finished".format(
                socket.gethostname()))
            return code
        if code is None:
            try:
                code = worker.poll()
            except Exception as exc:  # the scheduler ended the job before the worker finished
                failure, code = str(exc), 1
        new, offset = read_events(events_path, offset)
        pending.extend(new)
        now = time.monotonic()
        finished = code is not None or any(e.get("type") == "done" for e in pending)
        due = (pending and (finished or now - last_post >= POST_INTERVAL_S)) or now - last_post >= HEARTBEAT_INTERVAL_S
        if (due or code is not None) and link.due():
            batch = pending[:MAX_EVENTS_PER_BATCH]
            try:
                answer = client.json("POST", urls["events"], {"events": batch})
            except (ProtocolError, Unreachable) as exc:
                if is_transient(exc):
                    if _offline_after(link, exc, run_id, len(pending)):
                        return worker.stop(grace)
                elif is_gone(exc):
                    log("run {}: the server says the run is over for this agent ({} {}); stopping the "
                        "worker".format(run_id, exc.status, exc))
                    return worker.stop(grace)
                else:
                    link.reached()
                    pending[:len(batch)] = _after_refusal(run_id, batch, exc)
            else:
                link.reached()
                del pending[:len(batch)]  # in place: the SLURM job appends its notes to this same list
                last_post = now
                if answer.get("cancel") and stopping_since is None and code is None:
                    log("run {}: the server asks to stop; SIGTERM to the worker".format(run_id))
                    stopping_since = now
                    worker.terminate()
        if stopping_since is not None and code is None and now - stopping_since > grace:
            code = worker.stop(0)
        if code is not None and not pending:
            break
        time.sleep(0.2)
    try:
        _report(client, link, claim, job_dir, code, failure)
    except (Offline, ProtocolError) as exc:
        log("run {}: could not report the result: {}".format(run_id, exc))
    worker.finish()
    return code


def _offline_after(link: Link, exc: Exception, run_id: int, kept: int) -> bool:
    """Note a post that transient trouble failed; True once the server has been silent past the offline limit."""
    wait = link.missed(exc)
    if link.offline():
        log("run {}: no contact with the server for {:g} s ({}); stopping the worker".format(
            run_id, link.limit_s, exc))
        return True
    if link.failures == 1:
        log("run {}: the server did not take events ({}); keeping {} of them, trying again".format(run_id, exc, kept))
    else:
        log("run {}: still no answer ({}); next try in {:g} s".format(run_id, exc, wait))
    return False


def _after_refusal(run_id: int, batch: List[Dict[str, Any]], exc: ProtocolError) -> List[Dict[str, Any]]:
    """What of a refused batch to post again.

    A 400 names the bad event (``seq``) and how far the run's events are stored
    (``last_seq``): the events before the bad one were stored, so they and the
    bad one are dropped (the drop is logged) and the rest sent again. A refusal
    that names no event drops the batch: sending it again cannot succeed.
    """
    bad, stored = exc.answer.get("seq"), exc.answer.get("last_seq")
    position = next((i for i, e in enumerate(batch) if bad is not None and e.get("seq") == bad), None)
    if exc.status != 400 or position is None:
        log("run {}: the server refused {} events ({} {}); dropping them".format(run_id, len(batch), exc.status, exc))
        return []
    log("run {}: the server refused event {} ({}); dropping it and sending the rest again".format(run_id, bad, exc))
    rest = batch[position + 1:]
    if isinstance(stored, int):
        rest = [e for e in rest if not (isinstance(e.get("seq"), int) and e["seq"] <= stored)]
    return rest


def _fail(client: Client, link: Optional[Link], claim: Dict[str, Any], notes: List[Dict[str, Any]],
          error: str) -> int:
    """Report a job that ends before its worker could: its notes, then the result (exit code 1).

    With *link*, transient trouble is retried up to the offline limit; without, one try (the agent is going).
    """
    run_id, urls = claim["run_id"], claim["urls"]
    log("run {}: {}".format(run_id, error))
    try:
        for path, body in ((urls["events"], {"events": notes[:MAX_EVENTS_PER_BATCH]}),
                           (urls["result"], {"exit_code": 1, "error": error})):
            if link is None:
                client.json("POST", path, body)
            else:
                link.call(lambda: client.json("POST", path, body))
    except (ProtocolError, Unreachable, Offline) as exc:
        log("run {}: could not report the failure: {}".format(run_id, exc))
    return 1


def _report(client: Client, link: Link, claim: Dict[str, Any], job_dir: str, code: int,
            error: Optional[str] = None) -> None:
    """Upload the predictions, then post the result; transient trouble is retried up to the offline limit."""
    urls = claim["urls"]
    paths = JobPaths(job_dir)
    predictions = paths.predictions
    if os.path.exists(predictions):
        try:
            link.call(lambda: client.upload(urls["predictions"], predictions))
        except ProtocolError as exc:
            if is_gone(exc):
                raise
            log("run {}: predictions refused: {}".format(claim["run_id"], exc))
            # The run must not pass for a success whose predictions the server does not have.
            code, error = code or 1, "The server did not take the run's predictions: {}".format(exc)
    scores = None
    try:
        with open(paths.scores, encoding="utf-8") as fh:
            scores = json.load(fh)
    except (OSError, ValueError):
        pass
    artifacts = paths.artifacts
    result = {"exit_code": code, "scores": scores}  # type: Dict[str, Any]
    if error:
        result["error"] = error
    if os.path.isdir(artifacts):
        result["artifact_uri"] = "{}:{}".format(socket.gethostname(), os.path.abspath(artifacts))
    link.call(lambda: client.json("POST", urls["result"], result))


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


def _starter(args: argparse.Namespace, run_id: int) -> Any:
    """How this agent starts a job's worker: a process here, or a SLURM job (--slurm-config)."""
    if args.slurm_config:
        with open(args.slurm_config, encoding="utf-8") as fh:
            slurm_config = json.load(fh)
        return lambda job_dir, notes: SlurmWorker(slurm_config, job_dir, run_id, notes)
    python = args.python or sys.executable
    return lambda job_dir, notes: Worker(python, job_dir)


def _refuse(client: Client, exc: BadClaim) -> bool:
    """Log a job this agent will not take; fail its run on the server when the claim says which. Reported?"""
    log("the server sent a job this agent will not take: {}".format(exc))
    if exc.run_id is None:
        return False
    _fail(client, Link(), {"run_id": exc.run_id, "urls": exc.urls}, [],
          "The agent on {} refused the job: {}".format(socket.gethostname(), exc))
    return True


def run_for_ssh(args: argparse.Namespace) -> int:
    token = sys.stdin.readline().strip()
    lost = threading.Event()
    threading.Thread(target=_watch_stdin, args=(lost,), daemon=True).start()
    signal.signal(signal.SIGHUP, lambda *a: lost.set())
    signal.signal(signal.SIGTERM, lambda *a: lost.set())
    client = Client(token, unix_socket=args.socket)
    job_dir = os.path.abspath(args.workdir or os.getcwd())
    with open(JobPaths(job_dir).agent_pid, "w") as fh:
        fh.write("{}\n".format(os.getpid()))
    claim_path = "{}/backends/{}/claim".format(PREFIX, args.backend)
    try:
        answer = Link().call(lambda: client.json("POST", claim_path, {"agent": _agent_info(job_dir)}), stop=lost)
    except (ProtocolError, Offline) as exc:
        log("could not claim the run: {}".format(exc))
        return 2
    if not answer.get("job"):
        log("the server has no job for this agent")
        return 2
    try:
        claim = check_claim(answer["job"])
    except BadClaim as exc:
        _refuse(client, exc)
        return 2
    return run_job(client, claim, job_dir, _starter(args, claim["run_id"]), lost)


def run_polling(args: argparse.Namespace) -> int:
    token = os.environ.get(TOKEN_VARIABLE, "")
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as fh:
            token = fh.read().strip()
    if not token:
        log("no token: set {} or pass --token-file (from `potato training register`)".format(TOKEN_VARIABLE))
        return 2
    workdir = os.path.abspath(os.path.expanduser(args.workdir or "~/.cache/potato-training"))
    problem = _unwritable(workdir)
    if problem:
        # Said before the first claim: a job claimed into a directory it cannot write would fail a run.
        log("cannot use --workdir {}: {}. Fix: pass --workdir a directory this user can create and "
            "write to (e.g. --workdir ~/potato-training)".format(workdir, problem))
        return 2
    # A request may not hang longer than the offline limit: a black-holed link must show as offline in time.
    client = Client(token, server=args.server, timeout=min(REQUEST_TIMEOUT_S, args.offline_limit))
    # Ctrl-C or SIGTERM: stop the running job's worker (it lives in its own session), then exit.
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *a: stop.set())
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    claim_path = "{}/backends/{}/claim".format(PREFIX, args.backend)
    link = Link(limit_s=float("inf"))  # between jobs, wait for the server as long as it takes
    log("polling {} for jobs of backend {!r}".format(args.server, args.backend))
    while not stop.is_set():
        try:
            answer = link.call(lambda: client.json("POST", claim_path, {"agent": _agent_info(workdir)}), stop=stop)
        except Offline:
            break  # stopped while the server was away
        except ProtocolError as exc:
            log("the server refused: {}".format(exc))
            return 2
        if not answer.get("job"):
            stop.wait(_poll_interval(answer))
            continue
        try:
            claim = check_claim(answer["job"])
        except BadClaim as exc:
            if not _refuse(client, exc):
                return 2  # not even a run to report on: this server does not speak the protocol
            if args.once:
                return 0
            continue
        job_dir = os.path.join(workdir, "jobs", str(claim["run_id"]))
        _remove(job_dir)
        code = run_job(client, claim, job_dir, _starter(args, claim["run_id"]), stop, args.offline_limit)
        if not args.keep:
            shutil.rmtree(JobPaths(job_dir).bundle, ignore_errors=True)
        log("run {}: worker exited with {}".format(claim["run_id"], code))
        if args.once:
            return 0
    log("stopped")
    return 0


def _unwritable(workdir: str) -> Optional[str]:
    """Why this user cannot keep jobs in ``workdir`` (created if missing), or None."""
    try:
        os.makedirs(workdir, exist_ok=True)
        with anonymous_file(workdir):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _poll_interval(answer: Dict[str, Any]) -> float:
    value = answer.get("poll_interval_s")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0.1 <= value <= 60:
        return float(value)
    return 1.0


def _remove(path: str) -> None:
    """Remove an earlier job's directory; a symlink planted in its place goes, never what it points to."""
    if os.path.islink(path):
        os.unlink(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


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
    parser.add_argument("--offline-limit", type=_seconds, default=UNREACHABLE_LIMIT_S, metavar="SECONDS",
                        help="stop a job's worker after this long without the server (default %(default)s)")
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError("{!r} is not a number of seconds above 0".format(text))
    return value


def main(argv: Optional[List[str]] = None) -> int:
    args = make_parser().parse_args(argv)
    os.umask(0o077)  # the job's bundle (the annotators' labels), model and predictions are the account's only
    if args.socket:
        code = run_for_ssh(args)
        # The stdin watcher is blocked in a read: interpreter shutdown would abort on the stdin
        # buffer's lock ("Fatal Python error: _enter_buffered_busy"), so leave without it.
        sys.stderr.flush()
        os._exit(code)
    if args.server:
        return run_polling(args)
    log("give --socket (started by an ssh run) or --server URL")
    return 2


if __name__ == "__main__":
    sys.exit(main())
