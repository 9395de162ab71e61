"""A source's state as it reports it (``SourceState``), the rate-limited warnings of a lasting
trouble (``logs.Repeated``), and how the daemon shows both: ``/readyz``'s answer and the
``tfrecordd_source_*`` metrics."""

from __future__ import annotations

import json
import logging

import pytest

from tests.support import metric_sum
from tfrecordd.cli.health import describe_state, source_state
from tfrecordd.logs import Repeated
from tfrecordd.metrics import Metrics, readiness
from tfrecordd.plugin import SourceState
from tfrecordd.testing import RecordingContext


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_repeated_logs_the_first_then_once_a_minute_with_what_it_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    log = logging.getLogger("test.repeated")
    caplog.set_level(logging.INFO, "test.repeated")
    r = Repeated(log, 60.0, clock=clock)
    assert not r.active
    r.ended("over")  # nothing was going on: nothing logged
    for _ in range(6):  # a retry every 10 s
        r.warning("redis down: %s", "refused")
        clock.now += 10
    assert r.warning("redis down: %s", "refused")  # a minute after the first: logged
    clock.now += 10
    assert not r.warning("redis down: %s", "refused")
    assert caplog.messages == [
        "redis down: refused",
        "redis down: refused (for 60s now; 5 like it not logged)",
    ]
    clock.now += 5
    r.ended("redis back")
    assert caplog.messages[-1] == "redis back (after 75.0s and 8 failure(s))"
    # The end at the trouble's level: an operator who sees only warnings sees it too.
    assert [rec.levelname for rec in caplog.records] == ["WARNING", "WARNING", "WARNING"]
    assert not r.active
    shown = len(caplog.messages)
    for _ in range(5):  # flapping: down and up again within the minute
        assert not r.warning("down again")
        r.ended("back")
        clock.now += 2
    assert len(caplog.messages) == shown, "a flap is held to the limit, its end not logged alone"
    clock.now += 60
    assert r.warning("down again")  # the next one logged says how many were left out
    assert caplog.messages[-1] == "down again (for 0s now; 6 like it not logged)"
    r.ended("back")
    clock.now += 61
    assert r.warning("down once more")  # a trouble after a quiet minute: logged as it is
    assert caplog.messages[-2:] == [
        "back (after 0.0s and 1 failure(s))",
        "down once more",
    ]


def test_state_tracks_what_is_down_since_when_and_the_reconnect_attempts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    changes: list[tuple[bool, str | None]] = []
    st = SourceState("events", on_change=lambda s, f: changes.append((s.up, f)), clock=clock)
    caplog.set_level(logging.INFO, "tfrecordd.plugin")
    assert st.up
    assert st.down_for("reading") == 0.0
    st.mark_down("connection refused", "reading")
    clock.now += 1
    st.mark_down("connection reset", "reading")  # a failed retry
    st.mark_down("XACK: refused", "acking")
    assert not st.up
    assert st.since == 1000.0
    assert st.down == {"reading": ("connection reset", 1000.0), "acking": ("XACK: refused", 1001.0)}
    assert st.reconnects == 1
    clock.now += 4
    assert st.down_for("reading") == 5.0
    assert st.down_for("acking") == 4.0
    st.mark_up("reading")
    assert not st.up, "acking is still down"
    st.mark_up("acking")
    st.mark_up("acking")  # not down: nothing happens
    assert st.up
    assert st.since == 1005.0
    assert st.reconnects == 3
    assert (st.last_error, st.last_error_at) == ("XACK: refused", 1001.0)
    assert changes == [
        (False, "reading"),
        (False, "reading"),
        (False, "acking"),
        (False, None),
        (True, None),
    ]
    assert caplog.messages == [
        "source events: reading failed: connection refused",
        "source events: acking failed: XACK: refused",
        "source events: reading works again (after 5.0s and 2 failure(s))",
        "source events: acking works again (after 4.0s and 1 failure(s))",
    ]


def test_a_context_that_never_reports_is_up() -> None:
    ctx = RecordingContext(name="quiet")
    assert ctx.source_state.up
    assert ctx.source_state.name == "quiet"
    ctx.mark_down("cannot list /spool: Permission denied")
    assert ctx.source_state.down["reading"][0] == "cannot list /spool: Permission denied"
    ctx.mark_up()
    assert ctx.source_state.up


def test_readyz_names_each_source_not_ready_and_why() -> None:
    up, down = SourceState("spool"), SourceState("events")
    assert readiness(True, [up, down]) == (True, readiness(True, [up, down])[1])
    down.mark_down("redis stream events: Connection refused", "reading")
    ok, body = readiness(True, [up, down])
    answer = json.loads(body)
    assert not ok
    assert answer["ready"] is False
    assert answer["healthy"] is True
    assert answer["not_ready"] == [
        "source events: reading: redis stream events: Connection refused"
    ]
    assert answer["sources"]["spool"]["up"] is True
    assert answer["sources"]["events"]["down"]["reading"]["reason"].endswith("Connection refused")
    ok, body = readiness(False, [up])
    assert not ok
    assert json.loads(body)["not_ready"][0].startswith("daemon: ")


def test_status_describes_the_state_readyz_gives() -> None:
    clock = Clock(1_800_000_000.0)
    st = SourceState("events", clock=clock)
    assert describe_state(source_state(None), clock.now) == "-"
    assert describe_state(source_state(st.as_dict()), clock.now) == "up"
    st.mark_down("Connection refused", "reading")
    clock.now += 1
    st.mark_down("Connection refused", "reading")
    shown = describe_state(source_state(json.loads(json.dumps(st.as_dict()))), clock.now + 41)
    assert shown == (
        "DOWN for 42s (since 2027-01-15T08:00:00Z), 1 reconnect attempt: "
        "reading: Connection refused"
    )
    st.mark_up("reading")
    assert describe_state(source_state(st.as_dict()), clock.now) == (
        "up (2 reconnect attempts, last error: Connection refused)"
    )


def test_metrics_follow_the_state() -> None:
    m = Metrics()
    st = SourceState("events", on_change=m.show_source)
    m.show_source(st)
    r = m.registry
    assert metric_sum(r, "tfrecordd_source_up", source="events") == 1
    st.mark_down("refused", "reading")
    st.mark_down("refused", "reading")
    st.mark_down("XACK refused", "acking")
    assert metric_sum(r, "tfrecordd_source_up", source="events") == 0
    assert metric_sum(r, "tfrecordd_source_errors_total", source="events", what="reading") == 2
    assert metric_sum(r, "tfrecordd_source_errors_total", source="events", what="acking") == 1
    assert metric_sum(r, "tfrecordd_source_last_error_timestamp_seconds") == st.last_error_at
    st.mark_up("reading")
    assert metric_sum(r, "tfrecordd_source_up", source="events") == 0
    st.mark_up("acking")
    assert metric_sum(r, "tfrecordd_source_up", source="events") == 1
    assert metric_sum(r, "tfrecordd_source_reconnects_total", source="events") == 3
