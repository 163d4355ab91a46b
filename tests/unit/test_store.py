"""The run store: CRUD, transitions, cancel, events, tokens, migrations, concurrent writers."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time

import pytest

from potato.errors import StoreError
from potato.runs.store import (
    MIGRATIONS,
    RUN_COLUMNS,
    Run,
    Store,
    hash_token,
)


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "training" / "runs.db") as s:
        yield s


# -- CRUD -------------------------------------------------------------------

def test_create_and_get_run_decodes_json_columns(store):
    run = store.create_run("hf-text-classification", ["sentiment"], "local",
                           {"epochs": 2, "lora": {"r": 8}})
    assert isinstance(run, Run)
    assert run.id == 1
    assert run.state == "queued"
    assert run.schemas == ["sentiment"]
    assert run.options == {"epochs": 2, "lora": {"r": 8}}
    assert run.scores == {}
    assert abs(run.created_at - time.time()) < 5
    assert store.get_run(run.id) == run
    with pytest.raises(Exception):
        run.state = "running"  # frozen


def test_run_has_every_contract_column(store):
    run = store.create_run("t", [], "local")
    assert tuple(vars(run)) == RUN_COLUMNS


def test_get_unknown_run_raises_store_error(store):
    with pytest.raises(StoreError, match="No run with id 99"):
        store.get_run(99)


def test_update_run_sets_columns_and_rejects_unknown_ones(store):
    run = store.create_run("t", ["a"], "local")
    updated = store.update_run(run.id, step="copying code", progress=0.5,
                               scores={"a": {"accuracy": 0.9}}, gpu="cuda:0",
                               flow_pid=123, worker_pid=456)
    assert (updated.step, updated.progress, updated.scores, updated.gpu) == (
        "copying code", 0.5, {"a": {"accuracy": 0.9}}, "cuda:0")
    assert (updated.flow_pid, updated.worker_pid) == (123, 456)
    with pytest.raises(StoreError, match="Unknown run field"):
        store.update_run(run.id, colour="red")
    with pytest.raises(StoreError):
        store.update_run(run.id, state="exploded")
    with pytest.raises(StoreError):
        store.update_run(42, step="x")


def test_list_runs_newest_first_with_limit_and_offset(store):
    ids = [store.create_run("t", [], "local").id for _ in range(5)]
    assert [r.id for r in store.list_runs()] == ids[::-1]
    assert [r.id for r in store.list_runs(limit=2)] == ids[:2:-1][:2]
    assert [r.id for r in store.list_runs(limit=2, offset=2)] == [ids[2], ids[1]]


def test_list_runs_is_fast_with_10000_runs(tmp_path):
    path = tmp_path / "runs.db"
    store = Store(path)
    conn = sqlite3.connect(path)
    now = time.time()
    with conn:
        conn.executemany(
            "INSERT INTO runs (trainer, schemas, backend, state, options, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            [("t", '["a"]', "local", "succeeded" if i < 9990 else "queued", "{}", now)
             for i in range(10_000)],
        )
    conn.close()
    start = time.perf_counter()
    page = store.list_runs(limit=50, offset=100)
    queued = store.next_queued()
    active = store.active_runs()
    elapsed = time.perf_counter() - start
    assert [r.id for r in page] == list(range(9900, 9850, -1))
    assert queued.id == 9991
    assert active == []
    assert elapsed < 0.1, elapsed
    plan = " ".join(row[3] for row in store._conn().execute(
        "EXPLAIN QUERY PLAN SELECT * FROM runs WHERE state = 'queued' ORDER BY id LIMIT 1"))
    assert "runs_state_backend_id" in plan
    store.close()


# -- queue, transitions, cancel ----------------------------------------------

def test_next_queued_and_queue_position(store):
    a = store.create_run("t", [], "local")
    b = store.create_run("t", [], "agent-1")
    c = store.create_run("t", [], "local")
    assert store.next_queued().id == a.id
    assert store.next_queued(backend="agent-1").id == b.id
    assert [store.queue_position(r.id) for r in (a, b, c)] == [1, 2, 3]
    assert store.transition(a.id, "running", from_states=["queued"])
    assert [store.queue_position(r.id) for r in (a, b, c)] == [None, 1, 2]
    assert store.next_queued().id == b.id


def test_transition_is_compare_and_set_and_stamps_times(store):
    run = store.create_run("t", [], "local")
    assert not store.transition(run.id, "succeeded", from_states=["running"])
    assert store.transition(run.id, "running", from_states="queued", step="connecting")
    running = store.get_run(run.id)
    assert running.state == "running" and running.step == "connecting"
    assert running.started_at is not None and running.finished_at is None
    assert store.active_runs() == [running]
    assert store.transition(run.id, "failed", from_states=["running"], error="boom")
    failed = store.get_run(run.id)
    assert failed.finished_at >= failed.started_at
    assert failed.error == "boom"
    assert store.active_runs() == []


@pytest.mark.parametrize("end", ["succeeded", "failed", "cancelled"])
def test_transition_never_leaves_an_end_state(store, end):
    run = store.create_run("t", [], "local")
    store.transition(run.id, "running", from_states=["queued"])
    assert store.transition(run.id, end, from_states=["running"])
    for to in ("queued", "running", "succeeded", "failed", "cancelled"):
        assert not store.transition(run.id, to, from_states=[end, "running", "queued"])
    assert store.get_run(run.id).state == end


def test_transition_rejects_unknown_run_and_state(store):
    run = store.create_run("t", [], "local")
    with pytest.raises(StoreError):
        store.transition(run.id, "paused", from_states=["queued"])
    with pytest.raises(StoreError):
        store.transition(77, "running", from_states=["queued"])


def test_request_cancel_queued_running_and_finished(store):
    queued = store.create_run("t", [], "local")
    cancelled = store.request_cancel(queued.id)
    assert cancelled.state == "cancelled"
    assert cancelled.cancel_requested_at is not None and cancelled.finished_at is not None

    running = store.create_run("t", [], "local")
    store.transition(running.id, "running", from_states=["queued"])
    asked = store.request_cancel(running.id)
    assert asked.state == "running" and asked.cancel_requested_at is not None
    assert store.request_cancel(running.id).cancel_requested_at == asked.cancel_requested_at

    store.transition(running.id, "succeeded", from_states=["running"])
    assert store.request_cancel(running.id).state == "succeeded"


def test_claim_next_queued_by_backend(store):
    a = store.create_run("t", [], "local")
    b = store.create_run("t", [], "lab")
    claimed = store.claim_next_queued(backend="lab", step="waiting for the agent")
    assert claimed.id == b.id and claimed.state == "running"
    assert claimed.started_at is not None and claimed.step == "waiting for the agent"
    assert store.claim_next_queued(backend="lab") is None
    assert store.claim_next_queued().id == a.id
    assert store.claim_next_queued() is None


def test_heartbeat(store):
    run = store.create_run("t", [], "local")
    store.heartbeat(run.id)
    assert abs(store.get_run(run.id).heartbeat_at - time.time()) < 5


# -- events ------------------------------------------------------------------

def test_events_in_order_with_after_and_per_run_seqs(store):
    a = store.create_run("t", [], "local")
    b = store.create_run("t", [], "local")
    assert [store.add_event(a.id, "log", {"message": str(i)}) for i in range(3)] == [1, 2, 3]
    assert store.add_event(b.id, "progress", {"step": 1}) == 1
    events = store.events(a.id)
    assert [(e.seq, e.kind, e.data["message"]) for e in events] == [
        (1, "log", "0"), (2, "log", "1"), (3, "log", "2")]
    assert [e.seq for e in store.events(a.id, after=1)] == [2, 3]
    assert events[0].t <= events[1].t <= events[2].t
    assert store.events(b.id)[0].data == {"step": 1}


def test_event_for_unknown_run_is_refused(store):
    with pytest.raises(StoreError):
        store.add_event(5, "log", {})


# -- tokens ------------------------------------------------------------------

def test_tokens_are_stored_hashed_and_verified(store, tmp_path):
    assert store.get_token("lab") is None
    assert not store.verify_token("lab", "anything")
    store.set_token("lab", hash_token("s3cret-token"))
    record = store.get_token("lab")
    assert record.token_hash == hash_token("s3cret-token") != "s3cret-token"
    assert record.last_seen is None
    assert store.verify_token("lab", "s3cret-token")
    assert not store.verify_token("lab", "s3cret-tokeN")
    assert not store.verify_token("other", "s3cret-token")
    store.touch_token("lab")
    assert store.get_token("lab").last_seen is not None
    # Registering again invalidates the old token.
    store.set_token("lab", hash_token("new"))
    assert not store.verify_token("lab", "s3cret-token")
    assert store.verify_token("lab", "new")
    assert b"s3cret-token" not in (tmp_path / "training" / "runs.db").read_bytes()


# -- migrations ----------------------------------------------------------------

def test_new_store_is_wal_and_at_latest_schema(store):
    assert store.schema_version == len(MIGRATIONS) >= 3
    assert store._conn().execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_v1_database_is_migrated_forward_without_losing_rows(tmp_path):
    path = tmp_path / "runs.db"
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS[0])
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO runs (trainer, schemas, backend, state, options, created_at)"
                 " VALUES ('t', '[\"a\"]', 'local', 'succeeded', '{}', 1.5)")
    conn.execute("INSERT INTO events (run_id, seq, t, kind, data) VALUES (1, 1, 2.0, 'log', '{}')")
    conn.execute("INSERT INTO tokens (backend, token_hash, created_at) VALUES ('lab', 'h', 3.0)")
    conn.commit()
    conn.close()

    store = Store(path)
    assert store.schema_version == len(MIGRATIONS)
    run = store.get_run(1)
    assert (run.state, run.schemas, run.created_at) == ("succeeded", ["a"], 1.5)
    assert (run.flow_pid, run.worker_pid) == (None, None)  # columns added by migration 3
    assert [e.seq for e in store.events(1)] == [1]
    assert store.get_token("lab").token_hash == "h"
    assert store.create_run("t", [], "local").id == 2
    store.close()


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "runs.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    conn.close()
    with pytest.raises(StoreError, match="newer than this Potato knows"):
        Store(path)


# -- concurrency -------------------------------------------------------------

N_RUNS = 15
N_EVENTS = 20


def _hammer(path: str, worker: int) -> list[int]:
    """Create runs, add events, transition and claim; the work of one writer."""
    store = Store(path)
    made = []
    for i in range(N_RUNS):
        run = store.create_run("t", [f"w{worker}"], "local", {"i": i})
        made.append(run.id)
        store.add_event(made[0], "log", {"worker": worker, "i": i})
        store.transition(run.id, "running", from_states=["queued"])
        store.heartbeat(run.id)
        store.claim_next_queued()
        store.transition(run.id, "succeeded", from_states=["running"])
    for i in range(N_EVENTS - N_RUNS):
        store.add_event(made[0], "log", {"worker": worker, "i": N_RUNS + i})
    store.close()
    return made


def _hammer_shared_run(path: str, run_id: int, count: int) -> None:
    store = Store(path)
    for i in range(count):
        store.add_event(run_id, "progress", {"i": i})
    store.close()


def test_threads_writing_at_once(tmp_path):
    path = str(tmp_path / "runs.db")
    store = Store(path)
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def work(n):
        try:
            results[n] = _hammer(path, n)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    shared = store.create_run("t", [], "local")
    store.transition(shared.id, "failed", from_states=["queued"])
    shared_threads = [threading.Thread(target=_hammer_shared_run, args=(path, shared.id, 25))
                      for _ in range(3)]
    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads + shared_threads:
        t.start()
    for t in threads + shared_threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads + shared_threads)
    assert errors == []
    made = [results[n] for n in range(4)]
    assert store.count_runs() == 1 + 4 * N_RUNS
    assert [e.seq for e in store.events(shared.id)] == list(range(1, 76))
    store.update_run(shared.id, state="succeeded")  # out of the way of the checks
    all_ids = [i for ids in made for i in ids]
    assert len(set(all_ids)) == len(all_ids) == 4 * N_RUNS
    for ids in made:
        assert [e.seq for e in store.events(ids[0])] == list(range(1, N_EVENTS + 1))
    assert store.active_runs() == []
    store.close()


def test_processes_writing_at_once(tmp_path):
    path = str(tmp_path / "runs.db")
    # spawn, not fork: each writer is a fresh interpreter, like the real
    # server, flow processes and CLI commands.
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        setup = Store(path)
        shared_id = setup.create_run("t", [], "local").id
        # Finished, so the writers' claim_next_queued leaves it alone.
        setup.transition(shared_id, "failed", from_states=["queued"])
        setup.close()
        shared = pool.starmap_async(_hammer_shared_run, [(path, shared_id, 25)] * 2)
        made = pool.starmap(_hammer, [(path, n) for n in range(4)], chunksize=1)
        shared.get(timeout=120)
    store = Store(path)
    assert [e.seq for e in store.events(shared_id)] == list(range(1, 51))
    all_ids = [i for ids in made for i in ids]
    assert len(set(all_ids)) == len(all_ids) == 4 * N_RUNS
    assert store.count_runs() == 1 + 4 * N_RUNS
    for ids in made:
        assert [e.seq for e in store.events(ids[0])] == list(range(1, N_EVENTS + 1))
        assert all(store.get_run(i).state == "succeeded" for i in ids)
    assert store.active_runs() == []
    store.close()


def test_many_processes_opening_a_new_file_at_once(tmp_path):
    path = str(tmp_path / "fresh.db")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        pool.starmap(_open_and_create, [(path,)] * 8, chunksize=1)
    store = Store(path)
    assert store.schema_version == len(MIGRATIONS)
    assert store.count_runs() == 8
    store.close()


def _open_and_create(path: str) -> None:
    store = Store(path)
    store.create_run("t", [], "local")
    store.close()


# -- at rest -----------------------------------------------

def _mode(path) -> int:
    import os
    import stat

    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_store_its_wal_and_shm_are_readable_by_the_owner_only(tmp_path):
    import os

    old = os.umask(0o022)  # what a plain shell gives: the store must not depend on the caller's umask
    try:
        with Store(tmp_path / "runs.db") as store:
            store.create_run("t", [], "local")
            files = [tmp_path / "runs.db", tmp_path / "runs.db-wal", tmp_path / "runs.db-shm"]
            assert [_mode(f) for f in files] == [0o600] * 3
    finally:
        os.umask(old)


def test_a_store_left_world_readable_by_an_older_version_is_tightened(tmp_path):
    with Store(tmp_path / "runs.db") as store:
        store.create_run("t", [], "local")
    (tmp_path / "runs.db").chmod(0o644)
    with Store(tmp_path / "runs.db") as store:
        assert store.get_run(1).id == 1
    assert _mode(tmp_path / "runs.db") == 0o600


def test_open_store_makes_the_training_directory_private(tmp_path):
    from potato.config import load_config
    from potato.runs.paths import open_store, run_paths
    from potato.runs.queue import create_run
    from tests.support.potato_project import make_project

    cfg = load_config(make_project(tmp_path, n_items=4, model_training={"enabled": True}))
    cfg.training_dir.mkdir(parents=True, exist_ok=True)
    cfg.training_dir.chmod(0o755)  # as earlier versions left it
    store = open_store(cfg)
    run = create_run(cfg, store)
    assert _mode(cfg.training_dir) == 0o700
    assert _mode(run_paths(cfg, run.id).dir) == 0o700
    assert _mode(cfg.training_dir / "runs.db") == 0o600


def test_a_second_store_in_one_process_does_not_blind_the_first(tmp_path):
    """Opening the file again must not drop this process's SQLite locks (a close() of any fd drops them).

    Else another process's last connection takes the file as its own and deletes
    the WAL; a process that keeps writing (a flow) then writes a new WAL that the
    first Store, still reading the deleted one, never sees.
    """
    import subprocess
    import sys

    path = tmp_path / "runs.db"
    first = Store(path)
    assert first.count_runs() == 0
    Store(path)  # e.g. the flow's after_flow, a test's store_of beside the server's own
    create = "s.create_run('hf-text-classification', ['sentiment'], 'local')"
    subprocess.run([sys.executable, "-c", f"import sys; from potato.runs.store import Store; s = Store(sys.argv[1]); "
                    f"{create}; s.close()", str(path)], check=True, timeout=60)
    # A writer that stays connected, as a flow process does while its run trains.
    stays = subprocess.Popen([sys.executable, "-c", f"import sys; from potato.runs.store import Store; "
                              f"s = Store(sys.argv[1]); {create}; print('written', flush=True); sys.stdin.read()",
                              str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert stays.stdout.readline().strip() == "written"
        assert first.count_runs() == 2
    finally:
        stays.communicate("", timeout=60)


# -- which flow run executes a run ------------------------------------------------------------------


def test_a_flow_run_records_itself_only_on_a_run_without_one_or_its_own(store):
    from potato.errors import NotThisFlowRun

    run = store.create_run("t", ["s"], "local")
    store.transition(run.id, "running", from_states="queued")
    assert store.record_flow(run.id, "owner", 1000).prefect_flow_run_id == "owner"
    assert store.record_flow(run.id, "owner", 2000).flow_pid == 2000  # a Prefect retry, in a new process
    before = store.get_run(run.id)
    with pytest.raises(NotThisFlowRun) as caught:
        store.record_flow(run.id, "intruder", 3000)
    assert str(caught.value) == (
        f"Run {run.id} belongs to flow run owner (run-{run.id} in the Prefect UI); this flow run (intruder) changed "
        "nothing and stops. To train again, start a new run (the Training page, potato training run, or prefect "
        "deployment run without run_id)")
    assert store.get_run(run.id) == before

    dispatched = store.create_run("t", ["s"], "local")  # the dispatcher's child has not recorded its flow run yet
    store.update_run(dispatched.id, flow_pid=4000)
    with pytest.raises(NotThisFlowRun, match=r"^Run 2 belongs to the flow process 4000; this flow run \(intruder\)"):
        store.record_flow(dispatched.id, "intruder", 3000)
    assert store.record_flow(dispatched.id, "child", 4000).prefect_flow_run_id == "child"
    store.transition(run.id, "succeeded", from_states="running")
    assert store.record_flow(run.id, "owner", 5000).flow_pid == 2000  # an ended run is not written to


def test_a_run_its_flow_adopted_is_not_the_dispatchers_and_starts_only_when_no_run_runs(store):
    adopted = store.create_run("t", ["s"], "local")
    assert store.adopt(adopted.id, "flow-1", 1000, step="waiting for this project's turn")
    assert not store.adopt(adopted.id, "flow-2", 2000)
    plain = store.create_run("t", ["s"], "local")
    assert store.next_queued().id == plain.id and store.waiting_flow_runs() == [store.get_run(adopted.id)]
    assert store.claim_next_queued(only_when_idle=True).id == plain.id
    assert store.start(adopted.id).state == "queued"  # run 2 is running
    store.transition(plain.id, "succeeded", from_states="running")
    started = store.start(adopted.id)
    assert started.state == "running" and started.started_at is not None
