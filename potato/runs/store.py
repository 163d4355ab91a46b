"""The run store: one SQLite file (WAL) holding runs, their events and agent tokens.

The store is the one source of truth about runs (docs/architecture.md, "Layers");
Prefect orchestrates and traces but is never asked whether a run is alive.

Concurrency: the annotation server's request threads, the dispatcher, flow
processes and CLI commands all write here at once. Each thread (and each
process, after a fork) gets its own connection; every connection waits up to
``BUSY_TIMEOUT_S`` for a lock instead of failing with ``database is locked``;
every write runs in ``BEGIN IMMEDIATE``, which takes the write lock up front.
(A deferred transaction that reads and then writes can fail with SQLITE_BUSY
at once, without waiting: SQLite refuses to upgrade a reader while another
writer is pending — https://www.sqlite.org/lang_transaction.html.)

Schema changes: ``MIGRATIONS`` is applied in order at open; ``PRAGMA
user_version`` holds how many have run. Only ever append to it.

Timestamps are unix floats (``time.time()``).

JSON columns hold strict JSON: NaN and Infinity are refused on write (a
``StoreError`` naming the column), because a browser's ``JSON.parse`` rejects a
whole answer that holds one. Rows written before that rule read back with
null in their place.

Run ids are SQLite integers: an id outside ``1..MAX_RUN_ID`` names no run
(``UnknownRun``), never an ``OverflowError``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from potato.errors import NotThisFlowRun, RunEnded, StoreBusy, StoreError, UnknownRun
from potato.training.escaping import escaped

QUEUED = "queued"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
CANCELLED = "cancelled"

STATES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)

# What started a run: the Training page, the admin API or the CLI (``manual``),
# the auto-retrain watcher (``auto``). New starters append a value here.
MANUAL = "manual"
AUTO = "auto"
SCHEDULE = "schedule"  # a Prefect deployment's schedule (deployments.create --cron)
COLD_START = "cold-start"  # potato start, for a model_review project with nothing written back (potato.results.cold_start_writeback)
TRIGGERS = (MANUAL, AUTO, SCHEDULE, COLD_START)
END_STATES = frozenset({SUCCEEDED, FAILED, CANCELLED})
ACTIVE_STATES = frozenset({RUNNING})

# Long enough to outlast any burst of writers we produce (each write is a
# handful of rows); short enough that a wedged process shows up as an error.
BUSY_TIMEOUT_S = 30.0

# The largest INTEGER SQLite stores; a larger Python int cannot even be bound.
MAX_RUN_ID = 2**63 - 1

# Columns holding JSON, with the value an absent one decodes to.
_JSON_COLUMNS = {"schemas": list, "options": dict, "scores": dict, "ending": dict, "plan": dict, "publication": dict}

# The order of Run's fields and of the runs table's columns.
RUN_COLUMNS = (
    "id", "trainer", "schemas", "backend", "state", "step", "progress",
    "progress_text", "options", "created_at", "started_at", "finished_at",
    "heartbeat_at", "cancel_requested_at", "error", "artifact_uri",
    "host_python", "gpu", "scores", "prefect_flow_run_id", "run_token_hash",
    "flow_pid", "worker_pid", "trigger", "annotation_count", "last_seq",
    "remote_job_dir", "remote_socket", "slurm_job_id", "ending", "plan", "publication", "retracted_at",
)
_UPDATABLE = frozenset(RUN_COLUMNS) - {"id"}

# Applied in order at open; PRAGMA user_version = number applied. Append only.
MIGRATIONS: tuple[str, ...] = (
    # 1: the first schema.
    """
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        trainer TEXT NOT NULL,
        schemas TEXT NOT NULL DEFAULT '[]',
        backend TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'queued',
        step TEXT,
        progress REAL,
        progress_text TEXT,
        options TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        heartbeat_at REAL,
        cancel_requested_at REAL,
        error TEXT,
        artifact_uri TEXT,
        host_python TEXT,
        gpu TEXT,
        scores TEXT,
        prefect_flow_run_id TEXT,
        run_token_hash TEXT
    );
    CREATE TABLE events (
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        t REAL NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE tokens (
        backend TEXT PRIMARY KEY,
        token_hash TEXT NOT NULL,
        created_at REAL NOT NULL,
        last_seen REAL
    );
    """,
    # 2: the dispatcher and agents look up queued/running runs by state
    # (oldest first), often per backend; without this it is a full scan.
    """
    CREATE INDEX runs_state_backend_id ON runs (state, backend, id);
    """,
    # 3: reconciliation after a restart tells a live run from a dead one by
    # the pids of its flow process and its worker (process group leader).
    """
    ALTER TABLE runs ADD COLUMN flow_pid INTEGER;
    ALTER TABLE runs ADD COLUMN worker_pid INTEGER;
    """,
    # 4: what started each run, and for auto runs the annotation count that
    # triggered it: the next auto run counts new annotations from there, so a
    # restart neither loses nor repeats a trigger (potato/runs/auto_retrain.py).
    """
    ALTER TABLE runs ADD COLUMN trigger TEXT NOT NULL DEFAULT 'manual';
    ALTER TABLE runs ADD COLUMN annotation_count INTEGER;
    """,
    # 5: the highest worker-event seq recorded for the run, written in the same
    # transaction as the event, so a batch re-sent after a lost answer or a
    # server restart is not stored twice.
    """
    ALTER TABLE runs ADD COLUMN last_seq INTEGER NOT NULL DEFAULT 0;
    """,
    # 6: enough to stop what a run started when the flow that started it is gone
    # (kill -9): an ssh/slurm run's job directory and socket on the host and its
    # SLURM job id; and ``ending``, the end a run was given while stopping its
    # worker could not be verified yet (JSON: state, error, since, last_try, why).
    """
    ALTER TABLE runs ADD COLUMN remote_job_dir TEXT;
    ALTER TABLE runs ADD COLUMN remote_socket TEXT;
    ALTER TABLE runs ADD COLUMN slurm_job_id TEXT;
    ALTER TABLE runs ADD COLUMN ending TEXT;
    """,
    # 7: which trainer trains which of the run's schemas (JSON: {trainer: [schemas]}), for a run
    # that needs several (potato/trainer_choice.py); null: ``trainer`` trains them all.
    """
    ALTER TABLE runs ADD COLUMN plan TEXT;
    """,
    # 8: the run's model on the Hugging Face Hub: the latest publish (repo, progress, commit, who,
    # or why it failed) and the earlier ones that succeeded (potato/publish/publication.py). JSON.
    """
    ALTER TABLE runs ADD COLUMN publication TEXT;
    """,
    # 9: when the run's predictions were retracted (potato/results/retract.py): annotators no longer see them,
    # and no later retract or calibration brings them back.
    """
    ALTER TABLE runs ADD COLUMN retracted_at REAL;
    """,
)


@dataclass(frozen=True)
class Run:
    """One training run, as stored (JSON columns decoded)."""

    id: int
    trainer: str
    schemas: list
    backend: str
    state: str
    step: str | None = None
    progress: float | None = None
    progress_text: str | None = None
    options: dict = field(default_factory=dict)
    created_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    heartbeat_at: float | None = None
    cancel_requested_at: float | None = None
    error: str | None = None
    artifact_uri: str | None = None
    host_python: str | None = None
    gpu: str | None = None
    scores: dict = field(default_factory=dict)
    prefect_flow_run_id: str | None = None
    run_token_hash: str | None = None
    flow_pid: int | None = None
    worker_pid: int | None = None
    trigger: str = MANUAL
    annotation_count: int | None = None
    last_seq: int = 0
    remote_job_dir: str | None = None
    remote_socket: str | None = None
    slurm_job_id: str | None = None
    ending: dict = field(default_factory=dict)
    plan: dict = field(default_factory=dict)
    publication: dict = field(default_factory=dict)
    retracted_at: float | None = None

    @property
    def is_finished(self) -> bool:
        return self.state in END_STATES

    @property
    def trainers(self) -> dict[str, list]:
        """``{trainer: [schemas]}``: the plan of a run with several trainers, else ``trainer`` for all.

        Trainers in the order their first schema comes in the run's schemas, as the plan was made (the
        stored JSON has its keys sorted, so the parts would otherwise run in the trainers' name order)."""
        if not self.plan:
            return {self.trainer: list(self.schemas)}
        order = {schema: k for k, schema in enumerate(self.schemas)}
        return dict(sorted(self.plan.items(),
                           key=lambda item: min((order.get(s, len(order)) for s in item[1]), default=len(order))))

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES

    def as_dict(self) -> dict[str, Any]:
        """The run as JSON-ready data, minus the token hash (never shown)."""
        data = {name: getattr(self, name) for name in RUN_COLUMNS}
        data.pop("run_token_hash", None)
        return data


@dataclass(frozen=True)
class Event:
    """One event of a run; ``seq`` counts 1, 2, … per run."""

    run_id: int
    seq: int
    t: float
    kind: str
    data: dict


@dataclass(frozen=True)
class AgentToken:
    """The token record of one agent backend (only the token's hash is kept)."""

    backend: str
    token_hash: str
    created_at: float
    last_seen: float | None


def hash_token(token: str) -> str:
    """Return the hex sha256 of *token*: what the store keeps instead of the token.

    Tokens are long random strings (``secrets.token_urlsafe``), so a plain
    hash is enough; no salt or slow KDF is needed for them.
    """
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def dump_json(what: str, value: Any) -> str:
    """*value* as strict JSON; a ``StoreError`` naming *what* for NaN or Infinity."""
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False)
    except ValueError:
        raise StoreError(f"{what} holds NaN or Infinity, which JSON cannot carry; "
                         "refuse it where it enters (send null instead)") from None


