"""The backoff schedule and the retry loop the Redis source and the object-store output share,
with the random factor and the sleep injected: every delay is known in advance."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tfrecordd import plugin
from tfrecordd.retry import Backoff, retrying

pytestmark = pytest.mark.anyio


def _randoms(*values: float) -> Iterator[float]:
    yield from values


def test_delays_double_from_first_up_to_the_cap_and_restart_after_a_reset() -> None:
    backoff = Backoff(0.1, 1.0)
    delays = [backoff.next() for _ in range(7)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    assert backoff.failures == 7
    backoff.reset()
    assert backoff.failures == 0
    assert backoff.next() == pytest.approx(0.1)


def test_a_cap_below_the_first_delay_is_the_delay() -> None:
    backoff = Backoff(0.1, 0.05)
    assert [backoff.next() for _ in range(3)] == [0.05, 0.05, 0.05]


def test_jitter_scales_each_delay_within_its_fraction() -> None:
    # The object store's schedule: 0.5s doubling to 15s, each delay 50% to 100% of its step.
    draws = [0.0, 0.5, 0.999, 0.25, 0.0, 0.75, 0.1]
    it = _randoms(*draws)
    backoff = Backoff(0.5, 15.0, jitter=0.5, random=lambda: next(it))
    delays = [backoff.next() for _ in draws]
    steps = [0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0]
    assert delays == pytest.approx([s * (0.5 + 0.5 * r) for s, r in zip(steps, draws, strict=True)])
    assert delays[0] == pytest.approx(0.25), "a draw of 0 halves the step"


def test_a_long_outage_neither_overflows_nor_passes_the_cap() -> None:
    backoff = Backoff(0.1, 10.0, jitter=1.0, random=lambda: 0.999)
    for _ in range(5000):
        delay = backoff.next()
    assert 0 < delay <= 10.0
    assert backoff.failures == 5000


def test_jitter_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="jitter"):
        Backoff(0.1, 1.0, jitter=1.5)


async def test_retrying_sleeps_the_schedule_logs_each_failure_and_returns_the_result(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "tfrecordd.retry")
    outcomes: list[Exception | int] = [OSError("refused"), ConnectionError("reset"), 7]
    slept: list[float] = []

    async def call() -> int:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def sleep(delay: float) -> None:
        slept.append(delay)

    backoff = Backoff(0.1, 10.0)
    assert await retrying(call, backoff, retry_on=(OSError,), what="XACK", sleep=sleep) == 7
    assert slept == pytest.approx([0.1, 0.2])
    assert backoff.failures == 0, "reset after the success"
    assert [r.getMessage() for r in caplog.records] == [
        "XACK failed (refused); retrying in 0.1s",
        "XACK failed (reset); retrying in 0.2s",
    ]


async def test_retrying_lets_other_errors_through_at_once() -> None:
    slept: list[float] = []

    async def call() -> int:
        raise KeyError("a bug")

    async def sleep(delay: float) -> None:
        slept.append(delay)

    with pytest.raises(KeyError):
        await retrying(call, Backoff(0.1, 1.0), retry_on=(OSError,), what="x", sleep=sleep)
    assert slept == []


def test_plugins_reach_the_helper_through_the_plugin_surface() -> None:
    assert plugin.Backoff is Backoff
    assert plugin.retrying is retrying
