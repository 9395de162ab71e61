"""Built-in encoders."""
