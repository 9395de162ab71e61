"""SIGTERM while clients stream to a TCP source with acks: the drain publishes what the daemon
holds and acks it before closing the connections, so clients that follow the documented resend
loop (docs/sources/sockets.md) write no event twice.

What is asserted: clients run the documented ``send_acked`` (taken from the docs) against a
daemon that is stopped mid-stream with SIGTERM (it exits 0) and started again on the same port;
each client returns only once every one of its events was covered by an ACK on some
connection; then every event sent is in the published shards exactly once, the first run had
published only part of them (the stop did land mid-stream) and the second run the rest.
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.e2e.test_descriptor_limits import scrape
from tests.support import (
    DaemonProcess,
    free_port,
    movie_event,
    read_ids,
    wait_for,
    write_tcp_config,
)

DOCS = Path(__file__).parents[2] / "docs" / "sources" / "sockets.md"
CLIENTS = 4
EVENTS = 10_000
"""Per client."""


def documented_client() -> Callable[..., None]:
    text = DOCS.read_text()
    code = re.search(r"```python\n(.*?)```", text[text.index("A client in Python") :], re.DOTALL)
    assert code is not None
    namespace: dict[str, Any] = {}
    exec(compile(code.group(1), str(DOCS), "exec"), namespace)
    send: Callable[..., None] = namespace["send_acked"]
    return send


def _received(metrics_port: int) -> float:
    """The events the running daemon has taken in so far (0 before its endpoint answers)."""
    try:
        text = scrape(metrics_port, timeout=1.0)
    except OSError:
        return 0.0
    found = re.search(r'^tfrecordd_events_received_total\{source="tcp-in"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_sigterm_mid_stream_acks_what_the_drain_published(tmp_path: Path) -> None:
    send_acked = documented_client()
    tcp_port, metrics_port = free_port(), free_port()
    # A small pipeline: the clients are still streaming when the stop comes.
    config = write_tcp_config(tmp_path, tcp_port, metrics_port, ack=True)
    text = config.read_text().replace(
        "[daemon]\n", "[daemon]\nqueue_batches = 1\nmax_batch_events = 100\n", 1
    )
    config.write_text(text)
    shards = tmp_path / "shards"
    total = CLIENTS * EVENTS
    finished: list[int] = []
    errors: list[BaseException] = []

    def client(k: int) -> None:
        try:
            events = [movie_event(k * EVENTS + i) for i in range(EVENTS)]
            send_acked(events, ("127.0.0.1", tcp_port))
            finished.append(k)
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    first = DaemonProcess(config)
    second: DaemonProcess | None = None
    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(CLIENTS)]
    try:
        first.wait_started()
        for t in threads:
            t.start()
        # As soon as events arrive: waiting for the first shard (max_shard_age) let a fast
        # machine take in the whole stream first, and the stop came after it.
        wait_for(lambda: _received(metrics_port) > 0, timeout=60, interval=0.005)
        first.signal(signal.SIGTERM)
        assert first.wait(60) == 0, first.output()
        assert "drain did not finish" not in first.output()
        after_first = read_ids(shards)
        assert all(n == 1 for n in after_first.values()), "duplicates within the first run"
        assert 0 < len(after_first) < total, "the stop did not land mid-stream"
        assert not errors, errors

        second = DaemonProcess(config)
        second.wait_started()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert sorted(finished) == list(range(CLIENTS)), "a client never got all its acks"
        assert second.stop(60) == 0, second.output()
    finally:
        first.kill()
        if second is not None:
            second.kill()
    ids = read_ids(shards)
    duplicated = {i: n for i, n in ids.items() if n > 1}
    assert not duplicated, f"{len(duplicated)} events written twice, e.g. {list(duplicated)[:5]}"
    assert set(ids) == set(range(total))
