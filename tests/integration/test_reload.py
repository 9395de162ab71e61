"""Live config reload with real signals against a daemon process: SIGHUP under load applies a
new config without losing or doubling an event, keeps a TCP source's listening socket, refuses
an invalid config or a key that cannot change live (the old config runs on), and two signals in
quick succession apply the newest file; SIGUSR1 publishes the open shards."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support import (
    MOVIES_FEATURES,
    DaemonProcess,
    free_port,
    movie_event,
    read_examples,
    read_ids,
    read_shard,
    run_tfrecordd,
    shard_files,
    spool_drained,
    spool_file,
    wait_for,
)


def _value(v: Any) -> str:
    return json.dumps(str(v)) if isinstance(v, str | Path) else json.dumps(v)


def write(
    root: Path,
    sources: Sequence[Mapping[str, Any]],
    *,
    metrics_port: int,
    output: Mapping[str, Any] | None = None,
    daemon: Mapping[str, Any] | None = None,
    features: Mapping[str, str] = MOVIES_FEATURES,
) -> Path:
    """The config file at ``root/tfrecordd.toml`` (written again in place, as an operator
    edits it before a reload); spool folders are created."""
    lines = ["[daemon]"]
    table = {"node_id": "test", "state_dir": root / "state", "drain_timeout": "20s"}
    lines += [f"{k} = {_value(v)}" for k, v in (table | dict(daemon or {})).items()]
    lines += ["[metrics]", f'listen = "127.0.0.1:{metrics_port}"', "[output]"]
    out = {"dir": root / "shards", "max_shard_age": "200ms", "min_free_bytes": 0}
    lines += [f"{k} = {_value(v)}" for k, v in (out | dict(output or {})).items()]
    for source in sources:
        src = {"type": "directory", "encoder": "movies"} | dict(source)
        if src["type"] == "directory":
            src.setdefault("poll_interval", "50ms")
            src.setdefault("path", root / str(src["name"]))
            Path(src["path"]).mkdir(parents=True, exist_ok=True)
        lines.append("[[sources]]")
        lines += [f"{k} = {_value(v)}" for k, v in src.items()]
    lines += ["[encoders.movies]", 'type = "example"', "[encoders.movies.features]"]
    lines += [f"{json.dumps(k)} = {_value(v)}" for k, v in features.items()]
    path = root / "tfrecordd.toml"
    tmp = root / "tfrecordd.toml.new"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
    return path


def metric(port: int, name: str, **labels: str) -> float:
    """One sample of the daemon's metrics (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if m and ",".join(sorted((m.group(1) or "").split(","))) == want:
            return float(m.group(2))
    return 0.0


@contextmanager
def running(config: Path, port: int) -> Iterator[DaemonProcess]:
    d = DaemonProcess(config)
    try:
        d.wait_started()
        wait_for(lambda: metric(port, "tfrecordd_up") == 1, 10)
        yield d
        assert d.stop(60) == 0, d.output()[-5000:]
    finally:
        d.kill()


@contextmanager
def meanwhile(work: Callable[[threading.Event], None], join: float = 60) -> Iterator[None]:
    """Run ``work(stop)`` in a thread through the block (the load a reload runs under);
    ``stop`` is set when the block ends, and the thread joined."""
    stop = threading.Event()
    thread = threading.Thread(target=work, args=(stop,))
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(join)


def reloads(port: int, result: str) -> float:
    return metric(port, "tfrecordd_config_reloads_total", result=result)


def reload_and_wait(d: DaemonProcess, port: int, result: str = "applied") -> None:
    """SIGHUP, then wait (bounded) until one more reload counted ``result``."""
    before = reloads(port, result)
    d.signal(signal.SIGHUP)
    wait_for(lambda: reloads(port, result) > before or d.proc.poll() is not None, 30)
    assert d.proc.poll() is None, d.output()[-5000:]


