"""The parts of the public reader, :mod:`tfrecordd.reader`: import from there, not from here.

:mod:`~tfrecordd.readers.store` reads a dataset's files wherever they are (a local directory or an
fsspec URL); :mod:`~tfrecordd.readers.layout` lists the published shards of a dataset;
:mod:`~tfrecordd.readers.check` checks a completed partition against its marker;
:mod:`~tfrecordd.readers.seek` reads a shard from any record on;
:mod:`~tfrecordd.readers.tfdata` builds a ``tf.data`` pipeline; :mod:`~tfrecordd.readers.torchdata`
splits shards across PyTorch workers and ranks and resumes mid-epoch.
"""
