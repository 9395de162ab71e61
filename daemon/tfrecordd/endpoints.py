"""The metrics endpoint's default address, written once for the daemon, ``init``, ``status`` and
``healthcheck`` (which import nothing heavier than this)."""

from __future__ import annotations

METRICS_LISTEN = "127.0.0.1:9464"
"""``[metrics] listen`` by default: loopback only."""

METRICS_URL = f"http://{METRICS_LISTEN}/metrics"
"""Where ``tfrecordd status`` scrapes by default."""

HEALTH_URL = f"http://{METRICS_LISTEN}/healthz"
"""Where ``tfrecordd healthcheck`` asks by default."""
