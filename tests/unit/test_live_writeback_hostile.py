"""The live writeback against the people who fill the watched data_directory, and against what goes wrong.

A data provider has write access to ``data_directory`` — that is what it is
for — so each test here plays one: a link planted at the temporary's name
(as root and as an unprivileged server), a data file linked out of the
directory, hard-linked, read-only or someone else's, a feed appending while
the writeback rewrites, a record that brings its own ``predictions``. And
what goes wrong without anyone meaning it: a first writeback killed between
two files, a CSV the run cannot read, a full disk.

Real files, real processes (a forked server process that drops to the
unprivileged test user), the real writeback; no Potato 2.12 here.
Cost: about 10 s in all (the tmpfs case is skipped where mount is refused).
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import signal
import stat
import subprocess
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

import pytest
import yaml

from potato.config import load_config
from potato.errors import RetractError
from potato.items.live_items import MARKER
from potato.results.live_writeback import catch_up, sync_reported
from potato.results.retract import retract
from potato.runs.paths import open_store
from potato.validate import validate_config_file
from tests.support.live_project import record_run, snapshot, tickets_config, written_back_project
from tests.support.service_fixtures import TEST_USER, _ensure_user

PROVIDER = "potatofeed"  # the second account: it fills the data directory
VICTIM_BYTES = b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHv the server's own key\n"


def _ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def _changed_lines(log: list[str]) -> list[str]:
    return [line for line in log if line.startswith("Live writeback: ")]


@pytest.fixture(scope="module")
def accounts():
    """The unprivileged server's account and the data provider's (made as the service fixtures make theirs)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make the accounts and to switch to them")
    for user in (TEST_USER, PROVIDER):
        _ensure_user(user)
    return pwd.getpwnam(TEST_USER), pwd.getpwnam(PROVIDER)


@pytest.fixture
def shared_root(accounts):
    """A directory both accounts can reach (pytest's own are root's, 0700)."""
    root = Path(tempfile.mkdtemp(prefix="potato-provider-"))
    root.chmod(0o755)
    yield root
    subprocess.run(["rm", "-rf", str(root)], check=False)


def _chown_tree(path: Path, account) -> None:
    for p in [path, *path.rglob("*")]:
        os.lchown(p, account.pw_uid, account.pw_gid)


_ask_parent: Callable[[], None] = lambda: None


def _as(account, work: Callable[[], object], on_request: Callable[[int], None] = lambda pid: None) -> object:
    """*work()*'s result, run in a forked process that is *account* (the server as an unprivileged user).
    The child may call ``_ask_parent()``: *on_request(its pid)* then runs here, as root, while it waits."""
    req_r, req_w = os.pipe()
    ack_r, ack_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            for fd in (req_r, ack_w, out_r):
                os.close(fd)
            global _ask_parent
            _ask_parent = lambda: (os.write(req_w, b"?"), os.read(ack_r, 1))  # noqa: E731
            os.setgroups([])
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
            result = work()
            os.write(out_w, json.dumps(result).encode())
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    for fd in (req_w, ack_r, out_w):
        os.close(fd)

    def serve() -> None:
        while os.read(req_r, 1):
            on_request(pid)
            os.write(ack_w, b"!")

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    with os.fdopen(out_r, "rb") as out:
        data = out.read()
    _, status = os.waitpid(pid, 0)
    server.join(10)
    for fd in (req_r, ack_w):
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, "the server process failed (its traceback is above)"
    return json.loads(data)


def _plant_links(directory: Path, name: str, victim: Path, owner, pid: int) -> list[Path]:
    """Links to *victim* at the names a writer of *name* could use: the one an earlier version used (its
    pid) and the one the first random name will be (made known here: the worst case)."""
    planted = [directory / f".{name}.live-{pid}.tmp", directory / f".{name}.live-{'0' * 16}.tmp"]
    for link in planted:
        link.symlink_to(victim)
        os.lchown(link, owner.pw_uid, owner.pw_gid)
    return planted


