"""Positions in a spool: the batch tokens, how they fold, and what of each claim is committed.

A token names one claimed file, ``<node_id>/<claim name>`` (a bare claim name in the layout
before node folders), and the offset in its decompressed stream after the batch's last record;
``eof`` marks the batch that carries the file's end, and ``bad`` (with ``why``) a file whose
rest was refused. Folded, the committed tokens give each file's committed offset, and a file
whose end is committed leaves the state: :class:`Positions` keeps that state while the source
runs, so a file half-written into shards resumes exactly where the last published shard stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tfrecordd.plugin import Token


def token(claim: str, offset: int, eof: bool, *, bad: str = "") -> Token:
    """The token of a batch of ``claim`` (``node/claim``) that ends at ``offset``; ``bad``: why
    the rest of the file was refused."""
    out: dict[str, Any] = {"f": claim, "o": offset, "eof": eof}
    if bad:
        out["bad"] = True
        out["why"] = bad
    return out


def fold(state: Any, tokens: Sequence[Token]) -> Any:
    """Committed offset per claimed file (``node/claim``); a file whose end is committed is
    gone (with the bare claim name it had before node folders, if it was migrated)."""
    out: dict[str, int] = dict(state or {})
    for t in tokens:
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

    def recovered(self, state: Any, pending: Sequence[Token]) -> None:
        """Start from the folded ``state`` and the ``pending`` tokens recovery redid."""
        self.committed = fold(state, pending)

    def start(self, key: str) -> int:
        """Where reading ``key`` (``node/claim``) starts: its committed offset (a claim adopted
        from the layout before node folders has its offsets under its bare name)."""
        claim = key.rpartition("/")[2]
        return max(self.committed.get(key, 0), self.committed.get(claim, 0))

    def acked(self, t: Token) -> None:
        """Take in an acknowledged token (after the file of an ``eof`` one was finished)."""
        if t["eof"]:
            self.sent_eof.discard(t["f"])
            self.committed.pop(t["f"], None)
        else:
            self.committed[t["f"]] = max(self.committed.get(t["f"], 0), int(t["o"]))
