"""``tfrecordd run`` as a subprocess with tcp, unix and udp sources: acks, SIGTERM, clean-up."""

from __future__ import annotations

import json
import signal
import socket
import stat
from pathlib import Path

from tests.support import MOVIES_FEATURES, DaemonProcess, free_port, movie_event, read_ids, wait_for


def write_socket_config(root: Path, tcp_port: int, udp_port: int) -> Path:
    features = "\n".join(f"{k} = {json.dumps(v)}" for k, v in MOVIES_FEATURES.items())
    path = root / "tfrecordd.toml"
    path.write_text(
        f"""
[daemon]
node_id = "test"
state_dir = "{root / "state"}"
[metrics]
enabled = false
[output]
dir = "{root / "shards"}"
max_shard_age = "200ms"

[[sources]]
name = "tcp-in"
type = "tcp"
listen = "127.0.0.1:{tcp_port}"
ack = true
encoder = "movies"

[[sources]]
name = "udp-in"
type = "udp"
listen = "127.0.0.1:{udp_port}"
encoder = "movies"

[[sources]]
name = "unix-in"
type = "unix"
path = "{root / "ingest.sock"}"
framing = "length-prefixed"
encoder = "movies"

[encoders.movies]
type = "example"
[encoders.movies.features]
{features}
"""
    )
    return path


def read_acks(sock: socket.socket, until: int) -> list[bytes]:
    acks: list[bytes] = []
    with sock.makefile("rb") as replies:
        for reply in replies:
            acks.append(reply)
            if reply == f"ACK {until}\n".encode():
                break
    return acks


def test_socket_sources_in_a_daemon_process(tmp_path: Path) -> None:
    tcp_port, udp_port = free_port(), free_port()
    sock_path = tmp_path / "ingest.sock"
    daemon = DaemonProcess(write_socket_config(tmp_path, tcp_port, udp_port))
    try:
        daemon.wait_started()
        # Listening before the daemon reports itself started.
        assert stat.S_IMODE(sock_path.lstat().st_mode) == 0o660

        with socket.create_connection(("127.0.0.1", tcp_port), timeout=20) as tcp:
            tcp.sendall(b"".join(json.dumps(movie_event(i)).encode() + b"\n" for i in range(100)))
            acks = read_acks(tcp, 100)
        assert acks[-1] == b"ACK 100\n"
        assert read_ids(tmp_path / "shards").keys() >= set(range(100))

        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
            unix.connect(str(sock_path))
            for i in range(100, 200):
                payload = json.dumps(movie_event(i)).encode()
                unix.sendall(len(payload).to_bytes(4, "big") + payload)

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            for i in range(200, 220):
                udp.sendto(json.dumps(movie_event(i)).encode(), ("127.0.0.1", udp_port))

        wait_for(lambda: len(read_ids(tmp_path / "shards")) == 220, timeout=20)
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, daemon.output()
    finally:
        daemon.kill()
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(220), 1)
    assert not sock_path.exists(), "the unix socket is removed on shutdown"