def _attacker_wins_the_race(monkeypatch, plant: Callable[[], None]) -> None:
    """*plant()* runs just before the writer creates its first temporary (after its clean-up of earlier
    ones): the moment an attacker watching the directory aims for."""
    real_open = os.open
    done = []

    def open_then(path, flags, mode=0o777, *, dir_fd=None):
        if not done and ".live-" in os.fspath(path):
            done.append(True)
            plant()
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", open_then)


@pytest.fixture
def guessable(monkeypatch):
    """The first temporary's random part is '000…0' (a forked child inherits it)."""
    names = iter(["0" * 16] + [os.urandom(8).hex() for _ in range(1000)])
    monkeypatch.setattr("secrets.token_hex", lambda n: next(names))


def _victim(path: Path, owner, mode: int = 0o600) -> tuple[bytes, int, int, int]:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(VICTIM_BYTES)
    os.chown(path, owner.pw_uid, owner.pw_gid)
    path.chmod(mode)
    st = os.stat(path)
    return path.read_bytes(), st.st_mode, st.st_uid, st.st_gid


def _as_it_was(path: Path) -> tuple[bytes, int, int, int]:
    st = os.lstat(path)
    return path.read_bytes(), st.st_mode, st.st_uid, st.st_gid


# -- a link planted at the temporary's name ------------------------------------------------------------


def test_a_link_planted_at_the_temporary_name_changes_nothing_of_root_s(accounts, shared_root, guessable,
                                                                        monkeypatch):
    """A server running as root (a container): the provider plants links to root's authorized_keys."""
    _, provider = accounts
    config = load_config(written_back_project(shared_root / "project", {"a.jsonl": _ids("a", 3)}))
    items = config.data_directory
    _chown_tree(items, provider)  # the provider's files, in the provider's directory
    victim = shared_root / "root-home" / ".ssh" / "authorized_keys"
    kept = _victim(victim, pwd.getpwnam("root"))
    planted: list[Path] = []
    _attacker_wins_the_race(monkeypatch, lambda: planted.extend(
        _plant_links(items, "a.jsonl", victim, provider, os.getpid())))
    said: list[str] = []
    catch_up(config, said.append)
    assert _as_it_was(victim) == kept
    assert said == [said[0]] and said[0].startswith(
        "Live writeback: 3 record(s) in 1 file(s) of items/ changed (items/a.jsonl 3) in ")
    data = os.lstat(items / "a.jsonl")
    assert stat.S_ISREG(data.st_mode) and (data.st_uid, data.st_gid) == (provider.pw_uid, provider.pw_gid)
    assert all(link.is_symlink() for link in planted)  # someone else's: left, never followed nor removed


def test_a_link_planted_at_the_temporary_name_changes_nothing_of_an_unprivileged_server_s(
        accounts, shared_root, guessable, monkeypatch):
    """A server running as its own account, whose data directory the provider can write too."""
    server, provider = accounts
    config = load_config(written_back_project(shared_root / "project", {"a.jsonl": _ids("a", 3)}))
    _chown_tree(shared_root / "project", server)
    config.data_directory.chmod(0o777)  # the provider writes here
    victim = shared_root / "server-home" / "runs.db"  # a file of the server's own account
    kept = _victim(victim, server)
    planted: list[Path] = []
    _attacker_wins_the_race(monkeypatch, lambda: _ask_parent())  # the provider plants; the server waits
    said = _as(server, lambda: [sync_reported(config).describe()], on_request=lambda pid: planted.extend(
        _plant_links(config.data_directory, "a.jsonl", victim, provider, pid)))
    assert _as_it_was(victim) == kept
    assert said[0].startswith("Live writeback: 3 record(s) in 1 file(s) of items/ changed (items/a.jsonl 3) in ")
    assert b'"predictions"' in (config.data_directory / "a.jsonl").read_bytes()
    assert all(link.is_symlink() for link in planted)