def _load_json(text: str) -> Any:
    # NaN/Infinity in rows from before the rule read as null, so one old row
    # cannot make every answer that lists it invalid JSON.
    return json.loads(text, parse_constant=lambda _: None)


def _encode(column: str, value: Any) -> Any:
    if column in _JSON_COLUMNS:
        return None if value is None else dump_json(f"The run's {column}", value)
    # A text (an error quoting a worker's words, say) may hold a lone surrogate, which SQLite cannot bind.
    return escaped(value) if isinstance(value, str) else value


def _row_to_run(row: sqlite3.Row) -> Run:
    values = {}
    for column in RUN_COLUMNS:
        value = row[column]
        if column in _JSON_COLUMNS:
            value = _JSON_COLUMNS[column]() if value is None else _load_json(value)
        values[column] = value
    return Run(**values)


def _row_to_event(row: sqlite3.Row) -> Event:
    return Event(run_id=row["run_id"], seq=row["seq"], t=row["t"], kind=row["kind"],
                 data=_load_json(row["data"]))


def _is_lock_error(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _is_run_id(run_id: Any) -> bool:
    return isinstance(run_id, int) and not isinstance(run_id, bool) and 0 < run_id <= MAX_RUN_ID


def _make_private(path: Path) -> None:
    """Create the store file 0600 before SQLite opens it, and tighten one an older version left wider.

    SQLite creates the ``-wal`` and ``-shm`` files with the database file's
    mode, so all three stay readable by the owner only: they hold token
    hashes, labels' provenance and every run's log.

    An existing file is never opened here: closing any descriptor of a
    database file drops every POSIX lock this process holds on it, those of
    its SQLite connections included (https://www.sqlite.org/howtocorrupt.html,
    section 2.2). A second ``Store`` on the same file in one process then let
    another connection take the file for its own, checkpoint and delete the
    WAL under the others, which went on reading a deleted WAL and saw no new
    rows. Only a file that does not exist yet, which no connection of ours can
    hold, is created (``O_EXCL``) and closed.
    """
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            if name.stat().st_mode & 0o077:
                name.chmod(0o600)
        except (FileNotFoundError, PermissionError):  # not there yet, or another account's store
            pass


def _check_fields(fields: Mapping[str, Any]) -> None:
    unknown = sorted(set(fields) - _UPDATABLE)
    if unknown:
        raise StoreError(
            f"Unknown run field(s) {', '.join(map(repr, unknown))}; "
            f"valid fields: {', '.join(sorted(_UPDATABLE))}"
        )
    if "state" in fields and fields["state"] not in STATES:
        raise StoreError(f"Unknown run state {fields['state']!r}; valid states: {', '.join(STATES)}")
    if "trigger" in fields and fields["trigger"] not in TRIGGERS:
        raise StoreError(f"Unknown run trigger {fields['trigger']!r}; valid triggers: {', '.join(TRIGGERS)}")


class Store:
    """The run store at *path* (created, and migrated forward, on open).

    Safe to share between threads: each thread uses its own connection.
    Safe across processes: SQLite's locks, WAL, busy timeout, BEGIN IMMEDIATE.
    """

    def __init__(self, path: str | os.PathLike, *, busy_timeout_s: float = BUSY_TIMEOUT_S):
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _make_private(self.path)
        self._migrate()

    # -- connections -------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        # Keyed by pid too: a connection must never cross a fork
        # (https://www.sqlite.org/howtocorrupt.html, section 2.6).
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            return conn
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout_s,
            isolation_level=None,       # we issue BEGIN/COMMIT ourselves
            check_same_thread=False,    # only so close() may close it from another thread
        )
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
        conn.execute("PRAGMA foreign_keys = ON")
        # WAL: readers never block the writer and vice versa. The mode is
        # stored in the file, so only the first open really switches it.
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        # NORMAL is durable across application crashes in WAL mode; only a
        # power loss can drop the last commits (https://www.sqlite.org/pragma.html#pragma_synchronous).
        conn.execute("PRAGMA synchronous = NORMAL")
        self._local.conn = conn
        self._local.pid = os.getpid()
        with self._all_lock:
            self._all.append(conn)
        return conn

    def close(self) -> None:
        """Close every connection this Store opened in this process."""
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A read-modify-write transaction holding the write lock from its start.

        Raises ``StoreBusy`` when the lock stays taken for ``busy_timeout_s``.
        """
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if _is_lock_error(exc):
                raise StoreBusy(f"The run store {str(self.path)!r} is busy: {exc}") from exc
            raise StoreError(f"The run store {str(self.path)!r} cannot be written: {exc}") from exc
        try:
            yield conn
        except BaseException as exc:
            conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError) and _is_lock_error(exc):
                raise StoreBusy(f"The run store {str(self.path)!r} is busy: {exc}") from exc
            raise
        else:
            conn.execute("COMMIT")

    def _migrate(self) -> None:
        conn = self._conn()
        if conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS):
            return
        # Several processes may open a new file at once: re-read the version
        # under the write lock so each migration runs exactly once.
        with self._write() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > len(MIGRATIONS):
                raise StoreError(
                    f"The run store {str(self.path)!r} has schema version {version}, newer "
                    f"than this Potato knows ({len(MIGRATIONS)}); upgrade potato-annotation"
                )
            for number in range(version, len(MIGRATIONS)):
                # executescript() would COMMIT first; run statement by statement
                # so a failed migration rolls back with the version bump.
                for statement in MIGRATIONS[number].split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {number + 1}")

    @property
    def schema_version(self) -> int:
        return self._conn().execute("PRAGMA user_version").fetchone()[0]

    # -- runs --------------------------------------------------------------

    def create_run(self, trainer: str, schemas: Sequence[str], backend: str,
                   options: Mapping[str, Any] | None = None, *, trigger: str = MANUAL,
                   annotation_count: int | None = None, only_when_idle: bool = False,
                   plan: Mapping[str, Sequence[str]] | None = None) -> Run | None:
        """Add a run in state ``queued`` and return it.

        *plan* (``{trainer: [schemas]}``) is kept for a run with several trainers; *trainer*
        then names them all. *trigger* says what started it (``TRIGGERS``). With *only_when_idle*
        nothing is added, and None returned, while a run is queued or running:
        decided inside the write lock, so two watchers never queue two runs.
        """
        _check_fields({"trigger": trigger})
        with self._write() as conn:
            if only_when_idle and conn.execute(
                "SELECT 1 FROM runs WHERE state IN (?, ?) LIMIT 1", (QUEUED, RUNNING)
            ).fetchone():
                return None
            cursor = conn.execute(
                "INSERT INTO runs (trainer, schemas, backend, state, options, created_at, trigger,"
                " annotation_count, plan) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (trainer, dump_json("The run's schemas", list(schemas)), backend, QUEUED,
                 dump_json("The run's options", dict(options or {})), time.time(), trigger,
                 annotation_count, dump_json("The run's plan", {k: list(v) for k, v in plan.items()})
                 if plan and len(plan) > 1 else None),
            )
            return self._get(conn, cursor.lastrowid)

    def latest_run(self, trigger: str | None = None) -> Run | None:
        """The newest run (started by *trigger*, if given), or None."""
        sql, args = "SELECT * FROM runs", ()
        if trigger is not None:
            sql, args = sql + " WHERE trigger = ?", (trigger,)
        row = self._conn().execute(sql + " ORDER BY id DESC LIMIT 1", args).fetchone()
        return None if row is None else _row_to_run(row)

    def last_finished_at(self) -> float | None:
        """When the most recently ended run ended (None before any run ended)."""
        return self._conn().execute("SELECT max(finished_at) FROM runs").fetchone()[0]

    def _get(self, conn: sqlite3.Connection, run_id: int) -> Run:
        row = None
        if _is_run_id(run_id):
            row = conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise UnknownRun(run_id)
        return _row_to_run(row)

    def get_run(self, run_id: int) -> Run:
        """Return run *run_id*; raise ``StoreError`` when there is none."""
        return self._get(self._conn(), run_id)

    def list_runs(self, limit: int | None = None, offset: int = 0) -> list[Run]:
        """Return runs newest first (at most *limit*, skipping *offset*)."""
        rows = self._conn().execute(
            "SELECT * FROM runs ORDER BY id DESC LIMIT ? OFFSET ?",
            (-1 if limit is None else min(int(limit), MAX_RUN_ID), min(int(offset), MAX_RUN_ID)),
        ).fetchall()
        return [_row_to_run(row) for row in rows]

    def count_runs(self) -> int:
        return self._conn().execute("SELECT count(*) FROM runs").fetchone()[0]

    def next_queued(self, backend: str | None = None) -> Run | None:
        """Return the oldest queued run (of *backend*, if given), or None."""
        return self._next_queued(self._conn(), backend)

    def _next_queued(self, conn: sqlite3.Connection, backend: str | None) -> Run | None:
        # A queued run with a flow run already is its own flow's to start (``adopt``): not the dispatcher's.
        if backend is None:
            row = conn.execute(
                "SELECT * FROM runs WHERE state = ? AND prefect_flow_run_id IS NULL ORDER BY id LIMIT 1", (QUEUED,)
            ).fetchone()
        else:
            row = conn.execute(
                "SELECT * FROM runs WHERE state = ? AND backend = ? AND prefect_flow_run_id IS NULL ORDER BY id "
                "LIMIT 1", (QUEUED, backend),
            ).fetchone()
        return None if row is None else _row_to_run(row)

    def adopt(self, run_id: int, flow_run_id: str | None, pid: int, **fields: Any) -> bool:
        """Make queued run *run_id* the run of flow run *flow_run_id* (process *pid*), which then starts it.

        For a run a flow created itself (``prefect deployment run``, a
        schedule): it stays ``queued`` while its flow waits for the project's
        turn, and the dispatcher, which starts only runs without a flow run,
        leaves it alone. False, changing nothing, when the run is no longer
        queued or has a flow run (the dispatcher took it first).
        """
        _check_fields(fields)
        with self._write() as conn:
            run = self._get(conn, run_id)
            if run.state != QUEUED or run.prefect_flow_run_id is not None:
                return False
            self._set(conn, run_id, {"prefect_flow_run_id": flow_run_id, "flow_pid": pid, **fields})
            return True

    def record_flow(self, run_id: int, flow_run_id: str | None, pid: int) -> Run:
        """Record flow run *flow_run_id*, in process *pid*, as the one executing run *run_id*; return the run.

        Only a run without a flow run yet, or whose flow run is this one (a
        Prefect retry of it, in a new process), is recorded on; a finished run
        is returned as it is. Raises ``NotThisFlowRun``, changing nothing, when
        another flow run has the run, or the dispatcher started a flow process
        for it (its pid recorded) that is not this one.
        """
        with self._write() as conn:
            run = self._get(conn, run_id)
            owner = run.prefect_flow_run_id
            if owner is not None and owner != flow_run_id:
                raise NotThisFlowRun(run_id, flow_run_id, owner=owner)
            if owner is None and run.flow_pid is not None and run.flow_pid != pid:
                raise NotThisFlowRun(run_id, flow_run_id, pid=run.flow_pid)
            if run.state in END_STATES:
                return run
            self._set(conn, run_id, {"prefect_flow_run_id": flow_run_id, "flow_pid": pid})
            return self._get(conn, run_id)

    def start(self, run_id: int) -> Run:
        """Move queued run *run_id* to ``running`` unless another run is running; return it afterwards.

        The one-run-at-a-time rule for a run its own flow starts, decided in
        the write lock as the dispatcher's claim is: while another run runs,
        it stays queued. A run already running (the dispatcher claimed it for
        this flow) or ended is returned as it is.
        """
        with self._write() as conn:
            run = self._get(conn, run_id)
            if run.state == QUEUED and not conn.execute(
                    "SELECT 1 FROM runs WHERE state = ? AND id != ? LIMIT 1", (RUNNING, run_id)).fetchone():
                self._set(conn, run_id, {"state": RUNNING, "started_at": time.time()})
                run = self._get(conn, run_id)
            return run

    def waiting_flow_runs(self) -> list[Run]:
        """Queued runs that their own flow will start (``adopt``), oldest first."""
        rows = self._conn().execute(
            "SELECT * FROM runs WHERE state = ? AND prefect_flow_run_id IS NOT NULL ORDER BY id", (QUEUED,)
        ).fetchall()
        return [_row_to_run(row) for row in rows]

    def claim_next_queued(self, backend: str | None = None, *, only_when_idle: bool = False,
                          **fields: Any) -> Run | None:
        """Atomically move the oldest queued run (of *backend*) to ``running`` and return it.

        Two claimers never get the same run. *fields* are set in the same
        write (e.g. ``step``). Returns None when nothing is queued, or, with
        *only_when_idle*, while another run is running: the dispatcher's
        one-run-at-a-time rule, decided inside the write lock so that two
        dispatchers (server and CLI) never start two runs.
        """
        _check_fields(fields)
        with self._write() as conn:
            if only_when_idle and conn.execute("SELECT 1 FROM runs WHERE state = ? LIMIT 1", (RUNNING,)).fetchone():
                return None
            run = self._next_queued(conn, backend)
            if run is None:
                return None
            self._set(conn, run.id, {"state": RUNNING, "started_at": time.time(), **fields})
            return self._get(conn, run.id)

    def queue_position(self, run_id: int) -> int | None:
        """Return 1 for the next run to start, 2 after it, …; None unless queued."""
        conn = self._conn()
        run = self._get(conn, run_id)
        if run.state != QUEUED:
            return None
        return conn.execute(
            "SELECT count(*) FROM runs WHERE state = ? AND id <= ?", (QUEUED, run_id)
        ).fetchone()[0]

    def active_runs(self) -> list[Run]:
        """Return the runs in an active state (``running``), oldest first."""
        marks = ", ".join("?" for _ in ACTIVE_STATES)
        rows = self._conn().execute(
            f"SELECT * FROM runs WHERE state IN ({marks}) ORDER BY id", tuple(ACTIVE_STATES)
        ).fetchall()
        return [_row_to_run(row) for row in rows]

    def _set(self, conn: sqlite3.Connection, run_id: int, fields: Mapping[str, Any]) -> None:
        if not fields:
            return
        names = list(fields)
        conn.execute(
            f"UPDATE runs SET {', '.join(f'{n} = ?' for n in names)} WHERE id = ?",
            [_encode(n, fields[n]) for n in names] + [run_id],
        )

    def update_run(self, run_id: int, **fields: Any) -> Run:
        """Set any of the run's columns (not ``id``); return the updated run.

        For state changes prefer ``transition``, which checks the old state.
        """
        _check_fields(fields)
        with self._write() as conn:
            self._get(conn, run_id)
            self._set(conn, run_id, fields)
            return self._get(conn, run_id)

    def transition(self, run_id: int, to_state: str, *, from_states: Sequence[str] | str,
                   **fields: Any) -> bool:
        """Move run *run_id* to *to_state* if it is in one of *from_states* (compare-and-set).

        Sets ``started_at`` when entering ``running`` and ``finished_at`` when
        entering an end state (unless *fields* gives them). Never leaves an end
        state. Returns whether the run changed; raises ``StoreError`` for an
        unknown run or state.
        """
        if isinstance(from_states, str):
            from_states = (from_states,)
        _check_fields({"state": to_state, **fields})
        with self._write() as conn:
            run = self._get(conn, run_id)
            if run.state in END_STATES or run.state not in from_states:
                return False
            now = time.time()
            changes = {"state": to_state}
            if to_state == RUNNING and run.started_at is None:
                changes["started_at"] = now
            if to_state in END_STATES:
                changes["finished_at"] = now
            changes.update(fields)
            self._set(conn, run_id, changes)
            return True

    def change_json(self, run_id: int, column: str, change: Callable[[Any], Any]) -> Run:
        """Replace the JSON column *column* of run *run_id* by ``change(its value)``, atomically; return the run.

        Read and written in one transaction, so two writers (a request thread
        and an upload's progress, a CLI and a server) never lose each other's
        change. ``change`` returning None leaves the value as it is.
        """
        if column not in _JSON_COLUMNS:
            raise StoreError(f"{column!r} is not a JSON column; JSON columns: {', '.join(_JSON_COLUMNS)}")
        with self._write() as conn:
            run = self._get(conn, run_id)
            value = change(getattr(run, column))
            if value is not None:
                self._set(conn, run_id, {column: value})
            return self._get(conn, run_id)

    def request_cancel(self, run_id: int) -> Run:
        """Ask for run *run_id* to be cancelled; return the run afterwards.

        A queued run has nothing to stop, so it becomes ``cancelled`` at once.
        A running run gets ``cancel_requested_at``; its flow's relay step
        carries the cancel out. A finished run is returned unchanged.
        """
        with self._write() as conn:
            run = self._get(conn, run_id)
            now = time.time()
            if run.state == QUEUED:
                self._set(conn, run_id, {"state": CANCELLED, "cancel_requested_at": now,
                                         "finished_at": now, "error": "Cancelled"})
            elif run.state in ACTIVE_STATES and run.cancel_requested_at is None:
                self._set(conn, run_id, {"cancel_requested_at": now})
            return self._get(conn, run_id)

    def heartbeat(self, run_id: int) -> None:
        """Record that the run's worker or agent is alive now."""
        with self._write() as conn:
            self._get(conn, run_id)
            self._set(conn, run_id, {"heartbeat_at": time.time()})

    # -- events ------------------------------------------------------------

    def add_event(self, run_id: int, kind: str, data: Mapping[str, Any] | None = None,
                  *, t: float | None = None) -> int:
        """Append an event to run *run_id*; return its seq (1, 2, … per run)."""
        text = dump_json(f"A {kind} event", dict(data or {}))
        with self._write() as conn:
            return self._insert_event(conn, run_id, kind, text, t)

    def _insert_event(self, conn: sqlite3.Connection, run_id: int, kind: str, text: str,
                      t: float | None) -> int:
        if not _is_run_id(run_id):
            raise UnknownRun(run_id)
        seq = conn.execute(
            "SELECT coalesce(max(seq), 0) + 1 FROM events WHERE run_id = ?", (run_id,)
        ).fetchone()[0]
        try:
            conn.execute(
                "INSERT INTO events (run_id, seq, t, kind, data) VALUES (?, ?, ?, ?, ?)",
                (run_id, seq, time.time() if t is None else t, kind, text),
            )
        except sqlite3.IntegrityError as exc:
            raise UnknownRun(run_id) from exc
        return seq

    def record_worker_event(self, run_id: int, seq: int | None, kind: str, data: Mapping[str, Any],
                            **fields: Any) -> bool:
        """Store worker event *seq* of running run *run_id* once, with its effect on the run.

        In one transaction: the event row, the run *fields* it sets (e.g.
        ``step``), the heartbeat, and ``last_seq = seq``. Returns False, storing
        nothing, when *seq* is not above the run's ``last_seq`` (a re-sent
        event). An event without a seq is always stored. Raises ``RunEnded``
        when the run is no longer running, ``UnknownRun`` for no run.
        """
        _check_fields(fields)
        text = dump_json(f"A {kind} event", dict(data))
        with self._write() as conn:
            run = self._get(conn, run_id)
            if run.state != RUNNING:
                raise RunEnded(run_id, run.state)
            if seq is not None and seq <= run.last_seq:
                return False
            self._insert_event(conn, run_id, kind, text, None)
            changes = {**fields, "heartbeat_at": time.time()}
            if seq is not None:
                changes["last_seq"] = seq
            self._set(conn, run_id, changes)
            return True

    def events(self, run_id: int, after: int = 0, limit: int | None = None) -> list[Event]:
        """Return run *run_id*'s events with seq > *after*, in order."""
        if not _is_run_id(run_id):
            return []
        rows = self._conn().execute(
            "SELECT * FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (run_id, min(after, MAX_RUN_ID), -1 if limit is None else min(int(limit), MAX_RUN_ID)),
        ).fetchall()
        return [_row_to_event(row) for row in rows]

    # -- agent tokens --------------------------------------------------------

    def set_token(self, backend: str, token_hash: str) -> None:
        """Store *token_hash* for *backend*, replacing (invalidating) any earlier token."""
        with self._write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO tokens (backend, token_hash, created_at, last_seen)"
                " VALUES (?, ?, ?, NULL)",
                (backend, token_hash, time.time()),
            )

    def get_token(self, backend: str) -> AgentToken | None:
        """Return *backend*'s token record, or None before any registration."""
        row = self._conn().execute(
            "SELECT * FROM tokens WHERE backend = ?", (backend,)
        ).fetchone()
        if row is None:
            return None
        return AgentToken(backend=row["backend"], token_hash=row["token_hash"],
                          created_at=row["created_at"], last_seen=row["last_seen"])

    def touch_token(self, backend: str) -> None:
        """Set the token record's ``last_seen`` to now (an agent connected)."""
        with self._write() as conn:
            conn.execute("UPDATE tokens SET last_seen = ? WHERE backend = ?",
                         (time.time(), backend))

    def verify_token(self, backend: str, token: str) -> bool:
        """Return whether *token* is *backend*'s current token (constant-time compare)."""
        record = self.get_token(backend)
        # Compare against something even when no token is registered, so the
        # answer's timing does not tell which backend names exist.
        expected = record.token_hash if record is not None else "0" * 64
        matches = hmac.compare_digest(hash_token(token).encode(), expected.encode())
        return matches and record is not None
