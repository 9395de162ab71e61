"""What a source learns from ``SourceContext.send``: once the pipeline holds a batch, the send
has happened, whatever cancellation comes after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from tfrecordd.config import parse_config
from tfrecordd.events import RawBatch, RawEvent
from tfrecordd.pipeline.runtime import Daemon
from tfrecordd.plugin import Registry, SourceContext
from tfrecordd_plugins.encoders.example import ExampleEncoderConfig
from tfrecordd_plugins.sources.directory import DirectorySource, DirectorySourceConfig

pytestmark = pytest.mark.anyio


def _context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Daemon, Any]:
    seen: list[SourceContext] = []
    attach = DirectorySource.attach

    def keep(self: DirectorySource, ctx: SourceContext) -> None:
        seen.append(ctx)
        attach(self, ctx)

    monkeypatch.setattr(DirectorySource, "attach", keep)
    data = {
        "daemon": {"node_id": "n", "state_dir": str(tmp_path / "state")},
        "metrics": {"enabled": False},
        "output": {"dir": str(tmp_path / "shards")},
        "sources": [
            {"name": "s", "type": "directory", "path": str(tmp_path / "in"), "encoder": "e"}
        ],
        "encoders": {"e": {"type": "example", "features": {"id": "int64"}}},
    }
    registry = Registry({"directory": DirectorySourceConfig}, {"example": ExampleEncoderConfig})
    daemon = Daemon(parse_config(data, registry), handle_signals=False)
    (ctx,) = seen
    return daemon, ctx


async def test_a_batch_the_pipeline_took_is_sent_even_if_cancelled_right_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemon, ctx = _context(tmp_path, monkeypatch)
    send, receive = anyio.create_memory_object_stream[RawBatch](1)
    ctx.connect(send)
    batch = RawBatch("s", [RawEvent(b'{"id": 1}', "x"), RawEvent(b'{"id": 2}', "y")], None)
    returned = False
    deliver = send.send_nowait

    def then_cancel(item: RawBatch) -> None:
        deliver(item)
        scope.cancel()  # the daemon stops just as the pipeline took the batch

    monkeypatch.setattr(send, "send_nowait", then_cancel)
    with anyio.CancelScope() as scope:
        await ctx.send(batch)
        returned = True
    assert returned, "send returned: the batch is the pipeline's"
    assert receive.receive_nowait() is batch
    received = daemon.metrics.registry.get_sample_value(
        "tfrecordd_events_received_total", {"source": "s"}
    )
    assert received == 2
    # The next send of a cancelled source raises before the pipeline is touched (it may be
    # closing already).
    receive.close()
    with anyio.CancelScope() as scope:
        scope.cancel()
        await ctx.send(batch)
        pytest.fail("a cancelled source's next send raised nothing")
    assert scope.cancelled_caught
    send.close()
    receive.close()