@pytest.mark.parametrize("workers", [1, 2])
def test_spool_under_load_with_repeated_reloads_writes_every_event_once(
    tmp_path: Path, workers: int
) -> None:
    port = free_port()
    main = {"name": "spool"}
    extra = {"name": "extra"}
    daemon = {"encode_workers": workers}
    cfg = write(tmp_path, [main], metrics_port=port, daemon=daemon)
    (tmp_path / "extra").mkdir()
    files, per_file = 60, 100
    with running(cfg, port) as d:

        def produce(stop: threading.Event) -> None:
            for f in range(files):
                if stop.is_set():
                    return
                folder = tmp_path / ("extra" if f % 3 == 0 else "spool")
                ids = range(f * per_file, (f + 1) * per_file)
                spool_file(folder, f"f{f:03}.jsonl", [movie_event(i) for i in ids])
                time.sleep(0.03)

        with meanwhile(produce, join=30):
            for n in range(10):
                # The main source changes each time (restarted from its journalled position);
                # the extra one comes and goes; the dataset's record cap changes every third.
                spool = main | {"poll_interval": f"{50 + 10 * (n % 2)}ms"}
                cap = {"max_shard_records": 150 if n % 3 == 0 else 0}
                srcs = [spool, extra] if n % 2 == 0 else [spool]
                write(tmp_path, srcs, metrics_port=port, output=cap, daemon=daemon)
                reload_and_wait(d, port)
        write(tmp_path, [main, extra], metrics_port=port, daemon=daemon)
        reload_and_wait(d, port)
        wait_for(lambda: spool_drained(tmp_path / "spool"), 60)
        wait_for(lambda: spool_drained(tmp_path / "extra"), 60)
        assert reloads(port, "failed") == 0, d.output()[-5000:]
    ids = read_ids(tmp_path / "shards")
    assert sorted(ids) == list(range(files * per_file))
    assert set(ids.values()) == {1}, {i: n for i, n in ids.items() if n != 1}


def send_acked(address: tuple[str, int] | str, line: bytes) -> None:
    """Send one line on a new connection and wait for its ack (a refusal raises)."""
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(address)
        sock.sendall(line)
        sock.shutdown(socket.SHUT_WR)
        replies = b""
        while not replies.endswith(b"\n"):
            chunk = sock.recv(64)
            assert chunk, f"connection closed before the ack (got {replies!r})"
            replies += chunk
        assert replies.startswith(b"ACK 1"), replies


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_a_client_is_never_refused_during_20_reloads(tmp_path: Path, kind: str) -> None:
    port, tcp_port = free_port(), free_port()
    path = str(tmp_path / "in.sock")
    address: tuple[str, int] | str = ("127.0.0.1", tcp_port) if kind == "tcp" else path
    where = {"listen": f"127.0.0.1:{tcp_port}"} if kind == "tcp" else {"path": path}

    def source(n: int) -> dict[str, Any]:
        # A setting that differs at each reload: the source restarts, its socket stays.
        return {"name": "in", "type": kind, "ack": True, "max_connections": 64 + n % 2} | where

    cfg = write(tmp_path, [source(0)], metrics_port=port)
    sent: list[int] = []
    refused: list[str] = []
    with running(cfg, port) as d:

        def client(stop: threading.Event) -> None:
            i = 0
            deadline = time.monotonic() + 120
            while not stop.is_set() and time.monotonic() < deadline:
                try:
                    send_acked(address, orjson.dumps(movie_event(i)) + b"\n")
                except (ConnectionRefusedError, FileNotFoundError) as e:
                    refused.append(f"event {i}: {e}")
                    time.sleep(0.05)
                    continue
                sent.append(i)
                i += 1

        with meanwhile(client):
            for n in range(1, 21):
                write(tmp_path, [source(n)], metrics_port=port)
                reload_and_wait(d, port)
        log = d.output()
    assert refused == [], refused[:5]
    assert "keeps its listening socket" in log
    assert len(sent) > 20
    ids = read_ids(tmp_path / "shards")
    assert sorted(ids) == sorted(sent)
    assert set(ids.values()) == {1}


