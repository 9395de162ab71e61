"""The built-in tfrecordd plugins, registered through the same entry points a third party uses."""
