"""The sd_notify client against real AF_UNIX datagram sockets, as systemd binds them."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tfrecordd.notify import SystemdNotifier


def _receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5)
    return sock


@pytest.fixture
def path_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    address = str(tmp_path / "notify")
    with _receiver(address) as sock:
        yield address, sock


@pytest.fixture
def abstract_socket() -> Iterator[tuple[str, socket.socket]]:
    name = f"tfrecordd-test-{uuid.uuid4().hex}"
    with _receiver("\0" + name) as sock:
        yield "@" + name, sock


def _recv(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_path_socket_receives_each_message(path_socket: tuple[str, socket.socket]) -> None:
    address, sock = path_socket
    with SystemdNotifier({"NOTIFY_SOCKET": address}) as notifier:
        assert notifier.enabled
        assert notifier.ready()
        assert _recv(sock) == "READY=1"
        assert notifier.watchdog()
        assert _recv(sock) == "WATCHDOG=1"
        assert notifier.stopping("draining 3 shards")
        assert _recv(sock) == "STOPPING=1\nSTATUS=draining 3 shards"
        assert notifier.stopping()
        assert _recv(sock) == "STOPPING=1"


def test_abstract_socket_receives_messages(abstract_socket: tuple[str, socket.socket]) -> None:
    address, sock = abstract_socket
    with SystemdNotifier({"NOTIFY_SOCKET": address}) as notifier:
        assert notifier.ready(status="serving")
        assert _recv(sock) == "READY=1\nSTATUS=serving"
        assert notifier.watchdog()
        assert _recv(sock) == "WATCHDOG=1"


def test_status_cannot_inject_other_fields(path_socket: tuple[str, socket.socket]) -> None:
    address, sock = path_socket
    with SystemdNotifier({"NOTIFY_SOCKET": address}) as notifier:
        assert notifier.stopping("bad\nREADY=1")
        assert _recv(sock) == "STOPPING=1\nSTATUS=bad READY=1"


def test_unset_socket_is_a_no_op() -> None:
    notifier = SystemdNotifier({"WATCHDOG_USEC": "30000000"})
    assert not notifier.enabled
    assert not notifier.ready()
    assert not notifier.watchdog()
    assert not notifier.stopping("x")
    assert notifier.watchdog_interval() is None


def test_unusable_address_disables_notifier(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tfrecordd.notify"):
        notifier = SystemdNotifier({"NOTIFY_SOCKET": "vsock:2:1234"})
    assert not notifier.enabled
    assert not notifier.ready()
    assert "not a unix socket address" in caplog.text


def test_send_failure_is_logged_once_and_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    with caplog.at_level(logging.WARNING, logger="tfrecordd.notify"):
        assert not notifier.ready()
        assert not notifier.watchdog()
        assert not notifier.watchdog()
    notifier.close()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "sd_notify" in warnings[0].getMessage()


def test_full_socket_buffer_does_not_block(tmp_path: Path) -> None:
    address = str(tmp_path / "notify")
    with _receiver(address) as sock, SystemdNotifier({"NOTIFY_SOCKET": address}) as notifier:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
        results = [notifier.watchdog() for _ in range(10_000)]
    assert results[0]
    assert not all(results)


def test_watchdog_interval_is_half_the_watchdog_timeout(
    path_socket: tuple[str, socket.socket],
) -> None:
    address, _ = path_socket
    env = {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "30000000"}
    assert SystemdNotifier(env).watchdog_interval() == 15.0
    mine = {**env, "WATCHDOG_PID": str(os.getpid())}
    assert SystemdNotifier(mine).watchdog_interval() == 15.0


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"WATCHDOG_USEC": "0"},
        {"WATCHDOG_USEC": "soon"},
        {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)},
        {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "self"},
    ],
)
def test_no_watchdog_interval_unless_asked_of_this_process(
    path_socket: tuple[str, socket.socket], extra: dict[str, str]
) -> None:
    address, _ = path_socket
    assert SystemdNotifier({"NOTIFY_SOCKET": address, **extra}).watchdog_interval() is None


def test_reads_process_environment_by_default(
    path_socket: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, sock = path_socket
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    with SystemdNotifier() as notifier:
        assert notifier.stopping()
    assert _recv(sock) == "STOPPING=1"
