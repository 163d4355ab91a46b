"""The agent protocol's HTTP client, and what each answer means to an agent.

The server's answers fall in three groups (docs/agent-protocol.md):

* **transient** — no connection, 429, 500, 502, 503 (the store is busy; it
  sends ``Retry-After``), 504: try again later. The agent keeps what it has
  not sent, backs off (1, 2, 4 … 30 s, or ``Retry-After``), and counts the
  time toward its offline limit (300 s). It never stops a worker
  over them: the server may simply be restarting.
* **gone** — 401, 403, 404, 409, 410: this run is over for this agent (a run
  token is valid only while its run is running). The agent stops its worker.
* anything else is a refusal of that one request (e.g. 400, 413), which the
  caller handles.

Part of the remote half: Python 3.8, standard library only.
"""

import hashlib
import http.client
import json
import os
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple, TypeVar
from urllib.parse import urlsplit

CHUNK = 1024 * 1024
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
GONE_STATUSES = frozenset({401, 403, 404, 409, 410})
UNREACHABLE_LIMIT_S = 300   # the agent cancels the run after this long without the server
MAX_BACKOFF_S = 30.0
MAX_RETRY_AFTER_S = 60.0
REQUEST_TIMEOUT_S = 60.0
DOWNLOAD_RESUMES = 5        # an interrupted download resumes up to 5 times
RESUME_WAITS_S = (1, 2, 4, 4, 4)

T = TypeVar("T")


class ProtocolError(Exception):
    """The server refused a request; the message is the server's own error text."""

    def __init__(self, status: int, message: str, answer: Optional[Dict[str, Any]] = None,
                 retry_after: Optional[float] = None):
        super().__init__(message)
        self.status = status
        self.answer = answer or {}
        self.retry_after = retry_after


class Unreachable(Exception):
    """The server could not be reached at all."""


class Offline(Exception):
    """The server has not answered for longer than the offline limit."""


class DownloadCut(Exception):
    """A download was cut off more often than it may be resumed."""

    def __init__(self, cuts: int, last: BaseException):
        super().__init__("the download was cut off {} times (the agent resumes it at most {} times); the last "
                         "time: {}".format(cuts, DOWNLOAD_RESUMES, last))


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, Unreachable) or (isinstance(exc, ProtocolError) and exc.status in TRANSIENT_STATUSES)


def is_gone(exc: BaseException) -> bool:
    return isinstance(exc, ProtocolError) and exc.status in GONE_STATUSES


def _retry_after(headers: Dict[str, str]) -> Optional[float]:
    try:
        return min(max(float(headers.get("retry-after", "")), 0.0), MAX_RETRY_AFTER_S)
    except ValueError:
        return None  # absent, or an HTTP date: back off on our own schedule


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
                 timeout: float = REQUEST_TIMEOUT_S):
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
                sink: Optional[Callable[[int, Dict[str, str]], Any]] = None) -> Tuple[int, Dict[str, str], bytes]:
        """Send one request; with *sink*, stream a 2xx answer's body into the file ``sink(status, headers)`` opens.

        A streamed body that ends before its ``Content-Length`` raises
        ``Unreachable``: a connection cut part-way must not pass for a whole answer
        (``http.client`` ends such a read quietly).
        """
        all_headers = {"Authorization": "Bearer " + self.token, "User-Agent": "potato-agent"}
        all_headers.update(headers or {})
        conn = self._connection()
        try:
            conn.request(method, self.base_path + path, body=body, headers=all_headers)
            response = conn.getresponse()
            answer_headers = {k.lower(): v for k, v in response.getheaders()}
            if sink is not None and 200 <= response.status < 300:
                expected = _content_length(answer_headers)
                received = 0
                with sink(response.status, answer_headers) as out:
                    while True:
                        chunk = response.read(CHUNK)
                        if not chunk:
                            break
                        out.write(chunk)
                        received += len(chunk)
                if expected is not None and received < expected:
                    raise Unreachable("the connection closed after {} of {} bytes".format(received, expected))
                return response.status, answer_headers, b""
            return response.status, answer_headers, response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise Unreachable("{}: {}".format(type(exc).__name__, exc)) from exc
        finally:
            conn.close()

    def json(self, method: str, path: str, obj: Any = None) -> Dict[str, Any]:
        body = None if obj is None else json.dumps(obj).encode("utf-8")
        headers = {"Content-Type": "application/json"} if body is not None else {}
        return _answer(*self.request(method, path, body, headers))

    def download(self, path: str, dest: str, sha256: Optional[str] = None,
                 log: Callable[[str], None] = lambda message: None) -> None:
        """Download *path* to *dest*; a cut download resumes where it stopped (``Range``), up to 5 times.

        Raises ``DownloadCut`` on the sixth cut, ``ProtocolError`` when the
        server refuses, or when the whole file does not match *sha256*.
        """
        cuts = 0
        while True:
            have = os.path.getsize(dest) if os.path.exists(dest) else 0

            def sink(status: int, headers: Dict[str, str]) -> Any:
                # 206 continues the file; a 200 (the server ignored Range) starts it over.
                return open(dest, "ab" if status == 206 and _range_start(headers) == have else "wb")

            try:
                status, answer_headers, data = self.request(
                    "GET", path, headers={"Range": "bytes={}-".format(have)} if have else {}, sink=sink)
                if status == 416:  # we already have it all; the checksum says whether it is right
                    break
                _answer(status, answer_headers, data)
                break
            except (Unreachable, ProtocolError) as exc:
                if not is_transient(exc):
                    raise
                cuts += 1
                if cuts > DOWNLOAD_RESUMES:
                    raise DownloadCut(cuts, exc) from exc
                wait = RESUME_WAITS_S[cuts - 1]
                log("bundle download interrupted ({}); resuming in {:g} s, try {} of {}".format(
                    exc, wait, cuts, DOWNLOAD_RESUMES))
                time.sleep(wait)
        if sha256 and _sha256(dest) != sha256:
            raise ProtocolError(0, "the bundle's checksum does not match what the server announced")

    def upload(self, path: str, source: str) -> Dict[str, Any]:
        size = os.path.getsize(source)
        with open(source, "rb") as fh:
            return _answer(*self.request("PUT", path, body=fh, headers={
                "Content-Type": "application/x-ndjson", "Content-Length": str(size)}))


