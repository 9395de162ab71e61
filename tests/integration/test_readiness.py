"""Readiness per source, with real parts: a redis-server stopped under a running daemon, a TCP
source whose ``accept()`` fails, a drain cut short by a second signal. Each trouble shows within
seconds in ``/readyz``, ``tfrecordd_source_up`` and ``tfrecordd status``, is logged once (then
at most once a minute), and nothing is lost or written twice once it is over."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import orjson
import pytest
from redis import Redis

from tests.redis_server import RedisServer, write_redis_config
from tests.support import (
    DaemonProcess,
    free_port,
    metric_sum,
    movie_event,
    read_ids,
    run_tfrecordd,
    spool_drained,
    spool_file,
    wait_for,
    write_config,
    write_tcp_config,
)
from tfrecordd.config import load_config
from tfrecordd.pipeline import runtime
from tfrecordd.pipeline.runtime import Daemon

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(port: int, path: str) -> tuple[int, bytes]:
    """The status and body of ``GET path`` on the metrics endpoint."""
    try:
        with _opener.open(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return int(r.status), bytes(r.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read()


def sample(text: str, name: str, **labels: str) -> float | None:
    """One sample's value in a Prometheus exposition (``None``: absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if m and ",".join(sorted((m.group(1) or "").split(","))) == want:
            return float(m.group(2))
    return None


def source_up(port: int, source: str) -> float | None:
    return sample(get(port, "/metrics")[1].decode(), "tfrecordd_source_up", source=source)


def open_records(port: int) -> float:
    """Records in the open shards, summed over the datasets."""
    text = get(port, "/metrics")[1].decode()
    lines = [x for x in text.splitlines() if x.startswith("tfrecordd_open_shard_records{")]
    return sum(float(x.rsplit(" ", 1)[1]) for x in lines)


def with_metrics(config: Path, port: int) -> Path:
    """``config`` (written by ``write_redis_config``) with its metrics endpoint on ``port``."""
    text = config.read_text()
    text = text.replace('[metrics]\n"enabled" = false', f'[metrics]\nlisten = "127.0.0.1:{port}"')
    config.write_text(text)
    return config


def xadd(url: str, first: int, n: int) -> None:
    with Redis.from_url(url) as r:
        pipe = r.pipeline(transaction=False)
        for i in range(first, first + n):
            pipe.xadd("events", {"data": orjson.dumps(movie_event(i))})
        pipe.execute()


def pending(url: str) -> int:
    with Redis.from_url(url) as r:
        return int(r.xpending("events", "tfrecordd")["pending"])


@pytest.fixture
def redis_daemon(tmp_path: Path, redis_server: RedisServer) -> Iterator[tuple[DaemonProcess, int]]:
    port = free_port()
    cfg = write_redis_config(
        tmp_path,
        redis_server.url,
        source={"reconnect_max_delay": "500ms"},
        output={"max_shard_age": "200ms"},
    )
    daemon = DaemonProcess(with_metrics(cfg, port))
    try:
        daemon.wait_started()
        wait_for(lambda: get(port, "/readyz")[0] == 200, 10)
        yield daemon, port
    finally:
        daemon.kill()


