"""Every registered source plugin against the shared contract (tfrecordd.testing)."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from tfrecordd.plugin import Registry
from tfrecordd.testing import check_source

REGISTRY = Registry.from_entry_points()
TYPES = sorted(REGISTRY.sources)
SERVERS = {"redis-stream": pytest.mark.redis}
"""The sources whose contract producer starts a server (tests/tiers.py: the markers)."""


def test_every_registered_plugin_loads() -> None:
    registry = Registry.from_entry_points()
    assert len(registry.sources) == len(list(entry_points(group="tfrecordd.sources")))
    assert len(registry.encoders) == len(list(entry_points(group="tfrecordd.encoders")))
    assert registry.broken == {}


def test_the_builtin_sources_are_registered() -> None:
    assert "directory" in TYPES


@pytest.mark.parametrize("source_type", TYPES)
def test_source_has_a_contract_producer(source_type: str) -> None:
    module = importlib.import_module(f"tests.contract.producers.{source_type.replace('-', '_')}")
    assert callable(module.producer)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "source_type", [pytest.param(t, marks=SERVERS.get(t, ()), id=t) for t in TYPES]
)
async def test_source_contract(source_type: str, tmp_path: Path) -> None:
    module = importlib.import_module(f"tests.contract.producers.{source_type.replace('-', '_')}")
    async with module.producer(tmp_path) as (config, produce):
        assert type(config) is REGISTRY.sources[source_type]
        ctx = await check_source(config, produce, state_dir=str(tmp_path / "state"))
    assert ctx.batches, "the source sent batches"
