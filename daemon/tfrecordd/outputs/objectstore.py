"""Shards published to object storage (``s3://``, ``gs://``, any fsspec URL).

A shard is written and fsynced in a local staging directory exactly as for a local output,
and its intent journalled; :meth:`FsspecOutput.publish` then uploads the staged file to
``<dir>/<shard name>`` and returns only once the object is complete, visible and verified.
The runtime acks the sources after that, so ack-after-publish holds as it does on disk.

* **Atomic.** The object is written with ``open(key, "xb", autocommit=False)``: nothing is
  visible until ``commit()`` (on S3, ``CompleteMultipartUpload``); on any failure the upload is
  ``discard()``-ed. No step renames an object: on an object store that is a copy and a delete.
* **Never overwrites.** The key is checked before the upload, and where the store supports a
  create-only write (S3's ``If-None-Match: *``, which s3fs sends for mode ``"x"``) the commit
  itself refuses an existing object. An existing object that holds exactly the staged bytes is
  taken as this shard already published (a commit whose answer was lost on the way back).
* **Verified.** After the commit the object's size is compared with the shard's; with
  ``verify = "sha256"`` (the default) the object is also read back and its SHA-256 compared
  with the digest journalled in the intent. ETags are not used: a multipart or KMS-encrypted
  object's ETag is not the MD5 of its bytes.
* **Retried.** Transient errors (connection failures, timeouts, 5xx, throttling) are retried
  with capped exponential backoff for up to ``retry_for`` seconds; a permanent error (access
  denied, no such bucket, a foreign object under the shard's name) or a budget spent raises
  :class:`UploadError`. Nothing is acked, the daemon exits non-zero, and the journalled intent
  lets the next start finish the upload from the staged copy (:meth:`FsspecOutput.resume`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, BinaryIO, Literal, Protocol, TypeVar, cast

from prometheus_client import Counter

from tfrecordd import crashpoints
from tfrecordd.config import DaemonConfig
from tfrecordd.errors import ConfigError, UploadError
from tfrecordd.fsys import FileSystem
from tfrecordd.outputs.output import Output, is_shard_name, stage
from tfrecordd.outputs.shards import FinishedShard
from tfrecordd.redact import redact_options, redact_url
from tfrecordd.retry import Backoff
from tfrecordd.state.records import ShardRef

log = logging.getLogger(__name__)

T = TypeVar("T")
Verify = Literal["sha256", "size"]


class UploadCounters(Protocol):
    """The counters an object-store output keeps (:class:`tfrecordd.metrics.Metrics` has them)."""

    upload_errors: Counter
    """By ``kind`` of error."""
    upload_retries: Counter


DEFAULT_RETRY_FOR = 300.0
"""Seconds of transient failures one upload rides out before :class:`UploadError`."""
DEFAULT_VERIFY: Verify = "sha256"

_CHUNK = 8 << 20
_BACKOFF_FIRST = 0.5
_BACKOFF_MAX = 15.0
_PERMANENT_ERRNOS = frozenset(
    {
        errno.EINVAL,
        errno.EPERM,
        errno.EACCES,
        errno.EROFS,
        errno.ENOSYS,
        errno.ENAMETOOLONG,
        errno.EMSGSIZE,
        getattr(errno, "EREMCHG", errno.ENOENT),
    }
)
_CLIENT_LIBRARIES = frozenset(
    {"botocore", "aiobotocore", "aiohttp", "urllib3", "requests", "google", "gcsfs", "s3fs"}
)


class _StagedCopyDamaged(Exception):
    """The staged file's bytes do not match the digest in its intent."""


class _LeftBehind(Exception):
    """The drain's deadline passed while an attempt was still under way."""


