"""The Grafana dashboard and the Prometheus alert rules: valid for promtool, the alerts fire when
they should, and every metric they use is one a live daemon really exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import DaemonProcess, free_port, spool_file, wait_for, write_config
from tfrecordd.configref import metric_descriptions
from tfrecordd.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "config" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "config" / "grafana" / "tfrecordd.json"

EXEMPT = {"up": "Prometheus's own per-target series: the daemon cannot report that it is down"}
"""Metric names the rules may use that the daemon does not export, each with why."""

_PROMQL_WORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "inf", "nan",
}  # fmt: skip


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not found: install Debian's 'prometheus' package (CI installs it)")
    return path


def alert_expressions(text: str) -> list[str]:
    """Each rule's ``expr``, inline or a ``|`` block, read from the YAML text."""
    exprs: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)(?:- )?expr:\s*(.*)$", line)
        if not m:
            continue
        value = m.group(2).strip()
        if value not in ("|", ">", "|-", ">-"):
            exprs.append(value)
            continue
        indent = len(m.group(1))
        block = []
        for nxt in lines[i + 1 :]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                break
            block.append(nxt.strip())
        exprs.append(" ".join(block).strip())
    return exprs


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of every panel (nested in rows too)."""

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    return [t["expr"] for p in panels(dashboard["panels"]) for t in p.get("targets", [])]


def variable_metrics(dashboard: dict[str, Any]) -> set[str]:
    """Metrics named in the query variables' ``label_values(metric{...}, label)``."""
    names = set()
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            m = re.match(r"label_values\(\s*([A-Za-z_:][\w:]*)", var["query"]["query"])
            assert m, f"variable {var['name']}: expected label_values(metric, label)"
            names.add(m.group(1))
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels or keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for m in re.finditer(r"(?<![\w$.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        if m.group(2) is None and m.group(1) not in _PROMQL_WORDS:
            names.add(m.group(1))
    return names


def _as_rules(exprs: list[str]) -> dict[str, Any]:
    """Dashboard expressions as recording rules, so promtool parses each one."""
    rules = []
    for i, expr in enumerate(exprs):
        concrete = expr.replace("$__rate_interval", "5m").replace("$__range", "1h")
        concrete = re.sub(r"\$\w+", ".*", concrete)
        rules.append({"record": f"dashboard:query_{i}", "expr": concrete})
    return {"groups": [{"name": "dashboard", "rules": rules}]}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every sample name a live daemon's /metrics exports (or declares, for labelled metrics
    that have no sample yet), after it has turned a spool file into a shard."""
    root = tmp_path_factory.mktemp("daemon")
    port = free_port()
    cfg = write_config(root, metrics_port=port, output={"max_shard_age": "200ms"})
    spool_file(root / "spool", "a.jsonl", ['{"id": 1}', "{broken"])
    d = DaemonProcess(cfg)
    try:
        d.wait_started()
        url = f"http://127.0.0.1:{port}/metrics"
        wait_for(lambda: 'tfrecordd_shards_published_total{dataset="movies"} 1.0' in _get(url), 30)
        text = _get(url)
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    names = {line.split("{")[0].split()[0] for line in text.splitlines() if line[:1].isalpha()}
    suffixes = {
        "counter": ["_total", "_created"],
        "histogram": ["_bucket", "_sum", "_count", "_created"],
        "info": ["_info"],
        "gauge": [""],
    }
    for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M):
        kind = m.group(2)
        base = m.group(1).removesuffix("_total") if kind == "counter" else m.group(1)
        names |= {base + s for s in suffixes.get(kind, [""])}
    return names


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            body: bytes = r.read()
            return body.decode()
    except OSError:
        return ""


def test_alert_rules_pass_promtool_check() -> None:
    result = subprocess.run(
        [_promtool(), "check", "rules", str(ALERTS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found = re.search(r"SUCCESS: (\d+) rules found", result.stdout)
    assert found, result.stdout
    assert int(found.group(1)) == len(alert_expressions(ALERTS.read_text())), (
        "every rule's expression is read by this test"
    )


def _series(metric: str, values: str, **labels: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in ({"job": "tfrecordd"} | labels).items())
    return {"series": f"{metric}{{{inner}}}", "values": values}


def _labels(alert: str, severity: str, **labels: str) -> dict[str, str]:
    return {"alertname": alert, "severity": severity, "job": "tfrecordd"} | labels


def test_alerts_fire_when_they_should(tmp_path: Path) -> None:
    """promtool's rule unit tests: each alert fires on the bad instance, not on the sound one."""
    no_publish = "tfrecordd on a receives events but has published no shard for 30 minutes"
    tests = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # a: events arrive, nothing ever published. b: idle. c: publishes each minute.
                    _series("tfrecordd_last_publish_timestamp_seconds", "0x60", instance="a"),
                    _series(
                        "tfrecordd_events_received_total", "0+100x60", instance="a", source="s"
                    ),
                    _series("tfrecordd_last_publish_timestamp_seconds", "0x60", instance="b"),
                    _series("tfrecordd_events_received_total", "0x60", instance="b", source="s"),
                    _series("tfrecordd_last_publish_timestamp_seconds", "0+60x60", instance="c"),
                    _series(
                        "tfrecordd_events_received_total", "0+100x60", instance="c", source="s"
                    ),
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "20m",
                        "alertname": "TfrecorddNoShardPublished",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "40m",
                        "alertname": "TfrecorddNoShardPublished",
                        "exp_alerts": [
                            {
                                "exp_labels": _labels(
                                    "TfrecorddNoShardPublished", "critical", instance="a"
                                ),
                                "exp_annotations": {
                                    "summary": no_publish,
                                    "description": "Events keep arriving but no shard has been "
                                    "published for over 30 minutes, longer than any sane "
                                    "max_shard_age: the write or commit stage is stuck, and "
                                    "sources are not acknowledged.",
                                },
                            }
                        ],
                    },
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    _series(
                        "tfrecordd_events_dead_lettered_total",
                        "0 0 0 0 0 3 5 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9",
                        instance="a",
                        source="bad",
                    ),
                    _series(
                        "tfrecordd_events_dead_lettered_total", "0x30", instance="a", source="good"
                    ),
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "6m",
                        "alertname": "TfrecorddDeadLettersRising",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "12m",
                        "alertname": "TfrecorddDeadLettersRising",
                        "exp_alerts": [
                            {
                                "exp_labels": _labels(
                                    "TfrecorddDeadLettersRising",
                                    "warning",
                                    instance="a",
                                    source="bad",
                                ),
                                "exp_annotations": {
                                    "summary": "tfrecordd source bad on a is dead-lettering events",
                                    "description": "Events from source bad fail to encode and go "
                                    "to dead-letters.jsonl in the state directory; "
                                    "tfrecordd_events_invalid_total says why (its reason label).",
                                },
                            }
                        ],
                    },
                    {
                        "eval_time": "29m",
                        "alertname": "TfrecorddDeadLettersRising",
                        "exp_alerts": [],
                    },
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'up{job="tfrecordd",instance="a"}', "values": "1 1 1 0 0 0 0 0"},
                    {"series": 'up{job="tfrecordd",instance="b"}', "values": "1x8"},
                    _series(
                        "tfrecordd_output_free_bytes",
                        "10e9 1e9 1e9 1e9 1e9 1e9 1e9 1e9",
                        instance="a",
                    ),
                    _series("tfrecordd_output_free_bytes", "10e9x8", instance="b"),
                ],
                "alert_rule_test": [
                    {"eval_time": "4m", "alertname": "TfrecorddDown", "exp_alerts": []},
                    {
                        "eval_time": "6m",
                        "alertname": "TfrecorddDown",
                        "exp_alerts": [
                            {
                                "exp_labels": _labels("TfrecorddDown", "critical", instance="a"),
                                "exp_annotations": {
                                    "summary": "tfrecordd on a is down",
                                    "description": "Prometheus has not been able to scrape "
                                    "tfrecordd on a for 2 minutes: the daemon is stopped, crashed, "
                                    "or its metrics endpoint is unreachable.",
                                },
                            }
                        ],
                    },
                    {
                        "eval_time": "7m",
                        "alertname": "TfrecorddOutputDiskAlmostFull",
                        "exp_alerts": [
                            {
                                "exp_labels": _labels(
                                    "TfrecorddOutputDiskAlmostFull", "critical", instance="a"
                                ),
                                "exp_annotations": {
                                    "summary": "tfrecordd on a has less than 2 GiB free on its "
                                    "output",
                                    "description": "The file system of the output directory is "
                                    "nearly full; once it is, the daemon pauses its sources.",
                                },
                            }
                        ],
                    },
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    _series(
                        "tfrecordd_events_late_total",
                        "0 0 2 4 4x20",
                        instance="a",
                        dataset="clicks",
                    ),
                    _series("tfrecordd_events_late_total", "0x25", instance="a", dataset="views"),
                    _series(
                        "tfrecordd_partitions_pending", "60x50", instance="a", dataset="clicks"
                    ),
                    _series("tfrecordd_partitions_pending", "3x50", instance="a", dataset="views"),
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "10m",
                        "alertname": "TfrecorddLateEvents",
                        "exp_alerts": [
                            {
                                "exp_labels": _labels(
                                    "TfrecorddLateEvents",
                                    "warning",
                                    instance="a",
                                    dataset="clicks",
                                ),
                                "exp_annotations": {
                                    "summary": "tfrecordd dataset clicks on a receives events for "
                                    "partitions already marked complete",
                                    "description": "Events of dataset clicks arrive after their "
                                    "time partition was closed and marked: they are dead-lettered "
                                    "(reason late) or written under _late/, as completion.late "
                                    "says. Producers lag more than allowed_lateness: raise it, or "
                                    "find the late producer.",
                                },
                            }
                        ],
                    },
                    {"eval_time": "24m", "alertname": "TfrecorddLateEvents", "exp_alerts": []},
                    {
                        "eval_time": "20m",
                        "alertname": "TfrecorddPartitionsPiling",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "40m",
                        "alertname": "TfrecorddPartitionsPiling",
                        "exp_alerts": [
                            {
                                "exp_labels": _labels(
                                    "TfrecorddPartitionsPiling",
                                    "warning",
                                    instance="a",
                                    dataset="clicks",
                                ),
                                "exp_annotations": {
                                    "summary": "tfrecordd dataset clicks on a has more than 48 "
                                    "time partitions waiting for their marker",
                                    "description": "Partitions of dataset clicks are opened faster "
                                    "than they close: events span a wide range of times (a "
                                    "backfill), or the watermark does not advance. Each waits for "
                                    "its _SUCCESS marker; check "
                                    "tfrecordd_watermark_timestamp_seconds.",
                                },
                            }
                        ],
                    },
                ],
            },
        ],
    }
    spec = tmp_path / "alerts.test.yml"
    spec.write_text(json.dumps(tests, indent=2))  # JSON is YAML
    result = subprocess.run(
        [_promtool(), "test", "rules", str(spec)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_queries_parse_as_promql(tmp_path: Path, dashboard: dict[str, Any]) -> None:
    exprs = dashboard_queries(dashboard)
    assert len(exprs) >= 20
    rules = tmp_path / "dashboard-rules.yml"
    rules.write_text(json.dumps(_as_rules(exprs)))
    result = subprocess.run(
        [_promtool(), "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_is_importable_with_a_datasource_variable(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = []
    for panel in dashboard["panels"]:
        ids.append(panel["id"])
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            follows = 'job=~"$job"' in target["expr"] and 'instance=~"$instance"' in target["expr"]
            assert follows, f"{panel['title']}: every query follows the job and instance selectors"
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for name in ("job", "instance", "source"):
        assert variables[name]["datasource"]["uid"] == "${datasource}"


def test_every_daemon_metric_is_on_the_dashboard(dashboard: dict[str, Any]) -> None:
    used = set().union(*(metric_names(e) for e in dashboard_queries(dashboard)))
    for name, kind, _, _ in metric_descriptions(Metrics()):
        shown = {name + "_bucket"} if kind == "histogram" else {name}
        assert shown & used, f"{name} is exported but not on the dashboard"


def test_every_metric_in_rules_and_dashboard_is_exported(
    exported: set[str], dashboard: dict[str, Any]
) -> None:
    used: dict[str, set[str]] = {}
    for expr in alert_expressions(ALERTS.read_text()):
        used.setdefault("alerts.yml", set()).update(metric_names(expr))
    for expr in dashboard_queries(dashboard):
        used.setdefault("tfrecordd.json", set()).update(metric_names(expr))
    used["tfrecordd.json variables"] = variable_metrics(dashboard)
    for where, names in used.items():
        assert names, where
        missing = sorted(names - exported - set(EXEMPT))
        assert not missing, f"{where} uses metrics the daemon does not export: {missing}"
    assert "up" in used["alerts.yml"], "the down alert is on Prometheus's up series"


def test_metric_name_extraction() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (job, le) (rate(a_bucket{job=~"$job", x="y z"}[5m])))'
        ' > 1 and on (instance) (time() - b_seconds > 1800) or up{job="t"} == 0'
    )
    assert metric_names(expr) == {"a_bucket", "b_seconds", "up"}
    assert alert_expressions("  - alert: X\n    expr: |\n      a\n      > 1\n    for: 1m\n") == [
        "a > 1"
    ]
