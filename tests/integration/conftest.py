"""Fixtures for the integration tests that need a real redis-server."""

from __future__ import annotations

from tests.redis_server import redis_server

__all__ = ["redis_server"]
