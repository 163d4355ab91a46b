"""The agent's side of the protocol's contract: which claims it takes, what each answer means."""

from __future__ import annotations

import pytest

from potato.training.agent import _after_refusal
from potato.training.claims import BadClaim, check_claim
from potato.training.client import Link, Offline, ProtocolError, Unreachable, is_gone, is_transient
from tests.support.claims import make_claim


def test_a_claim_as_the_server_sends_it_is_taken():
    assert check_claim(make_claim()) == make_claim()
    assert check_claim(make_claim(bundle_sha256="ab" * 32, grace_seconds=0))["grace_seconds"] == 0


@pytest.mark.parametrize("changes, message, reportable", [
    ({"run_id": "../x"}, "run_id is '../x'; expected a positive whole number", False),
    ({"run_id": 1.0}, "run_id is '1.0'; expected a positive whole number", False),
    ({"urls": None}, "urls is 'None'; expected an object with status, events, predictions, result", False),
    ({"urls": dict(make_claim()["urls"], result="/training/agent/v1/runs/8/result")},
     "urls.result is '/training/agent/v1/runs/8/result'; expected a path on this server under /runs/7/", False),
    ({"urls": dict(make_claim()["urls"], events="/training/agent/v1/runs/7/../../8/events")},
     "urls.events is", False),
    ({"bundle_url": "/training/agent/v1/runs/7/bundle.tar.gz\r\nX-Evil: 1"}, "bundle_url is", True),
    ({"bundle_bytes": -1}, "bundle_bytes is -1; expected a whole number of bytes", True),
    ({"grace_seconds": float("inf")}, "grace_seconds is inf; expected a number of seconds from 0 to 604800", True),
    ({"grace_seconds": "20"}, "grace_seconds is '20'; expected a number of seconds", True),
    ({"job": "rm -rf /"}, "job is 'rm -rf /'; expected the worker's job.json as an object", True),
    ({"job": {"trainer": 3}}, "job.trainer is 3; expected a trainer's name", True),
    ({"job": {"trainer": "t", "schemas": "sentiment"}}, "job.schemas is 'sentiment'; expected a list", True),
    ({"job": {"trainer": "t", "options": []}}, "job.options is []; expected an object", True),
])
def test_a_bad_claim_is_refused_naming_the_field(changes, message, reportable):
    with pytest.raises(BadClaim) as caught:
        check_claim(make_claim(**changes))
    assert str(caught.value).startswith(message)
    # Once run_id and urls are sound, the refusal can be reported to the run; before, it cannot.
    assert (caught.value.run_id == 7) is reportable


@pytest.mark.parametrize("exc, transient, gone", [
    (Unreachable("ConnectionRefusedError"), True, False),
    *[(ProtocolError(status, "x"), True, False) for status in (429, 500, 502, 503, 504)],
    *[(ProtocolError(status, "x"), False, True) for status in (401, 403, 404, 409, 410)],
    (ProtocolError(400, "bad event"), False, False),
    (ProtocolError(413, "too large"), False, False),
])
def test_what_each_answer_means(exc, transient, gone):
    assert (is_transient(exc), is_gone(exc)) == (transient, gone)


def _events(*seqs):
    return [{"seq": s, "type": "log", "message": str(s)} for s in seqs]


def test_a_refused_event_is_dropped_and_only_what_follows_it_sent_again():
    batch = [{"type": "log", "message": "a SLURM note, no seq"}, *_events(4, 5, 6, 7)]
    refused = ProtocolError(400, "events[3].loss is 'x'", {"seq": 6, "last_seq": 5})
    assert _after_refusal(7, batch, refused) == _events(7)


def test_events_already_stored_are_not_sent_again():
    refused = ProtocolError(400, "bad", {"seq": 5, "last_seq": 8})  # a retry: 6..8 landed earlier
    assert _after_refusal(7, _events(4, 5, 6, 7, 8, 9), refused) == _events(9)


@pytest.mark.parametrize("answer", [{}, {"seq": None}, {"seq": 99, "last_seq": 3}])
def test_a_refusal_that_names_no_event_of_the_batch_drops_the_batch(answer):
    assert _after_refusal(7, _events(1, 2), ProtocolError(400, "bad", answer)) == []
    assert _after_refusal(7, _events(1, 2), ProtocolError(413, "too large", {"seq": 1})) == []


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_backoff_doubles_to_thirty_seconds_and_honours_retry_after():
    clock = Clock()
    link = Link(limit_s=300, clock=clock)
    waits = [link.missed(Unreachable("down")) for _ in range(7)]
    assert waits == [1, 2, 4, 8, 16, 30, 30]
    assert not link.due() and not link.offline()
    assert link.missed(ProtocolError(503, "busy", retry_after=3)) == 3
    clock.now += 3
    assert link.due()
    clock.now += 300
    assert link.offline()
    link.reached()
    assert (link.failures, link.offline(), link.due()) == (0, False, True)


def test_call_retries_transient_trouble_and_gives_up_past_the_limit(monkeypatch):
    clock = Clock()
    monkeypatch.setattr("potato.training.client.time.sleep", lambda s: setattr(clock, "now", clock.now + s))
    link = Link(limit_s=10, clock=clock)
    answers = iter([ProtocolError(503, "busy", retry_after=1), Unreachable("reset"), {"ok": True}])

    def request():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert link.call(request) == {"ok": True} and link.failures == 0
    with pytest.raises(Offline):
        link.call(lambda: (_ for _ in ()).throw(Unreachable("down")))
    with pytest.raises(ProtocolError):  # not transient: raised as it comes
        link.call(lambda: (_ for _ in ()).throw(ProtocolError(409, "over")))
