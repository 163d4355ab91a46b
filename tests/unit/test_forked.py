"""potato.annotations.forked: a child's result comes back; any failure is ForkFailed; no child outlives close()."""

from __future__ import annotations

import os
import time

import pytest

from potato.annotations.forked import Forked, ForkFailed, can_fork

pytestmark = pytest.mark.skipif(not can_fork(), reason="forks only on Linux")


def _raise() -> None:
    raise ValueError("no")


def _die() -> None:
    os.kill(os.getpid(), 9)


def _sleep() -> None:
    time.sleep(60)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_childs_return_value_comes_back():
    with Forked(sum, range(1_000_000)) as child:
        assert child.result() == sum(range(1_000_000))


def test_a_large_result_comes_through_the_pipe():
    with Forked(bytes, 5 << 20) as child:
        assert child.result() == bytes(5 << 20)


@pytest.mark.parametrize("fn", [_raise, _die, lambda: (lambda: 1)], ids=["raises", "killed", "unpicklable"])
def test_a_child_without_a_result_is_fork_failed(fn):
    child = Forked(fn)
    pid = child.pid
    with pytest.raises(ForkFailed):
        child.result()
    assert _gone(pid)


def test_close_kills_and_reaps_a_running_child():
    child = Forked(_sleep)
    pid = child.pid
    child.close()
    assert _gone(pid)
    with pytest.raises(ForkFailed):
        child.result()


def test_a_result_counts_though_something_else_reaped_the_child():
    # An asyncio child watcher may waitpid(-1) any child; the complete pickle still counts.
    child = Forked(int, "7")
    os.waitpid(child.pid, 0)
    assert child.result() == 7


def test_close_leaves_alone_a_child_someone_else_reaped():
    child = Forked(int, "7")
    os.waitpid(child.pid, 0)  # its pid is free now: close() must not signal it
    child.close()
    assert child.pid is None and child.read_fd is None