# -- files that are the provider's in a way a rewrite would break --------------------------------------


def test_a_data_file_linked_out_of_the_directory_is_not_live_and_is_never_rewritten(tmp_path):
    shared = tmp_path / "shared" / "dataset.jsonl"
    shared.parent.mkdir()
    shared.write_text("".join(json.dumps({"id": i, "text": i}) + "\n" for i in _ids("s", 2)))
    path = written_back_project(tmp_path / "project", {"a.jsonl": _ids("a", 2)})
    raw = yaml.safe_load(path.read_text())
    items = tmp_path / "project" / "items"
    (items / "shared.jsonl").symlink_to(shared)  # linked into this project (and another)
    with open(tmp_path / "project" / "annotations" / "training" / "predictions.jsonl", "a") as out:
        out.write("".join(json.dumps({"id": i, "predictions": {"tone": {"label": "calm", "confidence": 0.9,
                                                                       "run_id": 1}}}) + "\n" for i in _ids("s", 2)))
    config = load_config(path)
    before = shared.read_bytes()
    report = sync_reported(config)
    assert shared.read_bytes() == before and (items / "shared.jsonl").is_symlink()
    assert sorted(p.name for p in shared.parent.iterdir()) == ["dataset.jsonl"]  # no temporary beside it
    reason = ("in items/shared.jsonl, a symbolic link to a file outside the directory: the live writeback never "
              "rewrites where a link points (a file outside the directory may be another project's too); link "
              "the file's directory instead, or copy the file in")
    assert report.not_live == {reason: 2} and report.files == {"items/a.jsonl": 2}
    assert reason in report.describe()
    warnings = {w.path: w.message for w in validate_config_file(path, read_items=True).warnings}
    assert warnings["data_directory"] == (
        "items/shared.jsonl is a symbolic link to a file outside the directory: the live writeback never rewrites "
        "where a link points (a file outside the directory may be another project's too); link the file's "
        "directory instead, or copy the file in. Its items' predictions reach annotators only through "
        "pre_annotation.predictions_file, once Potato 2.12 restarts")
    assert raw["data_directory"] == "items"


def test_hard_linked_and_read_only_files_are_left_as_they_are(tmp_path):
    path = written_back_project(tmp_path / "project", {"a.jsonl": _ids("a", 2), "b.jsonl": _ids("b", 2)})
    items = tmp_path / "project" / "items"
    os.link(items / "a.jsonl", tmp_path / "elsewhere.jsonl")
    (items / "b.jsonl").chmod(0o444)
    before = snapshot(items)
    report = sync_reported(load_config(path))
    assert snapshot(items) == before and os.stat(items / "a.jsonl").st_nlink == 2
    assert stat.S_IMODE(os.stat(items / "b.jsonl").st_mode) == 0o444
    assert report.files == {} and report.not_live == {
        "in items/a.jsonl, hard-linked (2 names): a rewrite would be a new file, cut off from its other names; "
        "keep one name of it in the directory": 2,
        "in items/b.jsonl, read-only (mode 0444): its owner may not write it, so neither does the live "
        "writeback": 2}


def test_an_unprivileged_server_leaves_another_account_s_file_as_it_is(accounts, shared_root):
    server, provider = accounts
    config = load_config(written_back_project(shared_root / "project", {"a.jsonl": _ids("a", 2),
                                                                        "b.jsonl": _ids("b", 2)}))
    _chown_tree(shared_root / "project", server)
    items = config.data_directory
    items.chmod(0o777)
    os.chown(items / "b.jsonl", provider.pw_uid, provider.pw_gid)
    (items / "b.jsonl").chmod(0o666)  # the server could write it, but not give a new one back to its owner
    kept = _as_it_was(items / "b.jsonl")
    report = _as(server, lambda: sync_reported(config).as_dict())
    assert _as_it_was(items / "b.jsonl") == kept
    assert report["files"] == {"items/a.jsonl": 2} and report["not_live"] == {
        f"in items/b.jsonl, owned by another account (uid {provider.pw_uid}, gid {provider.pw_gid}), to which "
        f"this server's account (uid {server.pw_uid}) could not give the rewritten file back: its owner would "
        "lose write access to it; run Potato as the files' owner, or give the files to its account": 2}


