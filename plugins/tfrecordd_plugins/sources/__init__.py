"""Built-in sources."""
