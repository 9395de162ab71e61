"""Clients that open more connections than the daemon has file descriptors: the metrics endpoint
and a TCP source of a ``tfrecordd run`` subprocess under a lowered ``RLIMIT_NOFILE``.

The daemon must keep serving ``/metrics``, accept a real client once idle connections are cut,
publish what that client sends, and drain and exit 0 on SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import signal
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.support import (
    DaemonProcess,
    free_port,
    movie_event,
    read_ids,
    wait_for,
    write_tcp_config,
)

LIMIT = 256
"""The daemon's ``RLIMIT_NOFILE`` (soft and hard) in these tests."""
IDLE = 300
"""Idle connections opened against it: more than it has descriptors."""


def limited(config: Path) -> DaemonProcess:
    """The daemon, its descriptors capped at :data:`LIMIT` as soon as it runs."""
    daemon = DaemonProcess(config)
    resource.prlimit(daemon.proc.pid, resource.RLIMIT_NOFILE, (LIMIT, LIMIT))
    return daemon


@contextlib.contextmanager
def idle_connections(port: int, n: int) -> Iterator[list[socket.socket]]:
    """``n`` connections to ``port`` that never send a byte. Each is established (in the
    daemon's hands or in its listen backlog) before the next is opened; one the kernel cannot
    establish within a second is given up."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            with contextlib.suppress(OSError):
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=1))
        yield socks
    finally:
        for s in socks:
            s.close()


def scrape(port: int, timeout: float = 5.0) -> str:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
        f"http://127.0.0.1:{port}/metrics", timeout=timeout
    ) as r:
        body: bytes = r.read()
    return body.decode()


def scrapes(port: int) -> bool:
    try:
        return "tfrecordd_up 1.0" in scrape(port, timeout=2)
    except OSError:
        return False


def sample(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)(?:\{(.*)\})? (\S+)$", line)
        if m and m.group(1) == name and ",".join(sorted((m.group(2) or "").split(","))) == want:
            return float(m.group(3))
    return 0.0


def send_acked(port: int, first: int, n: int, timeout: float = 30.0) -> int:
    """Send events ``first`` to ``first + n - 1`` as the documented client does: resending on a
    new connection what a refused or cut one left unacked, until all are acked. Returns the
    connections it took; fails after ``timeout`` seconds."""
    pending = [json.dumps(movie_event(i)).encode() + b"\n" for i in range(first, first + n)]
    deadline = time.monotonic() + timeout
    tries = 0
    while pending:
        assert time.monotonic() < deadline, f"{len(pending)} of {n} events never acked"
        tries += 1
        acked = 0
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"".join(pending))
                with sock.makefile("rb") as replies:
                    for reply in replies:
                        if reply.startswith(b"ACK ") and int(reply.split()[1]) == len(pending):
                            acked = len(pending)
                            break
                        if reply.startswith(b"ACK "):
                            acked = int(reply.split()[1])
        except OSError:
            time.sleep(0.2)
        pending = pending[acked:]
    return tries


def test_idle_connections_to_the_metrics_port_cannot_exhaust_descriptors(tmp_path: Path) -> None:
    tcp_port, metrics_port = free_port(), free_port()
    daemon = limited(write_tcp_config(tmp_path, tcp_port, metrics_port, ack=True))
    try:
        daemon.wait_started()
        with idle_connections(metrics_port, IDLE):
            # Idle connections are cut, so a scrape gets through while they are still open.
            wait_for(lambda: scrapes(metrics_port), timeout=30, interval=0.2)
            assert daemon.proc.poll() is None, daemon.output()
            send_acked(tcp_port, 0, 10)
        text = scrape(metrics_port)
        assert sample(text, "tfrecordd_metrics_endpoint_errors_total", reason="evicted") > 0
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, daemon.output()
    finally:
        daemon.kill()
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(10), 1)


def test_idle_connections_to_a_tcp_source_cannot_exhaust_descriptors(tmp_path: Path) -> None:
    tcp_port, metrics_port = free_port(), free_port()
    # More slots than descriptors: only the descriptor reserve stands between the clients and
    # the daemon's own files.
    config = write_tcp_config(tmp_path, tcp_port, metrics_port, ack=True, max_connections=1000)
    daemon = limited(config)
    try:
        daemon.wait_started()
        with idle_connections(tcp_port, IDLE):
            wait_for(lambda: scrapes(metrics_port), timeout=30, interval=0.2)
            # A real client is served while the idle ones are still connected.
            send_acked(tcp_port, 0, 10)
            assert daemon.proc.poll() is None, daemon.output()
            text = scrape(metrics_port)
            refused = sum(
                sample(text, "tfrecordd_inputs_refused_total", source="tcp-in", reason=r)
                for r in ("evicted", "descriptors", "accept_failed")
            )
            assert refused > 0
        assert send_acked(tcp_port, 10, 10) == 1
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, daemon.output()
    finally:
        daemon.kill()
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(20), 1)


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_accept_failing_with_emfile_is_survived_by_every_listener(tmp_path: Path) -> None:
    tcp_port, metrics_port = free_port(), free_port()
    daemon = DaemonProcess(write_tcp_config(tmp_path, tcp_port, metrics_port, ack=True))
    pid = daemon.proc.pid
    try:
        daemon.wait_started()
        # Not one descriptor left: every accept() fails with EMFILE.
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_descriptors(pid), LIMIT))
        with idle_connections(metrics_port, 5), idle_connections(tcp_port, 5):
            time.sleep(2)
            assert daemon.proc.poll() is None, daemon.output()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (LIMIT, LIMIT))
        wait_for(lambda: scrapes(metrics_port), timeout=10, interval=0.2)
        assert send_acked(tcp_port, 0, 10) == 1
        text = scrape(metrics_port)
        assert sample(text, "tfrecordd_metrics_endpoint_errors_total", reason="accept_failed") > 0
        reason = {"source": "tcp-in", "reason": "accept_failed"}
        assert sample(text, "tfrecordd_inputs_refused_total", **reason) > 0
        log = daemon.output()
        # A pause between retries, not a spin: a handful of warnings, not thousands.
        assert log.count("accept failed") <= 4, log[-2000:]
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, daemon.output()
    finally:
        daemon.kill()
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(10), 1)
