"""The upload: ``huggingface_hub``'s ``HfApi`` (``create_repo``, ``create_commit``), with progress in bytes.

The Hub comes from ``HF_ENDPOINT`` (read at each publish, default
https://huggingface.co), so a private Hub works the same; the token from
``HF_TOKEN``, else the one ``hf auth login`` stored (``huggingface_hub.get_token``).
The token goes to ``HfApi`` and nowhere else; messages name where it came
from, never what it is. ``HF_ENDPOINT`` may carry a user and password
(``http://user:password@hub.internal``): every text taken from the Hub
client's exceptions, or its answers, passes through ``scrubbed`` before it
is printed, logged, stored or shown (the client quotes the URL it asked,
credentials and all, as in ``Server error '502 Bad Gateway' for url …``).

Steps: ``whoami`` (a bad token fails here, before anything is sent), the
repo (created private unless asked otherwise; an existing one keeps its
visibility), the branch when it is not ``main``, the repo's file list, then
one commit that adds the model and its card and deletes what an earlier
publish left that this one does not have (``.gitattributes`` excepted; the
Hub keeps every earlier commit). A commit is all or nothing: a failure leaves
the repo as it was. Large files go up first through the LFS batch API and
the Hub's storage; an object the Hub already holds is not sent again, so a
publish repeated after a failure sends only what is missing.

Every file is handed to ``HfApi`` as an open file (``io.BufferedIOBase``),
never as a path. That does two things. The bytes are counted as they are read
(``_Counted``), which is the progress in bytes the run page shows. And
huggingface_hub then uploads through LFS: given paths it would upload through
Xet whenever ``hf_xet`` is installed, without asking the server, and a
Hub-compatible server without Xet (a private Hub) would refuse every model
file. huggingface.co takes LFS uploads too (it is the client's own fallback
for buffers); the warning the client logs about it is left out.
"""

from __future__ import annotations

import io
import logging
import os
import re
import threading
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence
from urllib.parse import unquote, urlsplit, urlunsplit

from potato.publish import publish_errors
from potato.publish.plan import OutFile

DEFAULT_ENDPOINT = "https://huggingface.co"
# What huggingface_hub logs for every upload of buffers; here that is the plan, not a problem.
XET_NOTICE = "Uploading files as a binary IO buffer is not supported by Xet Storage"
KEEP = frozenset({".gitattributes"})  # never deleted from a repo: the Hub's own LFS rules
log = logging.getLogger(__name__)