def _answer(status: int, headers: Dict[str, str], data: bytes) -> Dict[str, Any]:
    """The JSON answer of a 2xx; a ``ProtocolError`` carrying the server's error otherwise."""
    try:
        answer = json.loads(data.decode("utf-8")) if data else {}
    except ValueError:
        answer = {"error": data[:300].decode("utf-8", "replace")}
    if not isinstance(answer, dict):
        answer = {"error": "the server answered {!r}".format(answer)[:300]}
    if status >= 400:
        raise ProtocolError(status, str(answer.get("error") or "HTTP {}".format(status)), answer,
                            _retry_after(headers))
    return answer


def _content_length(headers: Dict[str, str]) -> Optional[int]:
    value = headers.get("content-length", "")
    return int(value) if value.isdigit() else None


def _range_start(headers: Dict[str, str]) -> Optional[int]:
    """Where a 206 answer's ``Content-Range: bytes START-END/TOTAL`` starts."""
    unit, _, spec = headers.get("content-range", "").partition(" ")
    start = spec.partition("-")[0]
    return int(start) if unit == "bytes" and start.isdigit() else None


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


class Link:
    """How the agent stands with the server: when it last answered, and when to try it again.

    ``reached()`` after every answer; ``missed(exc)`` after transient trouble,
    which returns how long to wait (``Retry-After``, else 1, 2, 4 … 30 s).
    ``offline()`` says when the server has been silent past the limit.
    """

    def __init__(self, limit_s: float = UNREACHABLE_LIMIT_S, clock: Callable[[], float] = time.monotonic):
        self.limit_s = limit_s
        self.clock = clock
        self.last_contact = clock()
        self.failures = 0
        self.next_try = 0.0

    def reached(self) -> None:
        self.last_contact = self.clock()
        self.failures = 0
        self.next_try = 0.0

    def missed(self, exc: BaseException) -> float:
        self.failures += 1
        wait = getattr(exc, "retry_after", None)
        if wait is None:
            wait = min(2.0 ** (self.failures - 1), MAX_BACKOFF_S)
        self.next_try = self.clock() + wait
        return wait

    def due(self) -> bool:
        return self.clock() >= self.next_try

    def offline(self) -> bool:
        return self.clock() - self.last_contact > self.limit_s

    def call(self, request: Callable[[], T], stop: Optional[threading.Event] = None) -> T:
        """*request()* until it gets an answer; transient trouble is retried until the offline limit.

        Raises ``Offline`` past the limit (or at once when *stop* is set), and
        any other ``ProtocolError`` as it comes.
        """
        while True:
            try:
                answer = request()
            except (Unreachable, ProtocolError) as exc:
                if not is_transient(exc):
                    raise
                wait = self.missed(exc)
                if self.offline() or (stop is not None and stop.is_set()):
                    raise Offline(str(exc)) from exc
                if stop is not None:
                    stop.wait(wait)
                else:
                    time.sleep(wait)
                continue
            self.reached()
            return answer
