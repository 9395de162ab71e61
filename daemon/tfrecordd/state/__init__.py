"""The daemon's own durable state: the commit journal and checkpoint, the locks that keep one
daemon per state, and the dead-letter file."""
