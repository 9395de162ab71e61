"""The TFRecord format as a library, usable with no daemon: record framing and CRCs, compressed
streams, the Example wire format, readers and writers."""
