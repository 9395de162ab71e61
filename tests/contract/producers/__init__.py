"""One module per source type: ``producer(tmp_path)`` for the contract suite."""
