"""tfrecordd's benchmark suite: ``scripts/bench.sh`` (or ``python -m benchmarks.run``)."""