def test_redis_stopped_is_not_ready_within_seconds_and_ready_again_when_back(
    tmp_path: Path, redis_server: RedisServer, redis_daemon: tuple[DaemonProcess, int]
) -> None:
    daemon, port = redis_daemon
    url = redis_server.url
    xadd(url, 0, 50)
    wait_for(lambda: len(read_ids(tmp_path / "shards")) == 50 and pending(url) == 0, 30)
    status, body = get(port, "/readyz")
    assert status == 200, body
    assert json.loads(body)["sources"]["events"]["up"] is True
    assert source_up(port, "events") == 1

    redis_server.stop(save=True)
    stopped = time.monotonic()
    wait_for(lambda: get(port, "/readyz")[0] == 503, 10)
    assert time.monotonic() - stopped < 5, "not ready within seconds"
    answer = json.loads(get(port, "/readyz")[1])
    assert answer["ready"] is False
    assert answer["healthy"] is True
    reason = answer["sources"]["events"]["down"]["reading"]["reason"]
    assert reason.startswith("redis stream events: "), reason
    assert answer["not_ready"] == [f"source events: reading: {reason}"]
    assert source_up(port, "events") == 0
    # Liveness is not readiness: a Redis outage alone does not fail /healthz.
    assert get(port, "/healthz") == (200, b"ok\n")
    probe = run_tfrecordd("healthcheck", "--ready", "--url", f"http://127.0.0.1:{port}/readyz")
    assert probe.returncode == 1
    assert "HTTP 503" in probe.stderr
    assert "source events: reading: redis stream events: " in probe.stderr
    live = run_tfrecordd("healthcheck", "--url", f"http://127.0.0.1:{port}/healthz")
    assert live.returncode == 0, live.stderr

    shown = run_tfrecordd("status", "--url", f"http://127.0.0.1:{port}/metrics", "--once",
                          "--interval", "0")  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert ": up, NOT READY (a source is down)" in shown.stdout
    line = next(x for x in shown.stdout.splitlines() if x.startswith("events ") and "DOWN" in x)
    # The reason is the latest failure's (Redis's words may change from one try to the next).
    assert re.search(
        r"DOWN for \d+s \(since \S+Z\), \d+ reconnect attempts?: reading: redis stream events: ",
        line,
    ), line

    time.sleep(3)  # reconnect attempts every 500ms or less: several failures, one warning
    metrics = get(port, "/metrics")[1].decode()
    attempts = sample(metrics, "tfrecordd_source_reconnects_total", source="events")
    assert (attempts or 0) >= 4, metrics
    log = daemon.output()
    assert log.count("source events: reading failed: ") == 1, log[-3000:]

    redis_server.start()
    xadd(url, 50, 50)
    wait_for(lambda: get(port, "/readyz")[0] == 200, 15)
    assert source_up(port, "events") == 1
    probe = run_tfrecordd("healthcheck", "--ready", "--url", f"http://127.0.0.1:{port}/readyz")
    assert probe.returncode == 0, probe.stderr
    wait_for(lambda: len(read_ids(tmp_path / "shards")) == 100 and pending(url) == 0, 30)
    assert re.search(r"source events: reading works again \(after [\d.]+s and \d+ failure",
                     daemon.output())  # fmt: skip
    shown = run_tfrecordd("status", "--url", f"http://127.0.0.1:{port}/metrics", "--once",
                          "--interval", "0", "--json")  # fmt: skip
    state = json.loads(shown.stdout)["sources"]["events"]["state"]
    assert state["up"] is True
    assert state["reconnects"] >= 5
    assert state["last_error"].startswith("redis stream events: ")
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(30) == 0, daemon.output()
    # Every event in, once each, out.
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(100), 1)


@pytest.mark.anyio
async def test_acks_refused_show_at_once_and_fail_healthz_once_they_last(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "ACKS_STUCK_AFTER", 2.0)
    cfg = write_redis_config(
        tmp_path,
        redis_server.url,
        source={"reconnect_max_delay": "300ms"},
        output={"max_shard_age": "1h"},
    )
    daemon = Daemon(load_config(cfg), handle_signals=False)
    url = redis_server.url
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        await anyio.to_thread.run_sync(xadd, url, 0, 30)
        with anyio.fail_after(20):
            while metric_sum(daemon.metrics.registry, "tfrecordd_open_shard_records") < 30:
                await anyio.sleep(0.05)
        await anyio.to_thread.run_sync(lambda: redis_server.stop(save=True))
        daemon.request_flush()  # published now; its acks cannot reach Redis
        (state,) = daemon.source_states()
        with anyio.fail_after(5):
            while "acking" not in state.down:
                await anyio.sleep(0.05)
        assert state.down["acking"][0].startswith("redis stream events: XACK: "), state.down
        assert daemon.healthy(), "a short ack failure is not a liveness failure"
        await anyio.sleep(2.5)
        assert not daemon.healthy(), "acks refused past ACKS_STUCK_AFTER fail /healthz"
        await anyio.to_thread.run_sync(redis_server.start)
        with anyio.fail_after(10):
            while not state.up:
                await anyio.sleep(0.05)
        assert daemon.healthy()
        assert await anyio.to_thread.run_sync(pending, url) == 0
        daemon.request_stop()
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(30), 1)


def test_a_second_sigterm_during_the_drain_exits_143_and_loses_nothing(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    port = free_port()
    cfg = write_redis_config(tmp_path, redis_server.url, output={"max_shard_age": "1h"})
    url = redis_server.url
    xadd(url, 0, 40)
    daemon = DaemonProcess(with_metrics(cfg, port))
    try:
        daemon.wait_started()
        wait_for(lambda: open_records(port) == 40, 20)
        redis_server.stop(save=True)
        daemon.signal(signal.SIGTERM)  # the drain publishes, then waits on acks Redis cannot take
        wait_for(lambda: "published " in daemon.output(), 20)
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(10) == 128 + signal.SIGTERM == 143, daemon.output()
        assert "second SIGTERM: exiting at once (status 143)" in daemon.output()
    finally:
        daemon.kill()
    redis_server.start()
    again = DaemonProcess(cfg)
    try:
        again.wait_started()  # recovery redid the acks of the published shard
        assert pending(url) == 0
        again.signal(signal.SIGTERM)
        assert again.wait(30) == 0, again.output()
    finally:
        again.kill()
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(40), 1)


