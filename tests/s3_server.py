"""A real S3 API for tests: moto's server on its own loopback port, reached over HTTP by s3fs
exactly as AWS would be (endpoint URL, signed requests, dummy credentials)."""

from __future__ import annotations

import importlib
import logging
import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import free_port
from tfrecordd.format.reader import iter_examples

ACCESS_KEY = "AKIATESTTFRECORDD000"
SECRET_KEY = "tfrecordd-test-secret-do-not-log"


class S3Server:
    """moto's S3 server in a thread on 127.0.0.1. ``stop`` then ``start`` keeps the port and
    the stored objects (moto keeps them in this process), so tests can stage an outage."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._server: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> None:
        """Serve, and wait until the port accepts connections."""
        moto_server: Any = importlib.import_module("moto.server")
        # The server logs every request; tests read their own logs, not the server's.
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._server = moto_server.ThreadedMotoServer(
            ip_address="127.0.0.1", port=self.port, verbose=False
        )
        self._server.start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def stop(self) -> None:
        """Stop serving: connections to the port are refused until ``start``."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    def storage_options(self, **extra: Any) -> dict[str, Any]:
        """What ``[output] storage_options`` needs to reach this server (credentials in it)."""
        return {"endpoint_url": self.endpoint, "key": ACCESS_KEY, "secret": SECRET_KEY} | extra

    def client(self) -> Any:
        """A boto3 client on this server, for assertions below s3fs (multipart uploads...)."""
        boto3: Any = importlib.import_module("boto3")
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
        )

    def incomplete_uploads(self, bucket: str) -> list[str]:
        """Keys with a multipart upload begun and neither completed nor aborted."""
        listing = self.client().list_multipart_uploads(Bucket=bucket)
        return sorted(u["Key"] for u in listing.get("Uploads", []))

    def upload_ids(self, bucket: str) -> set[str]:
        """The ids of the multipart uploads begun in ``bucket`` and not yet completed."""
        listing = self.client().list_multipart_uploads(Bucket=bucket)
        return {u["UploadId"] for u in listing.get("Uploads", [])}

    def keys(self, bucket: str) -> list[str]:
        """Every visible object's key in ``bucket``."""
        listing = self.client().list_objects_v2(Bucket=bucket)
        return sorted(o["Key"] for o in listing.get("Contents", []))

    def shard_urls(self, bucket: str, prefix: str) -> list[str]:
        """The published shards under ``prefix``, as ``s3://`` URLs (manifests left out)."""
        return [
            f"s3://{bucket}/{key}"
            for key in self.keys(bucket)
            if key.startswith(f"{prefix}/")
            and ".tfrecord" in key
            and not key.endswith(".json")
            and not key.rpartition("/")[2].startswith(".")
        ]

    def read_ids(self, bucket: str, prefix: str) -> Counter[int]:
        """How many times each event id appears across the shards published under ``prefix``."""
        ids: Counter[int] = Counter()
        for url in self.shard_urls(bucket, prefix):
            for ex in iter_examples(url, storage_options=self.storage_options()):
                ids[int(ex["id"][0])] += 1
        return ids

    def create_bucket(self) -> str:
        """A new, empty bucket with a unique name."""
        name = f"shards-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name


def _skip_without_s3() -> None:
    pytest.importorskip("s3fs", reason="the s3 extra is not installed")
    pytest.importorskip("moto.server", reason="moto[server] is not installed")


def running_s3(port: int | None = None) -> Iterator[S3Server]:
    """Start a server, yield it, stop it."""
    _skip_without_s3()
    server = S3Server(port)
    server.start()
    try:
        yield server
    finally:
        server.stop()
