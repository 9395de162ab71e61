"""One exception family for everything tfrecordd raises, and the exit codes the CLI maps them to."""

from __future__ import annotations

import errno

from tfrecordd.redact import redact_text
from tfrecordd.secretvalues import mask

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_DATA = 65
"""A file is not sound: truncated, corrupted or not TFRecord (sysexits' EX_DATAERR)."""
EXIT_UNAVAILABLE = 69
"""A source's server lost the state the daemon's positions rest on (a Redis consumer group was
deleted): reading on would write events twice or skip them. An operator must act (the message
says how), so systemd is told not to restart on it (sysexits' EX_UNAVAILABLE)."""
EXIT_NOINPUT = 66
"""An input (a config file, a file to read) does not exist or is not a file (sysexits'
EX_NOINPUT)."""
EXIT_IO = 74
"""An I/O error that is not about the data itself (sysexits' EX_IOERR)."""
EXIT_IN_USE = 75
"""Another tfrecordd holds the ``state_dir``, or another process a listen address (sysexits'
EX_TEMPFAIL: trying later may work)."""
EXIT_CONFIG = 78
"""The configuration is invalid (sysexits' EX_CONFIG); systemd is told not to restart on it."""


class TfrecorddError(Exception):
    """Base class of every error tfrecordd raises on purpose."""

    exit_code = EXIT_FAILURE


class ConfigError(TfrecorddError):
    """The configuration is invalid; ``errors`` lists every problem, each with its location."""

    exit_code = EXIT_CONFIG

    def __init__(self, errors: list[str]) -> None:
        # Messages may quote config values (a URL with a password, a secret read from a file):
        # redacted here, once for all.
        self.errors = [mask(redact_text(e)) for e in errors]
        super().__init__("invalid configuration:\n" + "\n".join(f"  {e}" for e in self.errors))


class ConfigFileError(ConfigError):
    """The config file cannot be read: missing, a directory, or unreadable. Not a config error
    (nothing of it was read): the status of a missing input."""

    exit_code = EXIT_NOINPUT

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        self.errors = [f"{path}: {detail}"]
        Exception.__init__(self, f"{path}: {detail}")


class RecordError(TfrecorddError):
    """A TFRecord stream is not sound at ``offset`` (a byte offset into the decompressed stream)."""

    exit_code = EXIT_DATA
    kind = "invalid"

    def __init__(self, path: str, offset: int, detail: str) -> None:
        self.path = path
        self.offset = offset
        self.detail = detail
        super().__init__(f"{path}: {self.kind} record at offset {offset}: {detail}")


class TruncatedRecordError(RecordError):
    """The stream ends inside a record: the file was cut short (or is still being written)."""

    kind = "truncated"


class CorruptRecordError(RecordError):
    """A record's length or data does not match its CRC: the bytes were changed."""

    kind = "corrupted"


class RecordLimitError(RecordError):
    """A record's length (its CRC matches) is above the reader's limit: the record may be sound,
    but it is not read. Raise the limit (``--max-record-bytes``, ``max_record_bytes=``)."""

    kind = "oversized"


class CompressionError(TfrecorddError):
    """A compressed stream is damaged, cut short, or decompresses past the configured cap."""

    exit_code = EXIT_DATA

    def __init__(self, path: str, offset: int, detail: str) -> None:
        self.path = path
        self.offset = offset
        self.detail = detail
        super().__init__(f"{path}: compressed stream damaged at byte {offset}: {detail}")


class EncodeError(TfrecorddError):
    """An event does not fit the schema; ``feature`` names the feature at fault, if one is."""

    def __init__(self, reason: str, feature: str | None = None) -> None:
        self.reason = reason
        self.feature = feature
        super().__init__(f"feature {feature!r}: {reason}" if feature else reason)


class DecodeError(TfrecorddError):
    """A record is not a parseable Example or SequenceExample."""

    exit_code = EXIT_DATA


class DurabilityError(TfrecorddError):
    """An fsync, write or close failed: the file is discarded and the daemon must stop."""

    exit_code = EXIT_IO


class StateInUseError(TfrecorddError):
    """Another process holds the lock on ``state_dir`` (one daemon per ``state_dir``), or on
    this ``node_id``'s staging folder in the output or claim folder in a spool."""

    exit_code = EXIT_IN_USE


class StateError(TfrecorddError):
    """A file of ``state_dir`` (the journal, the checkpoint) is damaged: not what a crash
    leaves. The daemon does not start on it (``tfrecordd state check`` / ``repair``)."""

    exit_code = EXIT_DATA

    def __init__(self, path: str, detail: str, todo: str = "") -> None:
        self.path = path
        self.detail = detail
        message = f"{path} {detail}"
        super().__init__(f"{message}; {todo}" if todo else message)


class StateFormatError(StateError):
    """A file of ``state_dir`` was written by a newer tfrecordd, in a format this version does
    not read: not damage, and never to be repaired or discarded by this version."""


