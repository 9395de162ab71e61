"""Naming in a spool: the daemon's folder names and the claim names that encode a file's path.

A claimed file is renamed into its node's claim folder under a claim name: the claim's time
(and, for a file that grew after its end was read, ``@`` and the offset its reading resumes
from, with ``!`` once a last line without a line end is to be read, and ``~`` the size and
CRC-32C of what was read then), then the file's path
relative to the spool, percent-encoded where it would not be one valid UTF-8 path component.
Decoding a claim name gives the path back (for logs, dead letters, events and ``done_dir``),
except that a name planted by someone else that would not decode to a plain relative path is
kept as one component. Names shown to people keep bytes that are not UTF-8 visible as ``\\xNN``.
"""

from __future__ import annotations

import os
from urllib.parse import quote, unquote_to_bytes

CLAIM_DIR = ".tfrecordd-claimed"
"""In the spool: the claim folders' parent, holding one folder per node (``<node_id>/``)."""
REJECT_DIR = ".tfrecordd-rejected"
"""In the spool: where files that cannot be read are moved."""
REASONS = ".reasons.jsonl"
"""In the rejected folder: one JSON object per file moved there (its name, path and reason)."""
NAME_MAX = 255
"""The longest file name Linux file systems take, in bytes: a longer claim name is refused."""
TEMP_SUFFIXES = (".tmp", ".temp", ".part", ".partial", ".swp", "~")
"""Names a producer still writes under: never claimed, whatever the pattern."""


def claim_name(ns: int, rel: str) -> str:
    """A claim name: the claim's time, then the spool-relative path with ``%``, ``/``, control
    characters and bytes that are not UTF-8 percent-encoded (so it is valid UTF-8 whatever the
    name was, and a UTF-8 name is not lengthened)."""
    out = [f"{ns:020d}-"]
    for ch in rel:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
            out.append(f"%{code - 0xDC00:02X}")
        elif ch in "%/" or code < 0x20 or code == 0x7F:
            out.append(f"%{code:02X}")
        else:
            out.append(ch)
    return "".join(out)


def resumed_name(
    claim: str, offset: int, *, final: bool = False, check: tuple[int, int] | None = None
) -> str:
    """The name ``claim`` takes when it is to be read on from ``offset`` (in its decompressed
    stream): the offset travels with the file, so it holds whatever the journal has folded.
    ``final`` (a ``!`` after the offset): the file was found still and closed, so a last line
    without a line end is read as a line. ``check`` (``~<size>.<crc>``, hexadecimal): the
    file's size and :func:`.spool_reading.tail_digest` when it was renamed, checked again when
    reading resumes (a file rewritten meanwhile is kept, not read from the offset on)."""
    stamp, _, rest = claim.partition("-")
    mark = "!" if final else ""
    tail = f"~{check[0]:x}.{check[1]:x}" if check is not None else ""
    return f"{stamp.partition('@')[0]}@{offset}{mark}{tail}-{rest}"


def _resumed(claim: str) -> tuple[str, bool, tuple[int, int] | None] | None:
    """The parts of a name :func:`resumed_name` made (offset, final, check), or ``None``."""
    stamp = claim.partition("-")[0]
    _, at, after = stamp.partition("@")
    if not at:
        return None
    offset, _, tail = after.partition("~")
    final = offset.endswith("!")
    offset = offset.removesuffix("!")
    check = None
    if tail:
        size, _, crc = tail.partition(".")
        try:
            check = (int(size, 16), int(crc, 16))
        except ValueError:
            check = None
    return (offset, final, check) if offset.isdigit() else None


def resume_offset(claim: str) -> int:
    """The offset a claim renamed by :func:`resumed_name` is read on from; 0 for any other."""
    parts = _resumed(claim)
    return int(parts[0]) if parts else 0


def is_final(claim: str) -> bool:
    """Whether a claim was renamed by :func:`resumed_name` with ``final``."""
    parts = _resumed(claim)
    return bool(parts and parts[1])


def resume_check(claim: str) -> tuple[int, int] | None:
    """The ``check`` a claim was renamed with by :func:`resumed_name`, if any."""
    parts = _resumed(claim)
    return parts[2] if parts else None


def original(claim: str) -> str:
    """The spool-relative path a claim name encodes (the name's bytes, as ``os`` functions take
    them).

    Anyone who can write into the spool can put a file into its claim folder, so a name that
    would not decode to a plain relative path (``..``, an absolute path, empty parts) is kept
    as one path component (quoted again, so not even a name the caller was handed with a ``/``
    in it can leave the folder it is moved into)."""
    encoded = claim.split("-", 1)[-1]
    rel = os.fsdecode(unquote_to_bytes(os.fsencode(encoded)))
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        component = quote(os.fsencode(encoded), safe="")
        return component if component not in ("", ".", "..") else f"_{component}"
    return rel


def printable(name: str) -> str:
    """``name`` as text for logs, dead letters and events: bytes that are not UTF-8 as ``\\xNN``."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def valid_key(key: str) -> bool:
    """A token's file: ``node/claim`` (or a bare claim of the layout before node folders)."""
    parts = key.split("/")
    return len(parts) <= 2 and all(p not in ("", ".", "..") for p in parts)
