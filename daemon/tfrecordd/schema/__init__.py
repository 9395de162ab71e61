"""Declared features: their specs, JSON and CSV values converted to them, and the compiled encode
plans."""