def test_an_invalid_config_is_refused_and_the_old_one_runs_on(tmp_path: Path) -> None:
    port = free_port()
    cfg = write(tmp_path, [{"name": "spool"}], metrics_port=port)
    with running(cfg, port) as d:
        loaded = metric(port, "tfrecordd_config_last_reload_success_timestamp_seconds")
        assert loaded > 0
        write(tmp_path, [{"name": "spool", "poll_interval": "soon"}], metrics_port=port)
        cfg.write_text(cfg.read_text() + "bogus_key = 1\n")
        reload_and_wait(d, port, "failed")
        log = d.output()
        errors = [line for line in log.splitlines() if "reload: failed: " in line]
        assert any("poll_interval" in line for line in errors), errors
        assert any("bogus_key" in line for line in errors), errors
        assert metric(port, "tfrecordd_config_last_reload_success_timestamp_seconds") == loaded
        # The old config runs on.
        spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(10)])
        wait_for(lambda: len(read_ids(tmp_path / "shards")) == 10, 20)
        write(tmp_path, [{"name": "spool"}, {"name": "later"}], metrics_port=port)
        reload_and_wait(d, port, "applied")
        assert metric(port, "tfrecordd_config_last_reload_success_timestamp_seconds") > loaded
        spool_file(tmp_path / "later", "b.jsonl", [movie_event(i) for i in range(10, 20)])
        wait_for(lambda: len(read_ids(tmp_path / "shards")) == 20, 20)
        assert reloads(port, "failed") == 1
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(20), 1)


def test_two_quick_sighups_apply_the_newest_file(tmp_path: Path) -> None:
    port = free_port()
    cfg = write(tmp_path, [{"name": "spool"}], metrics_port=port)
    with running(cfg, port) as d:
        write(tmp_path, [{"name": "spool"}, {"name": "first"}], metrics_port=port)
        d.signal(signal.SIGHUP)
        write(tmp_path, [{"name": "spool"}, {"name": "second"}], metrics_port=port)
        d.signal(signal.SIGHUP)
        wait_for(lambda: "reload: source second started" in d.output(), 30)
        spool_file(tmp_path / "second", "a.jsonl", [movie_event(i) for i in range(5)])
        wait_for(lambda: len(read_ids(tmp_path / "shards")) == 5, 20)
        time.sleep(0.5)
        assert reloads(port, "failed") == 0
        assert 1 <= reloads(port, "applied") + reloads(port, "unchanged") <= 2
        # If the first reload saw the first file, the second one removed its source.
        log = d.output()
        assert "source first started" not in log or "source first stopped" in log, log[-3000:]


def test_sigusr1_publishes_the_open_shards(tmp_path: Path) -> None:
    port = free_port()
    cfg = write(tmp_path, [{"name": "spool"}], metrics_port=port, output={"max_shard_age": "1h"})
    with running(cfg, port) as d:
        spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(10)])
        wait_for(lambda: metric(port, "tfrecordd_records_written_total", dataset="movies") == 10)
        time.sleep(0.5)
        assert shard_files(tmp_path / "shards") == []
        d.signal(signal.SIGUSR1)
        wait_for(lambda: len(shard_files(tmp_path / "shards")) == 1, 10)
        assert "SIGUSR1: publishing open shards" in d.output()
        assert reloads(port, "applied") + reloads(port, "failed") == 0
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(10), 1)


def test_a_key_that_cannot_change_live_fails_the_reload_naming_it(tmp_path: Path) -> None:
    port = free_port()
    cfg = write(tmp_path, [{"name": "spool"}], metrics_port=port)
    with running(cfg, port) as d:
        write(
            tmp_path,
            [{"name": "spool"}, {"name": "new"}],
            metrics_port=port,
            daemon={"state_dir": tmp_path / "elsewhere"},
        )
        reload_and_wait(d, port, "failed")
        log = d.output()
        assert (
            "reload: failed: daemon.state_dir: cannot change while the daemon runs; "
            "restart to change it" in log
        ), log[-3000:]
        # Nothing of it was applied: the new source did not start.
        assert "source new started" not in log
        assert not (tmp_path / "elsewhere").exists()
        write(tmp_path, [{"name": "spool"}], metrics_port=port)
        reload_and_wait(d, port, "unchanged")