def is_transient(error: BaseException) -> bool:
    """Whether retrying may help: connection failures, timeouts, 5xx, 408 and 429, and errors
    from the storage client libraries that do not say otherwise. Access denied, missing bucket,
    an existing object and invalid requests are permanent; so is any other exception (a bug
    does not go away by waiting)."""
    status = getattr(error, "status", None) or getattr(error, "code", None)
    if isinstance(status, int) and 400 <= status < 600:
        return status >= 500 or status in (408, 429)
    if isinstance(
        error,
        PermissionError
        | FileNotFoundError
        | FileExistsError
        | IsADirectoryError
        | NotADirectoryError,
    ):
        return False
    if isinstance(error, TimeoutError | ConnectionError):
        return True
    if isinstance(error, OSError):
        return error.errno not in _PERMANENT_ERRNOS
    name = type(error).__name__
    if "Credential" in name or "ParamValidation" in name:
        return False
    return type(error).__module__.split(".")[0] in _CLIENT_LIBRARIES


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class FsspecOutput(Output):
    """Shards staged locally, then uploaded to an fsspec URL. Blocking: call from a thread.

    ``verify`` and ``retry_for`` default to ``[output] verify`` and ``[output] retry_for``.
    ``metrics``, if given, counts retries and errors.
    """

    def __init__(
        self,
        config: DaemonConfig,
        fs: FileSystem,
        metrics: UploadCounters | None = None,
        *,
        verify: Verify | None = None,
        retry_for: float | None = None,
        dataset: str | None = None,
    ) -> None:
        dataset = next(iter(config.datasets)) if dataset is None else dataset
        out = config.datasets[dataset]
        key = config.dataset_key(dataset)
        self.location = redact_url(str(out.dir).rstrip("/"))
        self.storage_options: dict[str, Any] = dict(out.storage_options)
        self.legacy_dir = os.path.abspath(config.staging_root(dataset))
        if out.staging_dir is None:
            # The older form (one [output]) staged in staging/<node>, datasets stage in
            # staging/<dataset>/<node>: a journalled upload is found after either change.
            self.staging_roots = (
                os.path.abspath(os.path.join(config.daemon.state_dir, "staging")),
            )
        self.staging_dir = os.path.join(self.legacy_dir, config.daemon.node_id)
        self.fs = fs
        self.metrics = metrics
        self.verify: Verify = verify or out.verify
        self.retry_for = float(retry_for if retry_for is not None else out.retry_for)
        self._stop_at: float | None = None
        self._wake = threading.Event()
        """Set when :meth:`stop_retrying_at` moves the deadline or an attempt ends."""
        # fsspec ships no type information; imported by name so its lack of stubs is no error.
        fsspec: Any = importlib.import_module("fsspec")
        scheme = str(out.dir).partition("://")[0]
        try:
            self.store, root = fsspec.core.url_to_fs(str(out.dir), **self.storage_options)
        except ImportError as e:
            extra = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}.get(scheme)
            hint = f": pip install 'tfrecordd[{extra}]'" if extra else ""
            raise ConfigError(
                [f"{key}.dir: {scheme}:// needs a package that is not installed{hint} ({e})"]
            ) from e
        except (ValueError, TypeError) as e:
            # The message names option keys at most, never their values.
            raise ConfigError([f"{key}.dir / {key}.storage_options: {e}"]) from e
        self.root: str = str(root).rstrip("/")

    # -- Output ----------------------------------------------------------------------------

    def final_path(self, name: str) -> str:
        return str(self.store.unstrip_protocol(self._key(name)))

    def publish(self, shard: FinishedShard) -> None:
        """Upload the staged shard, verify the object, then remove the staged copy.

        Backpressure: shards are published one after another, commits one at a time; while an
        upload (or its retries) runs, the write stage fills its open shards until the next cut,
        which waits for this commit: then the streams fill and the sources pause."""
        try:
            self._publish_file(shard.tmp_path, shard.name, shard.size, shard.sha256)
        except _StagedCopyDamaged as e:
            self._count_error("staged")
            raise UploadError(f"publishing {shard.name}: {e}", kind="permanent") from e

    def is_published(self, shard: ShardRef) -> bool:
        """Whether an object with the shard's name and size exists."""
        key = self._key(shard.name)
        info = self._retrying(f"checking {shard.name}", lambda: self._stat(key))
        return info is not None and info[0] == shard.size

    def list_shards(self, folder: str) -> list[str]:
        top = self._key(folder) if folder else self.root

        def attempt() -> list[str]:
            try:
                keys = self.store.find(top)
            except FileNotFoundError:
                return []
            return [str(k) for k in keys]

        names = []
        for key in self._retrying(f"listing {folder or self.location}", attempt):
            rel = key[len(self.root) :].lstrip("/")
            parts = rel.split("/")
            if any(p.startswith((".", "_")) for p in parts[:-1]) or not is_shard_name(parts[-1]):
                continue
            names.append(rel)
        return sorted(names)

    def resume(self, shard: FinishedShard) -> None:
        """Upload a staged shard left by an earlier run (an upload it left unfinished is
        aborted first)."""
        self._abort_stale_uploads(self._key(shard.name))
        self.publish(shard)
        log.info("resumed upload of %s", shard.name)

    def publish_sidecar(self, name: str, parts: Iterable[bytes]) -> None:
        """Stage the file locally, then upload it (an object appears whole or not at all),
        replacing an earlier copy; retried like an upload, then its size checked."""
        key = self._key(name)
        os.makedirs(self.staging_dir, exist_ok=True)
        staged = stage(self.fs, self.staging_dir, name, parts, fsync=False)
        size = os.path.getsize(staged)

        def attempt() -> None:
            self.store.put_file(staged, key)
            info = self._stat(key)
            if info is None or info[0] != size:
                raise OSError(errno.EIO, f"{self.store.unstrip_protocol(key)} did not read back")

        try:
            self._retrying(f"publishing {name}", attempt)
        finally:
            self.fs.remove(staged)

    def read_published(self, name: str, read: Callable[[BinaryIO], T]) -> T:
        """``read`` over the object, streamed in blocks (never whole in memory); a transient
        error restarts it from the object's first byte, within the retry budget."""
        key = self._key(name)

        def attempt() -> T:
            f: BinaryIO
            with self.store.open(key, "rb", block_size=_CHUNK, cache_type="none") as f:
                return read(f)

        return self._retrying(f"reading {name} back", attempt)

    def sidecar_exists(self, name: str) -> bool:
        key = self._key(name)
        return self._retrying(f"checking {name}", lambda: self._stat(key)) is not None

    def redact(self) -> dict[str, Any]:
        """Location, staging directory, verification, retry budget and the storage options
        with every secret-looking value replaced by ``"***"``."""
        return {
            "location": self.location,
            "staging_dir": self.staging_dir,
            "verify": self.verify,
            "retry_for": self.retry_for,
            "storage_options": redact_options(self.storage_options),
        }

    # -- upload ----------------------------------------------------------------------------

    def _key(self, name: str) -> str:
        return f"{self.root}/{name}"

    def _publish_file(self, path: str, name: str, size: int, sha256: str) -> None:
        key = self._key(name)
        self._retrying(f"publishing {name}", lambda: self._upload_once(path, key, size, sha256))
        try:
            self.fs.remove(path)
        except OSError as e:
            # Recovery discards leftover in-progress files; the shard itself is safe remotely.
            log.warning("%s published but its staged copy stays: %s", name, e.strerror or e)

    def _upload_once(self, path: str, key: str, size: int, sha256: str) -> None:
        """One attempt: refuse a foreign object, upload, commit, verify."""
        if self._existing_is_ours(key, size, sha256):
            return
        f = self._open_for_create(key)
        try:
            digest = hashlib.sha256()
            sent = 0
            with open(path, "rb") as src:
                # One block per write: S3 then uploads one part per write.
                chunk = int(getattr(f, "blocksize", 0) or _CHUNK)
                while data := src.read(chunk):
                    digest.update(data)
                    f.write(data)
                    sent += len(data)
                    crashpoints.reached("mid-upload")
            if sent != size or digest.hexdigest() != sha256:
                raise _StagedCopyDamaged(f"{sent} bytes with SHA-256 {digest.hexdigest()[:16]}…")
            f.close()
            f.commit()
        except FileExistsError:
            self._discard(f)
            if self._existing_is_ours(key, size, sha256):
                return
            raise
        except BaseException:
            self._discard(f)
            raise
        crashpoints.reached("after-publish")
        self._verify(key, size, sha256)

    def _open_for_create(self, key: str) -> Any:
        try:
            return self.store.open(key, "xb", autocommit=False)
        except ValueError:
            # A file system without create-only writes: the existence check above must do.
            return self.store.open(key, "wb", autocommit=False)

    @staticmethod
    def _discard(f: Any) -> None:
        with contextlib.suppress(Exception):
            f.discard()

    def _existing_is_ours(self, key: str, size: int, sha256: str) -> bool:
        """Whether ``key`` already holds exactly these bytes; raise if it holds others."""
        info = self._stat(key)
        if info is None:
            return False
        if info[0] == size and self._read_digest(key) == sha256:
            log.info("%s already holds this shard: taken as published", key)
            return True
        raise UploadError(
            f"{self.store.unstrip_protocol(key)} exists and is another object: "
            "refusing to overwrite it",
            kind="exists",
        )

    def _verify(self, key: str, size: int, sha256: str) -> None:
        info = self._stat(key)
        problem = None
        if info is None:
            problem = "is missing after its upload was committed"
        elif info[0] != size:
            problem = f"holds {info[0]} bytes after upload, not {size}"
        elif self.verify == "sha256" and self._read_digest(key) != sha256:
            problem = "does not read back with the staged copy's SHA-256"
        if problem is None:
            return
        self._count_error("verify")
        # The object is ours (a unique name, just created): remove it so the retry can upload.
        with contextlib.suppress(FileNotFoundError):
            self.store.rm_file(key)
        raise OSError(errno.EIO, f"{self.store.unstrip_protocol(key)} {problem}")

    def _stat(self, key: str) -> tuple[int, str | None] | None:
        """``(size, etag)`` of ``key`` straight from the store (no listing cache), or None."""
        self.store.invalidate_cache(key)
        try:
            info = self.store.info(key)
        except FileNotFoundError:
            return None
        if info.get("type") == "directory":
            return None
        return int(info["size"]), info.get("ETag")

    def _read_digest(self, key: str) -> str:
        digest = hashlib.sha256()
        f: BinaryIO
        with self.store.open(key, "rb", block_size=_CHUNK, cache_type="none") as f:
            while data := f.read(_CHUNK):
                digest.update(data)
        return digest.hexdigest()

    def _abort_stale_uploads(self, key: str) -> None:
        """Abort incomplete S3 multipart uploads of ``key`` left by a crashed run (they are
        invisible but billed). Best effort: the bucket lifecycle rule is the safety net."""
        call = getattr(self.store, "call_s3", None)
        if call is None:
            return
        try:
            bucket, obj, _ = self.store.split_path(key)
            listing = call("list_multipart_uploads", Bucket=bucket, Prefix=obj)
            for upload in listing.get("Uploads", []):
                if upload.get("Key") == obj:
                    self.store.abort_mpu(bucket, obj, upload["UploadId"])
                    log.info("aborted an incomplete upload of %s", key)
        except Exception as e:
            log.warning("could not list incomplete uploads of %s: %s", key, _describe(e))

    # -- retries ---------------------------------------------------------------------------

    def stop_retrying_at(self, deadline: float) -> None:
        """End retries at ``deadline`` (a drain's) if that comes before :attr:`retry_for` is
        spent. A backoff sleeping then wakes to see it, and an attempt still under way at the
        deadline (the client's own retries and timeouts can make one last a minute) is left
        behind in its thread, as a kill would leave it: nothing is acked, and the next start
        finishes the upload from the staged copy."""
        self._stop_at = deadline if self._stop_at is None else min(self._stop_at, deadline)
        self._wake.set()

    def _retrying(self, what: str, attempt: Callable[[], T]) -> T:
        """Run ``attempt`` until it succeeds, retrying transient errors with capped exponential
        backoff (each delay 50-100% of its step) for up to :attr:`retry_for` seconds, or until
        the deadline of :meth:`stop_retrying_at`, whichever comes first."""
        budget_end = time.monotonic() + self.retry_for
        backoff = Backoff(_BACKOFF_FIRST, _BACKOFF_MAX, jitter=0.5)
        failures = 0
        while True:
            try:
                return self._attempt(attempt)
            except UploadError as e:
                self._count_error(e.kind)
                raise
            except _StagedCopyDamaged:
                raise
            except _LeftBehind as e:
                raise self._exhausted(what, failures + 1, e, budget_end) from e
            except Exception as e:
                if not is_transient(e):
                    self._count_error("permanent")
                    raise UploadError(f"{what}: {_describe(e)}", kind="permanent") from e
                self._count_error("transient")
                delay = backoff.next()
                failures = backoff.failures
                left = self._deadline(budget_end) - time.monotonic()
                if left <= 0:
                    raise self._exhausted(what, failures, e, budget_end) from e
                log.warning(
                    "%s: %s; retry %d in %.1fs", what, _describe(e), failures, min(delay, left)
                )
                self._count_retry()
                retry_at = time.monotonic() + delay
                while True:
                    # Cleared before the deadline is read: a cut made meanwhile still wakes us.
                    self._wake.clear()
                    wait = min(retry_at, self._deadline(budget_end)) - time.monotonic()
                    if wait <= 0:
                        break
                    self._wake.wait(wait)
                if time.monotonic() >= self._deadline(budget_end):
                    raise self._exhausted(what, failures, e, budget_end) from e

    def _attempt(self, attempt: Callable[[], T]) -> T:
        """Run one attempt in a thread of its own, waiting for it until it ends or a drain's
        deadline passes (then :class:`_LeftBehind`)."""
        outcome: list[tuple[bool, Any]] = []

        def run() -> None:
            try:
                outcome.append((True, attempt()))
            except BaseException as e:
                outcome.append((False, e))
            finally:
                self._wake.set()

        threading.Thread(target=run, name="tfrecordd-upload", daemon=True).start()
        while True:
            self._wake.clear()
            if outcome:
                ok, value = outcome[0]
                if ok:
                    return cast(T, value)
                raise value
            stop_at = self._stop_at
            if stop_at is not None and time.monotonic() >= stop_at:
                raise _LeftBehind("an attempt was still under way at the drain's deadline")
            self._wake.wait(None if stop_at is None else stop_at - time.monotonic())

    def _deadline(self, budget_end: float) -> float:
        stop_at = self._stop_at
        return budget_end if stop_at is None else min(budget_end, stop_at)

    def _exhausted(
        self, what: str, failures: int, error: Exception, budget_end: float
    ) -> UploadError:
        self._count_error("exhausted")
        if self._stop_at is not None and self._stop_at < budget_end:
            why = "retries cut short by the drain (drain_timeout)"
        else:
            why = f"still failing after {self.retry_for:.0f}s"
        return UploadError(
            f"{what}: {why}, {failures} attempt(s): {_describe(error)}", kind="exhausted"
        )

    def _count_error(self, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.upload_errors.labels(kind).inc()

    def _count_retry(self) -> None:
        if self.metrics is not None:
            self.metrics.upload_retries.inc()
