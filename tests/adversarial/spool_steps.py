"""The daemon's side of a spool, one step at a time, for the model tests: a directory source,
the batches it sent, what is committed (its tokens folded into the state, its records
published), the acks still owed, and crashes in between."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from tfrecordd.plugin import Token
from tfrecordd.testing import RecordingContext
from tfrecordd_plugins.sources.directory import CLAIM_DIR, DirectorySource, DirectorySourceConfig


class SpoolSteps:
    """The daemon's side, step by step: a source, the batches it sent, what is committed (its
    tokens folded into the state, the records published), and the acks still owed."""

    def __init__(self, spool: Path, **settings: Any) -> None:
        self.config = DirectorySourceConfig.model_validate(
            {"name": "spool", "encoder": "e", "path": spool, "poll_interval": 0.01}
            | {"read_size": 4096}
            | settings
        )
        self.state: Any = None
        self.owed: list[Token] = []
        self.published: list[Any] = []
        self.source: DirectorySource | None = None
        self.state_dir = str(spool.parent / "source-state")
        self.ctx = self._context()
        self.taken = 0  # ctx.batches[:taken] are committed

    def _context(self) -> RecordingContext:
        return RecordingContext(
            name="spool", node_id="n1", max_batch_events=16, state_dir=self.state_dir
        )

    async def start(self) -> None:
        self.source = self.config.build()
        self.ctx = self._context()
        self.source.attach(self.ctx)
        self.taken = 0
        await self.source.recover(self.state, self.owed)
        self.owed = []

    async def pump(self) -> None:
        """Run the source until it has sent all it can for now: nothing left to claim, every
        claim read to its end, and no batch sent for a few polls."""
        assert self.source is not None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.source.run, self.ctx)
            seen, still = -1, 0
            with anyio.fail_after(10):
                while still < 3 or not self._idle():
                    await anyio.sleep(0.01)
                    n = len(self.ctx.batches)
                    still = still + 1 if n == seen else 0
                    seen = n
            tg.cancel_scope.cancel()

    def _idle(self) -> bool:
        assert self.source is not None
        spool, node = self.config.path, self.source.claims.node
        if node is None:
            return False
        claims = spool / CLAIM_DIR / node
        sent, left = self.source.positions.sent_eof, self.source.claims.left
        waiting = [p.name for p in claims.iterdir() if p.name[0] != "." and p.name not in left]
        if any(f"{node}/{name}" not in sent for name in waiting):
            return False
        pattern = self.config.pattern
        found = spool.rglob(pattern) if self.config.recursive else spool.glob(pattern)
        return not [
            p
            for p in found
            if not any(
                part.startswith(".") or part == "done" for part in p.relative_to(spool).parts
            )
            and p.is_file()
        ]

    def commit(self) -> None:
        """Everything sent so far is published; its acks are owed."""
        new = self.ctx.batches[self.taken :]
        self.taken = len(self.ctx.batches)
        tokens = [b.token for b in new]
        self.published += new
        self.state = DirectorySource.fold(self.state, tokens)
        self.owed += tokens

    async def ack(self) -> None:
        assert self.source is not None
        owed, self.owed = self.owed, []
        await self.source.ack(owed)

    async def rounds(self, n: int = 3) -> None:
        """``n`` rounds of reading, committing and acking: long enough for a file that
        changed to be read on and finished."""
        for _ in range(n):
            await self.pump()
            self.commit()
            await self.ack()

    async def crash(self) -> None:
        """The process dies: what was sent but not committed is gone, owed acks are redone by
        the next start's recovery."""
        assert self.source is not None
        await self.source.aclose()
        await self.start()