def test_the_reload_and_flush_commands_signal_the_daemon_of_a_config(tmp_path: Path) -> None:
    port = free_port()
    hour = {"max_shard_age": "1h"}
    cfg = write(tmp_path, [{"name": "spool"}], metrics_port=port, output=hour)
    absent = run_tfrecordd("flush", "--config", str(cfg))
    assert absent.returncode == 69, absent
    assert "no tfrecordd runs with state_dir" in absent.stderr
    with running(cfg, port) as d:
        spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(10)])
        wait_for(lambda: metric(port, "tfrecordd_records_written_total", dataset="movies") == 10)
        flushed = run_tfrecordd("flush", "--config", str(cfg))
        assert flushed.returncode == 0, flushed
        assert f"(PID {d.proc.pid})" in flushed.stdout
        wait_for(lambda: len(shard_files(tmp_path / "shards")) == 1, 10)
        same = run_tfrecordd("reload", "--config", str(cfg))
        assert (same.returncode, same.stdout) == (
            0,
            f"tfrecordd (PID {d.proc.pid}) reloaded its config: unchanged: nothing to apply\n",
        ), same
        write(tmp_path, [{"name": "spool"}, {"name": "more"}], metrics_port=port, output=hour)
        applied = run_tfrecordd("reload", "--config", str(cfg))
        assert applied.stdout.endswith("reloaded its config: applied\n"), applied
        cfg.write_text(cfg.read_text() + "[nonsense]\n")
        invalid = run_tfrecordd("reload", "--config", str(cfg))
        assert invalid.returncode == 78, invalid
        assert "nothing was sent (the daemon keeps the config it runs)" in invalid.stderr
        other = {"node_id": "other"}
        refused = write(tmp_path, [{"name": "spool"}], metrics_port=port, output=hour, daemon=other)
        failed = run_tfrecordd("reload", "--config", str(refused))
        assert failed.returncode == 78, failed
        assert "refused the new config and runs the old one" in failed.stderr
        assert reloads(port, "failed") == 1


def test_a_datasets_shard_cap_changes_live(tmp_path: Path) -> None:
    port = free_port()
    hour = {"max_shard_age": "1h"}
    cfg = write(tmp_path, [{"name": "spool"}], metrics_port=port, output=hour)
    out = tmp_path / "shards"

    def written() -> float:
        return metric(port, "tfrecordd_records_written_total", dataset="movies")

    with running(cfg, port) as d:
        spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(10)])
        wait_for(lambda: written() == 10)
        d.signal(signal.SIGUSR1)
        wait_for(lambda: len(shard_files(out)) == 1, 10)
        write(
            tmp_path, [{"name": "spool"}], metrics_port=port, output=hour | {"max_shard_records": 7}
        )
        reload_and_wait(d, port)
        assert "reload: applied (restarted: spool; datasets: movies)" in d.output()
        spool_file(tmp_path / "spool", "b.jsonl", [movie_event(i) for i in range(10, 30)])
        wait_for(lambda: written() == 30)
        d.signal(signal.SIGUSR1)
        wait_for(lambda: len(shard_files(out)) == 4, 10)
    sizes = [len(read_shard(p)) for p in shard_files(out)]
    assert sizes[0] == 10
    assert sorted(sizes[1:]) == [6, 7, 7], sizes
    assert read_ids(out) == dict.fromkeys(range(30), 1)