# -- feeds that append ---------------------------------------------------------------------------------


def _feed(path: Path, ids: list[str]) -> None:
    """A feed that follows the rule: per batch open, flock, check it is still the file, append, close. Each
    batch takes a few milliseconds to write (its first half, then the rest)."""
    for item_id in ids:
        line = json.dumps({"id": item_id, "text": "fed"}).encode() + b"\n"
        while True:
            with open(path, "ab") as out:
                fcntl.flock(out, fcntl.LOCK_EX)
                if os.fstat(out.fileno()).st_ino != os.stat(path).st_ino:
                    continue  # the writeback replaced it meanwhile: open the name again
                out.write(line[:10])
                out.flush()
                time.sleep(0.003)
                out.write(line[10:])
                break


def test_a_feed_that_follows_the_rule_loses_no_item_while_the_writeback_rewrites(tmp_path):
    path = written_back_project(tmp_path / "project", {"a.jsonl": _ids("a", 2000)})
    config = load_config(path)
    data = config.data_directory / "a.jsonl"
    fed = _ids("fed", 300)
    feed = threading.Thread(target=_feed, args=(data, fed))
    with open((config.training_dir / "predictions.jsonl"), "rb") as fh:
        lines = fh.readlines()
    feed.start()
    rounds = 0
    while feed.is_alive() or rounds < 2:  # rewrites, each flipping every label, while the feed appends
        label = ("angry", "calm")[rounds % 2]
        (config.training_dir / "predictions.jsonl").write_bytes(b"".join(line.replace(b'"calm"', f'"{label}"'.encode()).replace(
            b'"angry"', f'"{label}"'.encode()) for line in lines))
        report = sync_reported(config)
        assert report.problems == [] and report.files, report.describe()
        rounds += 1
    feed.join()
    found = [json.loads(line)["id"] for line in data.read_bytes().splitlines()]
    assert found == _ids("a", 2000) + fed and rounds >= 2


def test_bytes_appended_to_the_old_file_while_it_is_renamed_are_put_back(tmp_path, monkeypatch):
    config = load_config(written_back_project(tmp_path / "project", {"a.jsonl": _ids("a", 3)}))
    data = config.data_directory / "a.jsonl"
    held = open(data, "ab")  # a feed that keeps the file open and appends without the lock
    real_replace = os.replace

    def append_then_replace(src, dst, **kwargs):
        if str(dst) == "a.jsonl":
            held.write(b'{"id": "late", "text": "appended during the rename"}\n')
            held.flush()
        return real_replace(src, dst, **kwargs)

    monkeypatch.setattr(os, "replace", append_then_replace)
    report = sync_reported(config)
    held.close()
    assert report.files == {"items/a.jsonl": 3}
    assert data.read_bytes().endswith(b'{"id": "late", "text": "appended during the rename"}\n')
    assert data.read_bytes().count(b'"predictions"') == 3


def test_a_file_whose_lock_a_feed_keeps_is_left_as_it_was_and_said(tmp_path, monkeypatch):
    import potato.results.live_writeback as live_writeback

    monkeypatch.setattr(live_writeback, "LOCK_WAIT_S", 0.3)
    config = load_config(written_back_project(tmp_path / "project", {"a.jsonl": _ids("a", 2),
                                                                      "b.jsonl": _ids("b", 2)}))
    with open(config.data_directory / "a.jsonl", "ab") as feed:
        fcntl.flock(feed, fcntl.LOCK_EX)
        before = (config.data_directory / "a.jsonl").read_bytes()
        report = sync_reported(config)
        assert (config.data_directory / "a.jsonl").read_bytes() == before
    assert report.files == {"items/b.jsonl": 2} and report.behind == ["items/a.jsonl"]
    assert report.describe().endswith(". Left as they were: items/a.jsonl (another program held its lock for 0.3 s)")