def hub_endpoint() -> str:
    """The Hub to publish to: ``HF_ENDPOINT`` (a private Hub) or huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def without_credentials(endpoint: str) -> str:
    """*endpoint* without any user:password in it, for messages and the store."""
    parts = urlsplit(endpoint)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


# The user:password@ of any URL in a text.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s@]*@")
HIDDEN = "<hidden>"


def scrubbed(text: str, *secrets: str | None) -> str:
    """*text* as it may be shown: no user:password of any URL, and none of *secrets* (the token, the
    endpoint's password, also percent-decoded) anywhere in it."""
    text = _USERINFO.sub(r"\1", text)
    for secret in secrets:
        for form in {secret, unquote(secret or "")}:
            if form and len(form) >= 3:
                text = text.replace(form, HIDDEN)
    return text


def endpoint_secrets(endpoint: str) -> tuple[str, ...]:
    """What of *endpoint* must never be shown: its password."""
    password = urlsplit(endpoint).password
    return (password,) if password else ()


def hub_token() -> tuple[str, bool]:
    """(the token, whether it came from the environment); ``NoHubToken`` or ``HubOffline`` when there is none to use."""
    from huggingface_hub import constants, get_token

    if constants.HF_HUB_OFFLINE:
        raise publish_errors.HubOffline()
    token = get_token()
    if not token:
        raise publish_errors.NoHubToken()
    return token, bool(os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"))


class _WithoutXetNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(XET_NOTICE)


_NOTICE_FILTER = _WithoutXetNotice()


class _Scrubbed(logging.Filter):
    """What huggingface_hub logs (it names the URLs it asks, credentials and all), ``scrubbed``."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = scrubbed(record.getMessage(), *self.hidden), ()
        return True


_SCRUBBED = _Scrubbed()


# The loggers of the Hub client and the HTTP client under it, which log each URL they ask.
CLIENT_LOGGERS = ("huggingface_hub", "httpx2", "httpcore2", "httpx", "httpcore")


def _scrub_client_logs(hidden: Sequence[str]) -> None:
    """Put ``_SCRUBBED`` on every logger of ``CLIENT_LOGGERS`` (a filter is the logger's own, not its children's)."""
    _SCRUBBED.hidden.update(h for h in hidden if h)
    names = [*CLIENT_LOGGERS, *logging.Logger.manager.loggerDict]
    for name in names:
        if name.split(".")[0] in CLIENT_LOGGERS:
            logging.getLogger(name).addFilter(_SCRUBBED)  # adding it again is a no-op


class Progress:
    """Bytes of the upload read so far, in phases: ``checking`` (hashing) and ``uploading``.

    A file read twice (a retried request) counts once: each file's count is
    the furthest it was read in the phase.
    """

    def __init__(self, total: int, on_change: Callable[[str, int, int], None] | None = None):
        self.total = total
        self.phase = "checking"
        self._read: dict[int, int] = {}
        self._lock = threading.Lock()
        self._on_change = on_change or (lambda phase, done, total: None)

    @property
    def done(self) -> int:
        return sum(self._read.values())

    def enter(self, phase: str) -> None:
        with self._lock:
            self.phase, self._read = phase, {}
        self._on_change(phase, 0, self.total)

    def reached(self, key: int, position: int) -> None:
        with self._lock:
            if position <= self._read.get(key, 0):
                return
            self._read[key] = position
            done = self.done
        self._on_change(self.phase, done, self.total)


class _Counted(io.BufferedIOBase):
    """A file of the upload, read through: how far it was read goes to a ``Progress``."""

    def __init__(self, out: OutFile, progress: Progress):
        super().__init__()
        self._file = out.open()
        self._progress = progress
        self._key = id(self)

    def _note(self) -> None:
        self._progress.reached(self._key, self._file.tell())

    def read(self, size: int | None = -1) -> bytes:
        data = self._file.read(-1 if size is None else size)
        self._note()
        return data

    def read1(self, size: int = -1) -> bytes:
        return self.read(size)

    def readinto(self, buffer) -> int:
        n = self._file.readinto(buffer)
        self._note()
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._file.fileno()

    def close(self) -> None:
        self._file.close()
        super().close()


@dataclass(frozen=True)
class Published:
    """What the Hub answered: where the model is now."""

    repo: str
    revision: str
    commit: str
    commit_url: str
    url: str
    user: str
    private: bool


def _http_status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


@contextmanager
def _translated(endpoint: str, repo: str, run_id: int, user: list[str], from_environment: bool,
                hidden: tuple[str, ...]) -> Iterator[None]:
    """Turn what huggingface_hub raises into the messages of ``potato.publish.publish_errors``, each text of the
    client's scrubbed of *hidden* and of any URL's credentials; anything else is re-raised as
    ``UploadFailed``, its text scrubbed the same way (``from None``: the original, credentials and all, is
    not chained to it)."""
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    def shown(text: str) -> str:
        return scrubbed(text, *hidden)

    try:
        yield
    except publish_errors.PublishError:
        raise
    except Exception as exc:  # noqa: BLE001 - every failure becomes a message the user can act on
        for cause in _causes(exc):
            if isinstance(cause, OfflineModeIsEnabled):
                raise publish_errors.HubOffline() from None
            if isinstance(cause, HfHubHTTPError):
                status = _http_status(cause)
                if status == 401:
                    raise publish_errors.HubTokenRefused(endpoint, from_environment) from None
                if status == 403:
                    raise publish_errors.HubForbidden(endpoint, user[0] if user else "this token's user", repo) from None
                said = (getattr(cause, "server_message", None) or str(cause).strip().splitlines()[0]).strip()
                raise publish_errors.HubRefused(endpoint, repo, status or 0, shown(said)) from None
            if isinstance(cause, httpx2.TransportError):
                raise publish_errors.HubUnreachable(endpoint, repo, run_id,
                                            shown(f"{type(cause).__name__}: {cause}".rstrip(": "))) from None
        if isinstance(exc, ValueError) and "README.md" in str(exc):  # the Hub's check of the card's metadata
            raise publish_errors.HubRefused(endpoint, repo, 400, shown(" ".join(str(exc).split()))) from None
        log.warning("Publishing to %s failed: %s", endpoint, shown("".join(traceback.format_exception(exc))))
        raise publish_errors.UploadFailed(shown(f"{type(exc).__name__}: {exc}")) from None


def upload(files: Sequence[OutFile], *, repo: str, revision: str, private: bool, message: str, description: str,
           run_id: int, progress: Progress, endpoint: str | None = None) -> Published:
    """Publish *files* to *repo* in one commit on *revision*; raises ``HubError`` or a refusal."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
    from huggingface_hub.utils import disable_progress_bars

    logging.getLogger("huggingface_hub._commit_api").addFilter(_NOTICE_FILTER)  # adding it again is a no-op
    disable_progress_bars()  # the bytes counted here are the progress; the client's bars would go to stderr
    token, from_environment = hub_token()
    endpoint = endpoint or hub_endpoint()
    where = without_credentials(endpoint)
    hidden = (token, *endpoint_secrets(endpoint))
    _scrub_client_logs(hidden)
    user: list[str] = []
    with _translated(where, repo, run_id, user, from_environment, hidden):
        api = HfApi(endpoint=endpoint, token=token, library_name="potato-annotation")
        user.append(api.whoami()["name"])
        api.create_repo(repo, private=private, exist_ok=True)
        if revision != "main":
            api.create_branch(repo, branch=revision, exist_ok=True)
        info = api.repo_info(repo, revision=revision)
        present = {s.rfilename for s in info.siblings or ()}
        opened = [_Counted(f, progress) for f in files]
        try:
            progress.enter("checking")  # CommitOperationAdd reads each file once for its sha256
            adds = [CommitOperationAdd(path_in_repo=f.path, path_or_fileobj=o) for f, o in zip(files, opened)]
            stale = sorted(present - {f.path for f in files} - KEEP)
            progress.enter("uploading")
            commit = api.create_commit(
                repo, [*adds, *(CommitOperationDelete(path_in_repo=p) for p in stale)],
                commit_message=message, commit_description=description, revision=revision)
        finally:
            for o in opened:
                o.close()
    return Published(repo=repo, revision=revision, commit=commit.oid, commit_url=scrubbed(commit.commit_url, *hidden),
                     url=f"{where}/{repo}" + ("" if revision == "main" else f"/tree/{revision}"),
                     user=user[0], private=bool(info.private))