def test_a_new_source_that_cannot_start_is_retried_by_the_next_reload(tmp_path: Path) -> None:
    port, tcp_port = free_port(), free_port()
    cfg = write(tmp_path, [{"name": "spool"}], metrics_port=port)
    tcp = {"name": "tcp-in", "type": "tcp", "listen": f"127.0.0.1:{tcp_port}"}
    with running(cfg, port) as d:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", tcp_port))
            taken.listen()
            write(tmp_path, [{"name": "spool"}, tcp], metrics_port=port)
            reload_and_wait(d, port, "failed")
        log = d.output()
        assert "reload: failed: source tcp-in: cannot start: " in log
        assert "reload: failed: the other changes are applied; fix the config" in log
        assert "the running config is kept" not in log
        reload_and_wait(d, port, "applied")
        assert "reload: source tcp-in started" in d.output()
        assert (tmp_path / "state" / "sources" / "tcp-in").is_dir()  # made before it recovered
        with socket.create_connection(("127.0.0.1", tcp_port)) as c:
            c.sendall(b"".join(orjson.dumps(movie_event(i)) + b"\n" for i in range(5)))
        wait_for(lambda: len(read_ids(tmp_path / "shards")) == 5, 20)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_encoders_features_change_live(tmp_path: Path, workers: int) -> None:
    port = free_port()
    daemon = {"encode_workers": workers}
    fewer = {k: v for k, v in MOVIES_FEATURES.items() if k != "purchase_price"}
    cfg = write(tmp_path, [{"name": "spool"}], metrics_port=port, daemon=daemon, features=fewer)
    out = tmp_path / "shards"
    with running(cfg, port) as d:
        spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(5)])
        wait_for(lambda: len(read_ids(out)) == 5, 20)
        write(tmp_path, [{"name": "spool"}], metrics_port=port, daemon=daemon)
        if workers > 1:
            reload_and_wait(d, port, "failed")
            assert (
                "reload: failed: source spool: its encoding differs from what the encode worker "
                "processes were started with (encode_workers > 1); restart to change it"
            ) in d.output()
            return
        reload_and_wait(d, port)
        spool_file(tmp_path / "spool", "b.jsonl", [movie_event(i) for i in range(5, 10)])
        wait_for(lambda: len(read_ids(out)) == 10, 20)
    priced = sorted(int(e["id"][0]) for e in read_examples(out) if "purchase_price" in e)
    assert priced == list(range(5, 10))


def dropped(port: int) -> float:
    """Every event the daemon counted as dropped, whatever the source and reason."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return sum(
        float(line.split()[-1])
        for line in lines
        if line.startswith("tfrecordd_events_dropped_total{")
    )


def test_udp_datagrams_through_reloads_are_each_written_once(tmp_path: Path) -> None:
    port, udp_port = free_port(), free_port()

    def udp(n: int) -> dict[str, Any]:
        listen = f"127.0.0.1:{udp_port}"
        return {"name": "udp-in", "type": "udp", "listen": listen, "buffer_events": 10000 + n % 2}

    cfg = write(tmp_path, [udp(0)], metrics_port=port)
    sent: list[int] = []
    with running(cfg, port) as d:

        def sender(stop: threading.Event) -> None:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                i = 0
                while not stop.is_set() and i < 20000:
                    s.sendto(orjson.dumps(movie_event(i)), ("127.0.0.1", udp_port))
                    sent.append(i)
                    i += 1
                    if i % 10 == 0:  # about 500 a second: a reload's pause fits the buffer
                        time.sleep(0.02)

        with meanwhile(sender, join=30):
            for n in range(1, 11):
                write(tmp_path, [udp(n)], metrics_port=port)
                reload_and_wait(d, port)
        wait_for(lambda: len(read_ids(tmp_path / "shards")) + dropped(port) >= len(sent), 30)
        lost = dropped(port)
        log = d.output()
    assert "keeps its listening socket" in log
    ids = read_ids(tmp_path / "shards")
    assert set(ids.values()) == {1}
    assert set(ids) <= set(sent)
    assert (len(ids), lost) == (len(sent), 0)