# -- a first writeback killed between two files ---------------------------------------------------------


def _killed_after_first_file(config) -> None:
    """Run the live writeback in a child process that SIGKILLs itself as it starts to replace its second file."""
    import potato.results.live_writeback as live_writeback

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            real = live_writeback._replace
            calls = []

            def replace_or_die(*args, **kwargs):
                calls.append(1)
                if len(calls) == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(*args, **kwargs)

            live_writeback._replace = replace_or_die
            live_writeback.sync_items(config)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_a_first_writeback_killed_between_two_files_is_finished_by_the_next(tmp_path):
    config = load_config(written_back_project(tmp_path / "project", {"a.jsonl": _ids("a", 2),
                                                                      "b.jsonl": _ids("b", 3)}))
    _killed_after_first_file(config)
    items = config.data_directory
    assert b'"predictions"' in (items / "a.jsonl").read_bytes()  # the first file was done, the second not
    assert b'"predictions"' not in (items / "b.jsonl").read_bytes()
    said: list[str] = []
    catch_up(config, said.append)  # what potato start does
    assert len(said) == 1 and said[0].startswith(
        "Live writeback: 3 record(s) in 1 file(s) of items/ changed (items/b.jsonl 3) in "), said
    marker = json.loads((config.training_dir / MARKER).read_text())
    assert marker == {"field": "predictions", "ids": sorted(_ids("a", 2) + _ids("b", 3))}


def test_a_retract_after_a_killed_writeback_takes_the_predictions_off_every_record(tmp_path):
    config = load_config(written_back_project(tmp_path / "project", {"a.jsonl": _ids("a", 2),
                                                                      "b.jsonl": _ids("b", 3)}))
    store = open_store(config)
    store.create_run("hf-text-classification", ["tone"], "local")
    store.update_run(1, state="succeeded")
    before = snapshot(config.data_directory)
    _killed_after_first_file(config)
    result = retract(config, store, 1)
    assert result.describe() == ("Run 1's predictions were retracted: annotators now see no predictions of "
                                 "tone, within 2 s (watch_poll_interval)")
    assert snapshot(config.data_directory) == before


def test_a_retract_that_cannot_bring_the_records_along_fails_naming_the_files(tmp_path, monkeypatch):
    import potato.results.live_writeback as live_writeback

    monkeypatch.setattr(live_writeback, "LOCK_WAIT_S", 0.2)
    config = load_config(written_back_project(tmp_path / "project", {"a.jsonl": _ids("a", 2),
                                                                      "b.jsonl": _ids("b", 3)}))
    store = open_store(config)
    store.create_run("hf-text-classification", ["tone"], "local")
    store.update_run(1, state="succeeded")
    sync_reported(config)
    with open(config.data_directory / "a.jsonl", "ab") as feed:
        fcntl.flock(feed, fcntl.LOCK_EX)
        with pytest.raises(RetractError) as refused:
            retract(config, store, 1)
    assert str(refused.value) == (
        "Run 1's predictions were retracted from the writeback file, but the records of items/a.jsonl may still "
        "hold them, where annotators see them: items/a.jsonl (another program held its lock for 0.2 s). Fix "
        "that, then retract run 1 again")
    assert b'"predictions"' in (config.data_directory / "a.jsonl").read_bytes()
    again = retract(config, store, 1)
    assert again.describe() == ("Run 1's predictions were already retracted from the writeback file; the items' "
                                "records that still held them no longer do, within 2 s (watch_poll_interval)")
    assert b'"predictions"' not in (config.data_directory / "a.jsonl").read_bytes()