def ask(conn: socket.socket, path: str) -> tuple[int, bytes]:
    """``GET path`` on a connection the endpoint has accepted already."""
    conn.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_a_socket_source_that_cannot_accept_is_not_ready(tmp_path: Path) -> None:
    tcp_port, metrics_port = free_port(), free_port()
    daemon = DaemonProcess(write_tcp_config(tmp_path, tcp_port, metrics_port))
    pid = daemon.proc.pid
    try:
        daemon.wait_started()
        wait_for(lambda: get(metrics_port, "/readyz")[0] == 200, 10)
        # Accepted before the limit drops: the endpoint answers on it while accept() fails.
        probe = socket.create_connection(("127.0.0.1", metrics_port))
        time.sleep(0.3)
        lower_descriptors_to_none(pid)  # every accept() fails with EMFILE
        clients = [socket.create_connection(("127.0.0.1", tcp_port)) for _ in range(2)]
        time.sleep(1.0)
        with probe:
            status, body = ask(probe, "/readyz")
        assert status == 503, body
        down = json.loads(body)["sources"]["tcp-in"]["down"]
        assert down["accepting"]["reason"].startswith("accept failed: "), down
        assert "Too many open files" in down["accepting"]["reason"], down
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (4096, 4096))
        for c in clients:
            c.close()
        wait_for(lambda: get(metrics_port, "/readyz")[0] == 200, 10)
        with socket.create_connection(("127.0.0.1", tcp_port)) as c:
            c.sendall(b"".join(orjson.dumps(movie_event(i)) + b"\n" for i in range(10)))
        wait_for(lambda: len(read_ids(tmp_path / "shards")) == 10, 20)
        assert source_up(metrics_port, "tcp-in") == 1
        log = daemon.output()
        assert log.count("source tcp-in: accepting failed: ") == 1, log[-3000:]
        assert "source tcp-in: accepting works again" in log
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, daemon.output()
    finally:
        daemon.kill()
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(10), 1)


def lower_descriptors_to_none(pid: int) -> None:
    """Set ``pid``'s descriptor limit to its lowest free descriptor: every open fails (EMFILE)."""
    held = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
    lowest_free = min(set(range(len(held) + 1)) - held)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (lowest_free, 4096))


def test_a_spool_that_cannot_be_listed_is_not_ready(tmp_path: Path) -> None:
    metrics_port = free_port()
    cfg = write_config(tmp_path, metrics_port=metrics_port, output={"max_shard_age": "200ms"})
    daemon = DaemonProcess(cfg)
    pid = daemon.proc.pid
    try:
        daemon.wait_started()
        wait_for(lambda: get(metrics_port, "/readyz")[0] == 200, 10)
        probe = socket.create_connection(("127.0.0.1", metrics_port))
        time.sleep(0.3)
        lower_descriptors_to_none(pid)  # the spool folder cannot be opened to be listed
        time.sleep(1.0)  # polled every 100ms
        with probe:
            status, body = ask(probe, "/readyz")
        assert status == 503, body
        down = json.loads(body)["sources"]["spool"]["down"]
        assert down["reading"]["reason"].startswith(f"cannot list {tmp_path / 'spool'}: "), down
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (4096, 4096))
        wait_for(lambda: get(metrics_port, "/readyz")[0] == 200, 10)
        spool_file(tmp_path / "spool", "a.jsonl", [movie_event(i) for i in range(10)])
        wait_for(lambda: spool_drained(tmp_path / "spool"))
        assert source_up(metrics_port, "spool") == 1
        log = daemon.output()
        assert log.count("source spool: reading failed: cannot list ") == 1, log[-3000:]
        assert "source spool: reading works again" in log
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, daemon.output()
    finally:
        daemon.kill()
    assert read_ids(tmp_path / "shards") == dict.fromkeys(range(10), 1)


