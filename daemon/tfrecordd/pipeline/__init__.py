"""The daemon's pipeline, one stage per module: sources → encode → write → commit.

- :mod:`~tfrecordd.pipeline.encoding`: what one encode request is, what it gives back, and the
  one function that encodes it (in the daemon's thread or in a worker process alike).
- :mod:`~tfrecordd.pipeline.workers`: the encode worker processes and the daemon's own encode
  thread beside them.
- :mod:`~tfrecordd.pipeline.encode`: the encode stage: raw batches in, encoded batches out, in
  order.
- :mod:`~tfrecordd.pipeline.write`: the write stage: shards, their caps, dead letters, the wait
  for disk space, and when to commit.
- :mod:`~tfrecordd.pipeline.commit`: the commit protocol of one unit (shard fsync, intent,
  publish, manifest, acks, done).
- :mod:`~tfrecordd.pipeline.recovery`: what start-up makes of the journal's unfinished intents.

:class:`tfrecordd.pipeline.runtime.Daemon` wires them together. Nothing is imported here, so that an
encode worker process (``python -m tfrecordd.pipeline.workers``) loads only what it uses.
"""
