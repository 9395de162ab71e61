"""Redis Streams source: a consumer group read with XREADGROUP, acked with XACK after publish.

Each daemon is one consumer (named after its ``node_id`` unless configured) of a consumer group;
the daemons of a group share a stream, and Redis hands each entry to one of them. An entry
stays in its consumer's pending entries list (PEL) from XREADGROUP until the shard holding its
record is published and durable; only then is it XACKed. A batch's token is the ID ranges it
covers (``[first, last]``, or an ID alone) with its version (:class:`.ranges.RedisToken`),
journalled with the shard: a range never spans an entry pending in the group outside the
batch, so XACKing what the group has pending in it acks the batch and nothing else. Reads go
through Lua scripts that hand out no more than ``max_batch_bytes`` (plus one event cut to
``max_event_bytes``) at a time.

Positions stay flat: :meth:`RedisStreamSource.compact` merges the ranges of a shard's batches
that were read back to back, so a shard of any size read by one consumer is a range or two in
memory and in the journal, not a range per batch. Two ranges ``[a, b]`` and ``[c, d]`` merge
into ``[a, d]`` only if acking it can take nothing else from the group: nothing may be pending
between ``b`` and ``c``, then or later. A range's third ID says so (``[c, d, b]``: ``c`` is
*joined* to ``b``), set by the read scripts inside Redis, atomically with the read:

* entries read as new: ``c`` was handed out by XREADGROUP ``>`` right after ``b``, in the same
  reply or in this consumer's next one with the group's last-delivered-id still ``b`` just
  before it (no consumer of the group was handed anything since ``b``, so no other daemon
  holds an entry in between); for the first entry of a reply, XPENDING must also find nothing
  between ``b`` and ``c`` (what a group moved back could have left there);
* pending and claimed entries (read one at a time): XPENDING finds nothing in the group
  between ``b`` and ``c``. It misses nothing: entries deleted by XDEL or trimmed by XTRIM stay
  in the PEL until acked.

Nothing can become pending there afterwards: XADD only adds IDs above the stream's last one
and XREADGROUP ``>`` only IDs above the last-delivered-id (both ``d`` or more); XCLAIM and
XAUTOCLAIM move entries that are already pending. Only a group moved back (XGROUP SETID, or
deleted and created again) could hand out entries in between again; that
stops the source (:class:`~tfrecordd.errors.SourceLostError`, exit 69) when seen, and is a
replay anyway. So a merged range acks exactly what its parts would. With several daemons in a
group, ranges merge only over the stretches one daemon reads alone: their number grows with
how often the daemons' reads interleave, not with the entries. Tokens of older releases (IDs
alone and ``[first, last]`` ranges) are read and acked as before.

Exactly once, within one daemon:

* a crash before the shard is published leaves the entries in this consumer's PEL; at start-up
  the source reads its own pending entries first (XREADGROUP from ID ``0``) and sends them again;
* a crash after the publish leaves a journal intent whose tokens come back to :meth:`recover`
  as ``pending``: they are XACKed there, before anything is read, so the pending read no longer
  returns them and nothing committed is written twice. ``recover`` waits (retrying with backoff)
  until Redis takes those XACKs, because the daemon marks the intent done when it returns;
* finished commits were XACKed before they were marked done, so ``fold`` keeps only the highest
  committed entry ID: where the group resumes should it be deleted (a deleted or reset group
  stops the source with :class:`~tfrecordd.errors.SourceLostError`, never a silent replay).

Across daemons, entries left pending by a consumer that died are taken over with XAUTOCLAIM
once they have been idle for ``claim_idle``. Redis cannot tell a dead consumer from a slow one,
so ``claim_idle`` must exceed the longest time any daemon of the group may hold an entry between
reading and XACKing it: above ``2 * output.max_shard_age + daemon.drain_timeout`` of each
daemon. A daemon that dies between publishing a shard and XACKing its entries, and is not back
within ``claim_idle``, lets another daemon write those entries again: that window (one commit,
between the directory fsync and XACK) is the limit of the guarantee. Redis itself must keep
what it acknowledged (``appendonly yes``, ``appendfsync always``) for XACKs and entries to
survive a Redis crash.

The package: :mod:`.config` holds the source's keys, :mod:`.scripts` the Lua read and ack
scripts and the entries they return, :mod:`.ranges` the entry IDs, the ranges of a token and
their merge, :mod:`.source` the source itself, re-exported here for the ``tfrecordd.sources``
entry point.
"""

from tfrecordd_plugins.sources.redis_stream.config import RedisStreamSourceConfig
from tfrecordd_plugins.sources.redis_stream.source import RedisStreamSource

__all__ = ["RedisStreamSource", "RedisStreamSourceConfig"]
