"""The allocator's thresholds: a batch-sized buffer freed and allocated again reuses memory
instead of faulting in fresh pages; an operator's own settings are left alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tfrecordd import heap

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the thresholds are glibc's"
)

_FAULTS = """
import resource, sys
from tfrecordd import heap
tuned = heap.tune() if sys.argv[1] == "tune" else None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def request(i):
    # An encode worker's request: 4 batches of lines (about 190 KiB each, each a little
    # different), written through, then all freed together once answered.
    batches = [bytearray(190_000 + 100 * ((i + k) % 7)) for k in range(4)]
    del batches
for i in range(20):
    request(i)
before = faults()
for i in range(200):
    request(i)
print(tuned, (faults() - before) / 200)
"""


def _faults_per_buffer(mode: str, env: dict[str, str] | None = None) -> tuple[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS, mode],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.split()
    return out[0], float(out[1])


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("GLIBC_TUNABLES", *heap.ENVIRONMENT):
        env.pop(name, None)
    return env


def test_a_requests_freed_buffers_are_reused_without_page_faults() -> None:
    env = _clean_env()
    tuned, with_tuning = _faults_per_buffer("tune", env)
    _, without = _faults_per_buffer("plain", env)
    assert tuned == "True"
    # Without the thresholds, the heap's top (4 buffers, over twice the largest one glibc saw
    # mapped) is trimmed after every request and faulted in again: about 186 pages.
    assert without > 100
    assert with_tuning < 5


def test_an_operators_own_settings_stand() -> None:
    env = _clean_env() | {"MALLOC_TRIM_THRESHOLD_": "0"}
    tuned, _ = _faults_per_buffer("tune", env)
    assert tuned == "False"
    env = _clean_env() | {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}
    tuned, _ = _faults_per_buffer("tune", env)
    assert tuned == "False"
