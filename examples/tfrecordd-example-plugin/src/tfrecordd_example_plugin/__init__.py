"""An example tfrecordd plugin package: a line-file source and a text encoder."""
