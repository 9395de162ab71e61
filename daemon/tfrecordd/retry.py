"""Retrying with capped exponential backoff: the one schedule of delays the Redis source and the
object-store output both wait by, and the async loop that retries a call until it succeeds.

:class:`Backoff` only computes delays; whoever waits chooses how (``anyio.sleep`` in a source,
an event's timed wait in an upload thread that a drain may cut short).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

T = TypeVar("T")

log = logging.getLogger(__name__)


class Backoff:
    """Delays that double from ``first`` up to ``cap``, each scaled by a random factor in
    ``[1 - jitter, 1)`` (``jitter = 0``: none); :meth:`reset` after a success.

    ``random`` (a float in ``[0, 1)``, as :func:`random.random`) is injected by tests."""

    def __init__(
        self,
        first: float,
        cap: float,
        *,
        jitter: float = 0.0,
        random: Callable[[], float] = random.random,
    ) -> None:
        if not 0.0 <= jitter <= 1.0:
            raise ValueError(f"jitter must be within [0, 1], got {jitter}")
        self.first = first
        self.cap = cap
        self.jitter = jitter
        self._random = random
        self._base = 0.0
        self.failures = 0
        """Failures since the last :meth:`reset` (delays handed out)."""

    def next(self) -> float:
        """The delay to wait after one more failure."""
        self.failures += 1
        # Doubled from the last one, not first * 2**n: no overflow however long an outage lasts.
        self._base = min(self.cap, max(self.first, self._base * 2))
        if not self.jitter:
            return self._base
        return self._base * ((1.0 - self.jitter) + self.jitter * self._random())

    def reset(self) -> None:
        """Start again from ``first`` (after a success)."""
        self._base = 0.0
        self.failures = 0


async def retrying(
    call: Callable[[], Awaitable[T]],
    backoff: Backoff,
    *,
    retry_on: tuple[type[BaseException], ...],
    what: str,
    sleep: Callable[[float], Awaitable[object]] = anyio.sleep,
    logger: logging.Logger = log,
) -> T:
    """Await ``call()`` until it returns, sleeping ``backoff.next()`` after each failure of a
    ``retry_on`` type (logged as a warning on ``logger``: ``<what> failed (<error>); retrying in
    <delay>s``); any other exception propagates. No time limit: the caller's cancel scope is one."""
    while True:
        try:
            result = await call()
        except retry_on as e:
            delay = backoff.next()
            logger.warning("%s failed (%s); retrying in %.1fs", what, e, delay)
            await sleep(delay)
        else:
            backoff.reset()
            return result
