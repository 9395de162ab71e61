"""What a reload changes (:func:`plan_reload`): sources added, changed, removed; the keys that
cannot change live, each named; and the systemd notification a reload sends."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from tfrecordd.config import DaemonConfig, load_config
from tfrecordd.notify import SystemdNotifier
from tfrecordd.pipeline.reload import plan_reload


def config(
    tmp_path: Path, *, sources: list[dict[str, Any]], **sections: dict[str, Any]
) -> DaemonConfig:
    daemon = {"node_id": "n1", "state_dir": str(tmp_path / "state")} | sections.get("daemon", {})
    dataset = {"dir": str(tmp_path / "out"), "encoder": "e"} | sections.get("dataset", {})
    lines = ["[daemon]", *(f"{k} = {v!r}" for k, v in daemon.items())]
    lines += ["[metrics]", "enabled = false", "[datasets.d]"]
    lines += [f"{k} = {v!r}" for k, v in dataset.items()]
    for src in sources:
        full = {"type": "directory", "dataset": "d"} | src
        if full["type"] == "directory":
            full.setdefault("path", str(tmp_path / src["name"]))
        lines += ["[[sources]]", *(f"{k} = {v!r}" for k, v in full.items())]
    lines += ["[encoders.e]", 'type = "example"', "[encoders.e.features]", 'id = "int64"']
    path = tmp_path / "c.toml"
    path.write_text("\n".join(lines).replace("'", '"') + "\n")
    return load_config(path)


def test_the_same_config_is_unchanged(tmp_path: Path) -> None:
    a = config(tmp_path, sources=[{"name": "s"}])
    plan = plan_reload(a, config(tmp_path, sources=[{"name": "s"}]))
    assert plan.unchanged
    assert plan.summary() == "nothing changed"


def test_sources_added_changed_and_removed(tmp_path: Path) -> None:
    old = config(tmp_path, sources=[{"name": "keep"}, {"name": "edit"}, {"name": "gone"}])
    new = config(
        tmp_path,
        sources=[{"name": "keep"}, {"name": "edit", "poll_interval": "3s"}, {"name": "new"}],
    )
    plan = plan_reload(old, new)
    assert (plan.added, plan.changed, plan.removed, plan.refused) == (
        ["new"],
        ["edit"],
        ["gone"],
        [],
    )
    assert plan.summary() == "sources added: new; restarted: edit; removed: gone"


def test_drain_timeout_changes_live(tmp_path: Path) -> None:
    old = config(tmp_path, sources=[{"name": "s"}])
    new = config(tmp_path, sources=[{"name": "s"}], daemon={"drain_timeout": "5s"})
    plan = plan_reload(old, new)
    assert plan.settings == ["daemon.drain_timeout"]
    assert not plan.refused
    assert not plan.unchanged


def test_each_key_that_cannot_change_live_is_named(tmp_path: Path) -> None:
    old = config(tmp_path, sources=[{"name": "s"}])
    new = config(
        tmp_path,
        sources=[{"name": "s", "type": "udp"}],
        daemon={"state_dir": str(tmp_path / "other"), "node_id": "n2", "encode_workers": 2},
        dataset={"compression": "zstd", "max_shard_records": 10},
    )
    refused = plan_reload(old, new).refused
    keys = [line.split(":")[0] for line in refused]
    assert keys == [
        "daemon.node_id",
        "daemon.state_dir",
        "daemon.encode_workers",
        "datasets.d.compression",
        "sources[0].type (source s",
    ], refused
    assert all(
        line.endswith("cannot change while the daemon runs; restart to change it")
        for line in refused
    )


def test_reloading_tells_systemd_with_the_monotonic_clock(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        server.settimeout(5)
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        with SystemdNotifier({"NOTIFY_SOCKET": path}) as notifier:
            assert notifier.reloading("reloading c.toml")
            fields = server.recv(4096).decode().split("\n")
            assert notifier.ready()
            assert server.recv(4096) == b"READY=1"
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert fields[0] == "RELOADING=1"
    assert fields[1].startswith("MONOTONIC_USEC=")
    assert before <= int(fields[1].removeprefix("MONOTONIC_USEC=")) <= after
    assert fields[2] == "STATUS=reloading c.toml"


def test_a_datasets_shard_limits_change_live_restarting_its_sources(tmp_path: Path) -> None:
    sources = [{"name": "a"}, {"name": "b"}]
    old = config(tmp_path, sources=sources)
    new = config(tmp_path, sources=sources, dataset={"max_shard_records": 10})
    plan = plan_reload(old, new)
    assert (plan.datasets, plan.changed, plan.refused) == (["d"], ["a", "b"], [])
    assert plan.summary() == "restarted: a, b; datasets: d"