# -- what the writeback cannot read or write --------------------------------------------------------------


@pytest.mark.parametrize("bad", ["cell", "encoding"])
def test_a_csv_the_run_cannot_read_is_reported_and_a_failed_run_can_still_be_retracted(tmp_path, bad):
    config_path = tickets_config(tmp_path)
    tickets = tmp_path / "tickets"
    config, store, _ = record_run(tmp_path, config_path, 1, {"t4": ("calm", 0.9)})
    # Dropped into the directory while run 2 trains: a cell past the csv module's 128 kB, or not UTF-8.
    content = (b'id,text\nt20,"' + b"x" * 200_000 + b'"\n') if bad == "cell" else b"id,text\nt20,caf\xe9\n"
    config, store, (_, live) = record_run(tmp_path, config_path, 2, {"t4": ("angry", 0.9), "t6": ("angry", 0.9)},
                                          meanwhile=lambda: (tickets / "d.csv").write_bytes(content))
    problem = ("tickets/d.csv line 1: not valid CSV: field larger than field limit (131072)" if bad == "cell" else
               "tickets/d.csv: not UTF-8 text (invalid continuation byte); save it as UTF-8, or name its encoding "
               "in the config (data_files: [{path: ..., encoding: latin-1}])")
    assert live.files == {"tickets/a.jsonl": 2} and live.problems == [problem] and live.behind == []
    assert live.describe().endswith(f". Left as they were: {problem}")
    store.update_run(2, state="failed")  # a run that failed after its predictions were written back
    result = retract(config, store, 2)
    assert result.describe() == ("Run 2's predictions were retracted: annotators now see run 1's predictions of "
                                 "tone, within 2 s (watch_poll_interval)")


def test_a_later_record_s_own_field_is_reported_and_kept(tmp_path):
    config = load_config(written_back_project(tmp_path / "project", {"a.jsonl": _ids("a", 2)}))
    sync_reported(config)
    data = config.data_directory / "a.jsonl"
    with open(data, "ab") as out:  # a record the writeback never wrote, with a field of its own
        out.write(b'{"id": "a9", "text": "imported", "predictions": {"tone": "mine"}}\n')
    (config.training_dir / "predictions.jsonl").write_text("")  # say, every prediction retracted
    report = sync_reported(config)
    assert b'{"id": "a9", "text": "imported", "predictions": {"tone": "mine"}}\n' in data.read_bytes()
    assert data.read_bytes().count(b'"predictions"') == 1
    assert report.problems == ["items/a.jsonl line 3: item 'a9' holds a field 'predictions' that the live "
                               "writeback never wrote; left as it is"]
    # A marker from before the list keeps its meaning: every record's field is the writeback's.
    (config.training_dir / MARKER).write_text(json.dumps({"field": "predictions"}) + "\n")
    report = sync_reported(config)
    assert report.problems == [] and data.read_bytes().count(b'"predictions"') == 0


def test_a_full_disk_is_said_as_what_happened(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounts a tmpfs")
    config = load_config(written_back_project(tmp_path / "project", {"a.jsonl": _ids("a", 2000)}))
    items = config.data_directory
    saved = {p.name: p.read_bytes() for p in items.iterdir()}
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(items)]).returncode != 0:
        pytest.skip("mount -t tmpfs is refused here")
    try:
        for name, data in saved.items():
            (items / name).write_bytes(data)
        try:  # the rest of the disk
            with open(items / "filler", "wb") as filler:
                while True:
                    filler.write(b"\0" * 4096)
                    filler.flush()
        except OSError:
            pass
        before = snapshot(items)
        report = sync_reported(config)
        assert snapshot(items) == before
        assert report.describe() == ("Live writeback: no file of items/ was changed, because of problems. Left "
                                     "as they were: items/a.jsonl (No space left on device)")
    finally:
        subprocess.run(["umount", "-l", str(items)], check=False)
