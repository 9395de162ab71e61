"""Positions in a spool: the batch tokens, how they fold, and what of each claim is committed.

A token names one claimed file, ``<node_id>/<claim name>`` (a bare claim name in the layout
before node folders), and the offset in its decompressed stream after the batch's last record;
``eof`` marks the batch that carries the file's end, and ``bad`` (with ``why``) a file whose
rest was refused; ``v`` is the token's version (:data:`TOKEN_VERSION`; tokens journalled
before versions have none and read as version 1). Folded, the committed tokens give each
file's committed offset, and a file whose end is committed leaves the state:
:class:`Positions` keeps that state while the source runs, so a file half-written into shards
resumes exactly where the last published shard stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NotRequired, TypedDict, cast

from tfrecordd.plugin import Token, token_version
from tfrecordd_plugins.sources.spool_names import resume_offset

TOKEN_VERSION = 2
"""The newest version of the tokens this release reads. It writes version 1, except for what a
release before version 2 would misread (and lose or repeat lines by): a token that stops before
a last line without its line end (``part``), or names a claim renamed to be read on from an
offset (``…@<offset>…``). Those are version 2, which an earlier release refuses."""


class SpoolToken(TypedDict):
    """A batch's position in one claimed file."""

    v: NotRequired[int]
    """The token's version; absent in tokens journalled before tokens had versions (1)."""
    f: str
    """The claimed file: ``node/claim`` (a bare claim before node folders)."""
    o: int
    """The offset in the file's decompressed stream after the batch's last record."""
    eof: bool
    """The batch carries the file's end."""
    bad: NotRequired[bool]
    """The rest of the file was refused: it is moved aside when finished."""
    why: NotRequired[str]
    """With ``bad``: why."""
    part: NotRequired[bool]
    """With ``eof``: the file ended in a line without a line end, not read: the producer may
    still be writing it. Finishing reads it once the file is found still and closed."""
    st: NotRequired[list[int]]
    """With ``eof``: the file's size, modification time (ns) and tail digest
    (:func:`.spool_reading.tail_digest`) when its end was read. The file is finished (deleted
    or moved) only if it is still so; one appended to since is read on from ``o``, one rewritten
    is set aside (tokens written before this field are finished as they are)."""


def token(
    claim: str,
    offset: int,
    eof: bool,
    *,
    bad: str = "",
    seen: tuple[int, ...] | None = None,
    part: bool = False,
) -> SpoolToken:
    """The token of a batch of ``claim`` (``node/claim``) that ends at ``offset``; ``bad``: why
    the rest of the file was refused; ``seen``: with ``eof``, the file's size, modification time
    and tail digest when its end was read; ``part``: with ``eof``, bytes after ``offset`` (a
    last line without a line end) were not read yet."""
    resumed = "@" in claim.rpartition("/")[2].partition("-")[0]
    out: SpoolToken = {"v": 2 if part or resumed else 1, "f": claim, "o": offset, "eof": eof}
    if bad:
        out["bad"] = True
        out["why"] = bad
    elif eof and seen is not None:
        out["st"] = list(seen)
        if part:
            out["part"] = True
    return out


def read_token(t: Token, source: str = "directory source") -> SpoolToken:
    """A token given back by the daemon, its version checked (:class:`TokenVersionError`,
    naming ``source``, for one of a newer tfrecordd)."""
    token_version(t, source, TOKEN_VERSION)
    return cast(SpoolToken, t)


def fold(state: Any, tokens: Sequence[Token]) -> Any:
    """Committed offset per claimed file (``node/claim``); a file whose end is committed is
    gone (with the bare claim name it had before node folders, if it was migrated)."""
    out: dict[str, int] = dict(state or {})
    for t in map(read_token, tokens):
        if t["eof"]:
            out.pop(t["f"], None)
            out.pop(t["f"].rpartition("/")[2], None)
        else:
            out[t["f"]] = max(out.get(t["f"], 0), int(t["o"]))
    return out


class Positions:
    """What of each claim is committed, and which claims were sent to their end."""

    def __init__(self) -> None:
        self.committed: dict[str, int] = {}
        """Committed offset per claimed file (``node/claim``), as :func:`fold` gives it."""
        self.sent_eof: set[str] = set()
        """Files (``node/claim``) whose end this process has sent: not read again."""

    def recovered(self, state: Any, pending: Sequence[SpoolToken]) -> None:
        """Start from the folded ``state`` and the ``pending`` tokens recovery redid."""
        self.committed = fold(state, pending)

    def start(self, key: str) -> int:
        """Where reading ``key`` (``node/claim``) starts: its committed offset (a claim adopted
        from the layout before node folders has its offsets under its bare name), or the
        offset in its name (:func:`.spool_names.resumed_name`) if that is further."""
        claim = key.rpartition("/")[2]
        resumed = resume_offset(claim)
        return max(self.committed.get(key, 0), self.committed.get(claim, 0), resumed)

    def acked(self, t: SpoolToken) -> None:
        """Take in an acknowledged token (after the file of an ``eof`` one was finished)."""
        if t["eof"]:
            self.sent_eof.discard(t["f"])
            self.committed.pop(t["f"], None)
        else:
            self.committed[t["f"]] = max(self.committed.get(t["f"], 0), int(t["o"]))
