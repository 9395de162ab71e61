""":func:`tfrecordd.testing.check_source` on an in-memory source, sound and broken: the checks
it promises can fail."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

from tfrecordd.plugin import RawBatch, RawEvent, Source, SourceConfig, SourceContext, Token
from tfrecordd.testing import ContractError, check_source

WORLD: list[bytes] = []
"""What the outside world delivered, in order; a token is how many of them a batch reaches."""
ACKED = [0]
"""How many of ``WORLD`` were acked: the outside world's own record (a consumer group's offset),
where a source with no state starts."""


class MemorySource(Source):
    how: ClassVar[str] = ""

    def __init__(self, name: str) -> None:
        self.name = name
        self.start = 0

    async def run(self, ctx: SourceContext) -> None:
        at = self.start
        while True:
            if at < len(WORLD):
                end = min(len(WORLD), at + 3)
                events = [RawEvent(p, f"world:{i}") for i, p in enumerate(WORLD[at:end], at)]
                await ctx.send(RawBatch(self.name, events, end))
                at = end
            await anyio.sleep(0.01)

    async def ack(self, tokens: Sequence[Token]) -> None:
        if MemorySource.how != "ack does nothing":
            ACKED[0] = max([ACKED[0], *tokens])

    async def recover(self, state: Any, pending: Sequence[Token]) -> None:
        self.start = max(state or 0, ACKED[0])

    @staticmethod
    def fold(state: Any, tokens: Sequence[Token]) -> Any:
        if MemorySource.how == "not associative":
            return len(tokens) + 0 * (state or 0) if tokens else state
        if MemorySource.how == "not idempotent":
            return (state or 0) + len(tokens)
        return max([state or 0, *tokens])


class MemoryConfig(SourceConfig):
    """An in-memory source for these tests."""

    type: str = "memory"
    encoder: str = "x"

    def build(self) -> Source:
        return MemorySource(self.name)


async def _produce(payloads: list[bytes]) -> None:
    WORLD.extend(payloads)


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("", None),
        ("not associative", "not associative"),
        ("not idempotent", "not idempotent"),
        ("ack does nothing", "started with no state"),
    ],
)
def test_check_source_passes_a_sound_source_and_catches_a_broken_one(
    tmp_path: Path, how: str, message: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    WORLD.clear()
    ACKED[0] = 0
    monkeypatch.setattr(MemorySource, "how", how)

    async def check() -> None:
        await check_source(MemoryConfig(name="m"), _produce, state_dir=str(tmp_path), settle=0.2)

    if message is None:
        anyio.run(check)
    else:
        with pytest.raises(ContractError, match=message):
            anyio.run(check)


def test_a_source_whose_positions_live_in_the_journal_passes_without_final_acks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``final_ack=False``: a source that keeps its positions only in the folded state (its ack
    does nothing) passes, as long as a restart from that state sends nothing again."""
    WORLD.clear()
    ACKED[0] = 0
    monkeypatch.setattr(MemorySource, "how", "ack does nothing")
    anyio.run(
        lambda: check_source(
            MemoryConfig(name="m"), _produce, state_dir=str(tmp_path), settle=0.2, final_ack=False
        )
    )
