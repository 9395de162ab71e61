"""The metrics endpoint against clients that hold connections: real sockets on 127.0.0.1."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from tfrecordd.metrics import MAX_CONNECTIONS, REQUEST_TIMEOUT, Metrics, serve

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def endpoint() -> AsyncIterator[tuple[int, Metrics]]:
    metrics = Metrics()
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve, "127.0.0.1", 0, metrics, lambda: True)
        try:
            yield port, metrics
        finally:
            tg.cancel_scope.cancel()


def errors(metrics: Metrics, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "tfrecordd_metrics_endpoint_errors_total", {"reason": reason}
    )
    return 0.0 if value is None else value


async def get(port: int, path: str = "/metrics") -> bytes:
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        body = b""
        with anyio.fail_after(5):
            try:
                while True:
                    body += await stream.receive()
            except anyio.EndOfStream:
                pass
    return body


def closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


async def test_idle_connections_are_capped_and_a_scrape_gets_through() -> None:
    extra = 20
    async with endpoint() as (port, metrics):
        idle = [
            socket.create_connection(("127.0.0.1", port), timeout=2)
            for _ in range(MAX_CONNECTIONS + extra)
        ]
        try:
            # Every one is accepted, and the oldest beyond the cap are closed unanswered.
            with anyio.fail_after(3):
                while errors(metrics, "evicted") < extra:
                    await anyio.sleep(0.02)
            reply = await get(port)
            assert reply.startswith(b"HTTP/1.0 200 OK")
            assert b"tfrecordd_metrics_endpoint_errors_total" in reply
            assert all(closed_by_server(s) for s in idle[:extra])
            assert not any(closed_by_server(s) for s in idle[extra + 1 :])
        finally:
            for s in idle:
                s.close()


def silent_client(port: int) -> float:
    """Connect and send nothing; seconds until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=REQUEST_TIMEOUT + 5) as sock:
        t0 = time.monotonic()
        assert sock.recv(1) == b""
        return time.monotonic() - t0


def slow_client(port: int) -> float:
    """Send a request a byte every 0.2 s (each a fresh sign of life, never a whole request);
    seconds until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.settimeout(0.2)
        t0 = time.monotonic()
        for byte in b"GET /metrics HTTP/1.0\r\nX-Slow: " + b"x" * 100:
            try:
                sock.send(bytes([byte]))
                if sock.recv(1) == b"":
                    break
            except TimeoutError:
                continue
            except OSError:
                break
        return time.monotonic() - t0


async def test_a_silent_connection_is_closed_after_the_request_timeout() -> None:
    async with endpoint() as (port, metrics):
        took = await anyio.to_thread.run_sync(silent_client, port)
        assert REQUEST_TIMEOUT - 0.5 <= took < REQUEST_TIMEOUT + 3
        assert (await get(port, "/healthz")).endswith(b"ok\n")
        assert errors(metrics, "timeout") == 1
        assert errors(metrics, "evicted") == 0


async def test_a_trickled_request_cannot_outlive_the_timeout() -> None:
    async with endpoint() as (port, metrics):
        took = await anyio.to_thread.run_sync(slow_client, port)
        assert REQUEST_TIMEOUT - 0.5 <= took < REQUEST_TIMEOUT + 3
        assert errors(metrics, "timeout") == 1
