"""The stream-socket source against generated clients: many at once, each sending good, bad,
over-long and unfinished frames in chunks of any size, then closing cleanly, abruptly (a
reset) or in the middle of a frame.

Whatever they do, the daemon stays up, and once it has drained: every frame a client saw
acknowledged is in a shard exactly once (its event) or in the dead letters (with its reason);
no event is written twice; a clean client gets every frame it sent acknowledged.
"""

from __future__ import annotations

import json
import socket
import struct
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.integration.test_socket_sources import make_config, running, tcp_port
from tests.support import CI_DERANDOMIZED, dead_letters, examples, movie_event, read_ids

MAX_FRAME = 2048


@dataclass
class Client:
    frames: list[tuple[str, int]]
    """``(kind, size)``: ``good`` (an event), ``bad`` (not JSON), ``long`` (over
    ``max_frame_bytes``)."""
    chunks: list[int]
    """Sizes of the sends the bytes are cut into, cycled."""
    ending: str
    """``clean``: end of input, then every ack read; ``partial``: the same after half a frame;
    ``reset``: closed at once with a reset, acks unread."""
    ids: list[int] = field(default_factory=list)
    markers: list[bytes] = field(default_factory=list)
    acked: int = 0


_CLIENT = st.builds(
    Client,
    frames=st.lists(
        st.tuples(st.sampled_from(["good", "good", "good", "bad", "long"]), st.integers(0, 300)),
        max_size=40,
    ),
    chunks=st.lists(st.integers(1, 4096), min_size=1, max_size=5),
    ending=st.sampled_from(["clean", "clean", "partial", "reset"]),
)


def _payload(client: Client, first_id: int, n: int) -> bytes:
    out = []
    next_id = first_id
    for k, (kind, size) in enumerate(client.frames):
        if kind == "good":
            event = movie_event(next_id) | {"pad": "p" * size}
            client.ids.append(next_id)
            next_id += 1
            out.append(json.dumps(event).encode())
        elif kind == "bad":
            marker = f"{{bad {n}-{k}".encode()
            client.markers.append(marker)
            out.append(marker + b"x" * size)
        else:
            marker = f"L{n}-{k}-".encode()
            client.markers.append(marker)
            out.append(marker + b"y" * (MAX_FRAME + size))
    body = b"".join(line + b"\n" for line in out)
    if client.ending == "partial":
        marker = f'{{"id": {n}-partial'.encode()
        client.markers.append(marker)
        body += marker
    return body


def _reply_numbers(buf: bytearray) -> list[int]:
    acks = []
    while b"\n" in buf:
        end = buf.index(b"\n") + 1
        line = bytes(buf[:end])
        del buf[:end]
        if line.startswith(b"ACK "):
            acks.append(int(line.split()[1]))
    return acks


async def _serve_client(port: int, client: Client, body: bytes, shards: Path) -> None:
    frames = len(client.frames) + (client.ending == "partial")
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setblocking(False)
    try:
        at, i = 0, 0
        while at < len(body):
            size = client.chunks[i % len(client.chunks)]
            await anyio.wait_writable(sock)
            at += sock.send(body[at : at + size])
            i += 1
        if client.ending == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        sock.shutdown(socket.SHUT_WR)
        buf = bytearray()
        with anyio.fail_after(20):
            while client.acked < frames:
                await anyio.wait_readable(sock)
                data = sock.recv(65536)
                if not data:
                    break
                buf += data
                client.acked = max([client.acked, *_reply_numbers(buf)])
        # An ack means published and durable: the acked events are in the shards already.
        acked = [i for k, i in _good_frames(client) if k <= client.acked]
        if acked:
            now = read_ids(shards)
            assert all(now[i] == 1 for i in acked), "acked before it was published"
    finally:
        sock.close()


def _good_frames(client: Client) -> list[tuple[int, int]]:
    """``(frame number, event id)`` of the client's good frames."""
    numbers = [k for k, (kind, _) in enumerate(client.frames, 1) if kind == "good"]
    return list(zip(numbers, client.ids, strict=True))


@settings(max_examples=examples(12, 150), derandomize=CI_DERANDOMIZED, deadline=None)
@given(clients=st.lists(_CLIENT, min_size=1, max_size=6))
def test_generated_clients_get_exactly_once_for_what_is_acked(clients: list[Client]) -> None:
    with tempfile.TemporaryDirectory(prefix="socket-clients-") as tmp:
        root = Path(tmp)
        config = make_config(
            root,
            {"type": "tcp", "listen": "127.0.0.1:0", "ack": True, "max_frame_bytes": MAX_FRAME},
            output={"max_shard_age": "100ms"},
        )
        bodies, first = [], 0
        for n, client in enumerate(clients):
            bodies.append(_payload(client, first, n))
            first += len(client.ids)

        async def run() -> None:
            async with running(config) as daemon:
                port = tcp_port(daemon)
                async with anyio.create_task_group() as tg:
                    for client, body in zip(clients, bodies, strict=True):
                        tg.start_soon(_serve_client, port, client, body, root / "shards")
                # Still serving: a last client is answered.
                last = Client([("good", 0)], [4096], "clean")
                body = _payload(last, first, len(clients))
                await _serve_client(port, last, body, root / "shards")
                assert last.acked == 1

        anyio.run(run)
        written = read_ids(root / "shards")
        letters = [d.get("raw", "") for d in dead_letters(root / "state")]
    assert max(written.values(), default=1) == 1, "an event written twice"
    counts = Counter(written)
    for client in clients:
        frames = len(client.frames) + (client.ending == "partial")
        if client.ending != "reset":
            assert client.acked == frames, "a clean client's frames were not all acknowledged"
        # Everything acked is durable: a frame k <= acked is an event or a dead letter.
        good = iter(client.ids)
        markers = iter(client.markers)
        for k, (kind, _) in enumerate(client.frames, 1):
            if kind == "good":
                i = next(good)
                if k <= client.acked:
                    assert counts[i] == 1, f"acked event {i} missing"
            else:
                marker = next(markers).decode()
                if k <= client.acked:
                    assert any(raw.startswith(marker) for raw in letters), marker
        if client.ending == "partial" and client.acked == frames:
            marker = next(markers).decode()
            assert any(raw.startswith(marker) for raw in letters), marker
