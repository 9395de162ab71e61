"""``python -m tfrecordd``: the command line."""

from tfrecordd.cli import main

# Encode worker processes import the main module again: only the real entry point runs the CLI.
if __name__ == "__main__":
    raise SystemExit(main())