def test_status_names_each_figure_in_singular_and_plural(tmp_path: Path) -> None:
    tcp_port, metrics_port = free_port(), free_port()
    cfg = write_tcp_config(tmp_path, tcp_port, metrics_port)
    cfg.write_text(cfg.read_text().replace('max_shard_age = "200ms"', 'max_shard_age = "1h"'))
    daemon = DaemonProcess(cfg)
    url = f"http://127.0.0.1:{metrics_port}/metrics"

    def status() -> str:
        shown = run_tfrecordd("status", "--url", url, "--once", "--interval", "0")
        assert shown.returncode == 0, shown.stderr
        return shown.stdout

    def send(first: int, n: int) -> None:
        with socket.create_connection(("127.0.0.1", tcp_port)) as c:
            c.sendall(b"".join(orjson.dumps(movie_event(i)) + b"\n" for i in range(first, n)))

    try:
        daemon.wait_started()
        send(0, 1)
        wait_for(lambda: open_records(metrics_port) == 1, 20)
        text = status()
        assert "\nwritten     1 record (" in text
        assert "): 0 in published shards, 1 in open shards\n" in text
        assert "\npublished   0 shards, last never\n" in text
        assert "\nopen        1 shard holding 1 record not yet published, " in text
        assert re.search(r"\ntcp-in +up\n", text), text
        os.kill(daemon.proc.pid, signal.SIGUSR1)  # publish the open shard now
        wait_for(lambda: open_records(metrics_port) == 0, 20)
        send(1, 5)
        wait_for(lambda: open_records(metrics_port) == 4, 20)
        text = status()
        assert "\nwritten     5 records (" in text
        assert "): 1 in published shards, 4 in open shards\n" in text
        assert "\npublished   1 shard, last " in text
        assert "\nopen        1 shard holding 4 records not yet published, " in text
        assert not re.search(r"\b1 (records|shards)\b|\b[02-9] (record|shard)\b", text), text
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, daemon.output()
    finally:
        daemon.kill()


ROOT = Path(__file__).resolve().parents[2]


def test_the_source_down_alert_fires_after_two_minutes_down(tmp_path: Path) -> None:
    """promtool's rule unit test: a source down 2 minutes alerts; a blip, or one up, does not."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found: install Debian's 'prometheus' package (CI installs it)")
    base = {"job": "tfrecordd", "instance": "a"}

    def series(source: str, values: str) -> dict[str, str]:
        labels = ", ".join(f'{k}="{v}"' for k, v in (base | {"source": source}).items())
        return {"series": f"tfrecordd_source_up{{{labels}}}", "values": values}

    summary = "tfrecordd source redis on a has been down for 2 minutes"
    spec = {
        "rule_files": [str(ROOT / "config" / "prometheus" / "alerts.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    series("redis", "1 1 0 0 0 0 1 1"),
                    series("spool", "1 0 1 1 1 1 1 1"),  # down for a minute: no alert
                    series("tcp", "1x7"),
                ],
                "alert_rule_test": [
                    {"eval_time": "3m", "alertname": "TfrecorddSourceDown", "exp_alerts": []},
                    {
                        "eval_time": "4m",
                        "alertname": "TfrecorddSourceDown",
                        "exp_alerts": [
                            {
                                "exp_labels": base | {"source": "redis", "severity": "critical"},
                                "exp_annotations": {
                                    "summary": summary,
                                    "description": (
                                        "Source redis reports that it cannot read from its "
                                        "server or input, acknowledge what was published, or "
                                        "accept its clients; it keeps retrying by itself "
                                        "(tfrecordd_source_reconnects_total). /readyz and "
                                        "`tfrecordd status` on the instance say why. Acks "
                                        "refused for 2 minutes also fail /healthz: every later "
                                        "commit waits behind them."
                                    ),
                                },
                            }
                        ],
                    },
                    {"eval_time": "7m", "alertname": "TfrecorddSourceDown", "exp_alerts": []},
                ],
            }
        ],
    }
    path = tmp_path / "alerts.test.yml"
    path.write_text(json.dumps(spec, indent=2))  # JSON is YAML
    result = subprocess.run(
        [promtool, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_daemon_paused_for_disk_space_or_draining_is_not_ready(tmp_path: Path) -> None:
    port = free_port()
    cfg = write_config(
        tmp_path,
        daemon={"drain_timeout": "8s"},
        output={"min_free_bytes": "1000TiB"},  # more than any disk: the writer waits for room
        metrics_port=port,
    )
    spool_file(tmp_path / "spool", "a.jsonl", [movie_event(0)])
    daemon = DaemonProcess(cfg)
    try:
        daemon.wait_started()
        wait_for(lambda: get(port, "/readyz")[0] == 503, 20)
        not_ready = json.loads(get(port, "/readyz")[1])["not_ready"]
        assert any("output nearly full, sources paused" in line for line in not_ready), not_ready
        assert get(port, "/healthz")[0] == 200, "paused is not dead"
        daemon.signal(signal.SIGTERM)
        wait_for(lambda: "draining" in get(port, "/readyz")[1].decode(), 5)
    finally:
        daemon.kill()
