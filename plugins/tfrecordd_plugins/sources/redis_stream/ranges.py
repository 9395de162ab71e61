"""Entry IDs, the ID ranges of a token, and how ranges merge (see the package docs for why a
merged range acks exactly what its parts would)."""

from __future__ import annotations

import bisect
from typing import TypedDict

from tfrecordd.plugin import Token, TokenVersionError, token_version

Key = tuple[int, int]
"""An entry ID as numbers (``"1700000000000-3"`` is ``(1700000000000, 3)``), to compare."""


def key_of(entry_id: str) -> Key:
    """An entry ID (``"1700000000000-3"``, or ``"1700000000000"`` for its first sequence) as
    numbers."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def id_of(key: Key) -> str:
    """The entry ID of ``key``, as Redis writes it."""
    return f"{key[0]}-{key[1]}"


def before(key: Key) -> Key:
    """The greatest possible entry ID below ``key``."""
    return (key[0], key[1] - 1) if key[1] else (key[0] - 1, 2**64 - 1)


def after(key: Key) -> Key:
    """The least possible entry ID above ``key``."""
    return (key[0], key[1] + 1) if key[1] < 2**64 - 1 else (key[0] + 1, 0)


Span = tuple[Key, Key, Key | None]
"""A range of a token as numbers: first, last, and the ID it continues (see :func:`item_of`)."""


Item = str | list[str]
"""An item of a token: an entry ID, ``[first, last]``, or ``[first, last, joined]``."""

TOKEN_VERSION = 1
"""The version of the tokens this release writes, and the newest it reads."""


class RedisToken(TypedDict):
    """A batch's (or, compacted, a commit's) positions: the ID ranges it covers."""

    v: int
    """The token's version (:data:`TOKEN_VERSION`)."""
    r: list[Item]
    """The ranges."""


def token(items: list[Item]) -> RedisToken:
    """The token of these ranges, in this release's version."""
    return {"v": TOKEN_VERSION, "r": items}


def read_token(token: Token, source: str = "redis-stream source") -> list[Item]:
    """The ranges of a token given back by the daemon: a :class:`RedisToken`, or the list of
    items alone that releases before tokens had versions journalled. One of a newer tfrecordd
    raises :class:`~tfrecordd.errors.TokenVersionError` naming ``source``."""
    if isinstance(token, list):
        return token
    if not isinstance(token, dict):
        raise TokenVersionError(source, f"unknown ({type(token).__name__})", TOKEN_VERSION)
    token_version(token, source, TOKEN_VERSION)
    items: list[Item] = token["r"]
    return items


def span_of(item: Item) -> Span:
    """An item of a token: an entry ID, ``[first, last]``, or ``[first, last, joined]``."""
    if isinstance(item, str):
        return key_of(item), key_of(item), None
    return key_of(item[0]), key_of(item[1]), key_of(item[2]) if len(item) > 2 else None


def item_of(span: Span) -> Item:
    """A token's item for a range: ``joined``, when set, is an entry ID before ``first`` with
    nothing pending in the group between the two when ``first`` was read (see the package
    docs): a range ending there may be merged with this one."""
    first, last, joined = span
    if joined is not None:
        return [id_of(first), id_of(last), id_of(joined)]
    return id_of(first) if first == last else [id_of(first), id_of(last)]


def id_ranges(items: list[Item]) -> list[tuple[str, str]]:
    """The ``(first, last)`` ID ranges of a token's items (:func:`read_token`): entry IDs or
    ``[first, last]`` ranges, perhaps with a third ID."""
    return [(t, t) if isinstance(t, str) else (str(t[0]), str(t[1])) for t in items]


def merge(spans: list[Span]) -> list[Span]:
    """Ranges in order, merged where that acks nothing more: where they overlap or touch, and
    where one continues the one before (its ``joined`` is that one's last)."""
    out: list[Span] = []
    for span in sorted(spans, key=lambda s: (s[0], s[1])):
        out.append(span)
        # A range that took over a ``joined`` may now continue the one before it too.
        while len(out) > 1 and _continues(out[-2], out[-1]):
            (low, high, prior), (first, last, joined) = out[-2], out.pop()
            if first == low and joined is not None and (prior is None or joined < prior):
                prior = joined
            out[-1] = (low, max(high, last), prior)
    return out


def _continues(prev: Span, span: Span) -> bool:
    """Whether ``span`` (starting at or after ``prev``) overlaps, touches or continues ``prev``."""
    first, _, joined = span
    high = prev[1]
    return first <= high or first == after(high) or joined == high


class InFlight:
    """The ID ranges of the batches sent and not yet acked, disjoint, in order; a range that
    continues the one before it is merged into it, so that they stay few."""

    def __init__(self) -> None:
        self._firsts: list[Key] = []
        self._lasts: list[Key] = []

    def __len__(self) -> int:
        return len(self._firsts)

    def __contains__(self, key: Key) -> bool:
        i = bisect.bisect_right(self._firsts, key) - 1
        return i >= 0 and key <= self._lasts[i]

    def add(self, first: Key, last: Key, joined: Key | None = None) -> None:
        """Take in a range sent, merged into the one before when it continues it."""
        i = bisect.bisect_left(self._firsts, first)
        if i and (joined == self._lasts[i - 1] or first == after(self._lasts[i - 1])):
            self._lasts[i - 1] = max(self._lasts[i - 1], last)
            return
        self._firsts.insert(i, first)
        self._lasts.insert(i, last)

    def discard(self, first: Key, last: Key, joined: Key | None = None) -> None:
        """Remove ``first`` .. ``last`` (acked), cutting the ranges it overlaps, and what lies
        between ``joined`` and ``first``: nothing of this consumer is there, but a range that
        merged across the two may hold it."""
        if joined is not None:
            first = after(joined)
        lo = bisect.bisect_left(self._lasts, first)
        hi = bisect.bisect_right(self._firsts, last)
        if lo >= hi:
            return
        kept: list[tuple[Key, Key]] = []
        if self._firsts[lo] < first:
            kept.append((self._firsts[lo], before(first)))
        if self._lasts[hi - 1] > last:
            kept.append((after(last), self._lasts[hi - 1]))
        self._firsts[lo:hi] = [k[0] for k in kept]
        self._lasts[lo:hi] = [k[1] for k in kept]

    def lowest(self) -> Key | None:
        """The first ID of the lowest range in flight, ``None`` when nothing is."""
        return self._firsts[0] if self._firsts else None