class TokenVersionError(TfrecorddError):
    """A source's position token (in the journal, or handed back to ``recover`` / ``ack``) is
    of a version this tfrecordd does not read, written by a newer one: refused, never misread."""

    exit_code = EXIT_DATA

    def __init__(self, source: str, version: object, newest: int) -> None:
        self.source = source
        self.version = version
        if type(version) is int and version > newest:
            what = (
                f"a position token of version {version} was written by a newer tfrecordd (this "
                f"one reads token versions 1 to {newest}); run the tfrecordd version that wrote "
                "the state_dir, or a newer one"
            )
        else:
            what = (
                f"a position token has no valid version ({version!r}; this tfrecordd reads 1 to "
                f"{newest}): the state is damaged or was not written by tfrecordd; "
                "`tfrecordd state check` tells more"
            )
        # Recovery may have cut a torn journal tail before this; no commit was changed.
        super().__init__(f"{source}: {what}; no committed position was changed")


class ListenError(TfrecorddError):
    """A source cannot listen where it is configured to: the address is in use (75), or another
    file or process holds the Unix socket's path (75); or the address does not resolve or is
    not one of this machine's (``exit_code`` 78: the config's to fix)."""

    exit_code = EXIT_IN_USE

    def __init__(self, address: str, detail: str, *, exit_code: int | None = None) -> None:
        self.address = address
        self.detail = detail
        if exit_code is not None:  # else the class's (a subclass may have its own)
            self.exit_code = exit_code
        super().__init__(f"{address}: {detail}")


def listen_failure(e: OSError) -> tuple[str, int]:
    """Why a socket cannot bind or listen (``e``), in words, and the exit status for it: in use
    (75) while another process holds the address, which a later start may find free; the
    config's to fix (78) when the address is not one of this machine's, or a Unix socket's
    folder is not there; anything else, 75."""
    if e.errno == errno.EADDRINUSE:
        return "address already in use (by another process)", EXIT_IN_USE
    if e.errno == errno.EADDRNOTAVAIL:
        return "not an address of this machine", EXIT_CONFIG
    if e.errno in (errno.ENOENT, errno.ENOTDIR):
        return f"its folder is not there ({e.strerror})", EXIT_CONFIG
    return str(e.strerror or e), EXIT_IN_USE


class SourceLostError(TfrecorddError):
    """A source can no longer read on from its committed positions without writing events
    again or skipping some (a Redis consumer group deleted or reset under the daemon). The
    daemon stops; the message says how to resume from the journal's positions."""

    exit_code = EXIT_UNAVAILABLE


class WorkerError(TfrecorddError):
    """An encode worker process exited or broke its protocol: the daemon stops (its batches are
    in no published shard, so they replay after a restart)."""


class InputError(TfrecorddError):
    """An input cannot be read as a file: it is missing, a directory, or not a regular file."""

    exit_code = 66  # sysexits' EX_NOINPUT

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(f"{path}: {detail}")


class OutputError(TfrecorddError):
    """An output cannot be created: it exists already (tools never overwrite) or is unwritable."""

    exit_code = 73  # sysexits' EX_CANTCREAT

    def __init__(self, path: str, detail: str) -> None:
        self.path = path
        self.detail = detail
        super().__init__(f"{path}: {detail}")


class TruncatedStreamError(CompressionError):
    """A compressed stream ends inside a gzip member, the zlib stream or a zstd frame: cut short."""

    kind = "truncated"

    def __init__(self, path: str, offset: int, detail: str) -> None:
        super().__init__(path, offset, detail)
        self.args = (f"{path}: truncated compressed stream at byte {offset}: {detail}",)


class CorruptStreamError(CompressionError):
    """A compressed stream's bytes are not valid (bad header, data or checksum, trailing bytes)."""

    kind = "corrupted"

    def __init__(self, path: str, offset: int, detail: str) -> None:
        super().__init__(path, offset, detail)
        self.args = (f"{path}: corrupted compressed stream at byte {offset}: {detail}",)


class DecompressionLimitError(CompressionError):
    """A compressed stream decompresses to more than the configured cap (a decompression bomb?)."""

    kind = "too large"

    def __init__(self, path: str, offset: int, detail: str) -> None:
        super().__init__(path, offset, detail)
        self.args = (f"{path}: compressed stream too large at byte {offset}: {detail}",)


class UploadError(DurabilityError):
    """A shard could not be published to the object store: a permanent error, or transient ones
    for longer than the retry budget. Nothing is acked and the daemon stops; the staged copy and
    the journalled intent let the next start finish the upload."""

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind
        """``permanent``, ``exhausted`` (transient errors past the budget) or ``exists``."""


def find_error(e: BaseException) -> TfrecorddError | None:
    """The error tfrecordd raised on purpose, possibly inside a task group's exception group;
    ``None`` if ``e`` holds none (a bug: let it show as a traceback)."""
    if isinstance(e, TfrecorddError):
        return e
    if isinstance(e, BaseExceptionGroup):
        for sub in e.exceptions:
            if (found := find_error(sub)) is not None:
                return found
    return None
