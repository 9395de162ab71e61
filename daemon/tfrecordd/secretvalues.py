"""Secret values the config read from files, credentials or secret-looking environment
variables, kept out of every message tfrecordd prints.

:mod:`tfrecordd.redact` masks what looks like a secret (a URL's password, ``password=…``);
a secret read from ``${file:…}`` looks like nothing in particular, so its value is remembered
here when it is read and masked wherever it appears (config errors, ``check-config --show``).
"""

from __future__ import annotations

import logging
import threading

from tfrecordd.redact import REDACTED

MIN_MASKED = 4
"""Values shorter than this are not masked in free text: masking every ``"a"`` of a message
would garble it, and a secret that short protects nothing."""

_lock = threading.Lock()
_values: set[str] = set()

SECRET_WORDS = ("key", "secret", "token", "pass", "pwd", "credential", "auth", "sig", "sas")
"""A config key holding one of these words is a secret key: its value is never printed."""


NAMED_TABLES = frozenset({"features", "context", "feature_lists", "labels", "to"})
"""Tables whose keys a user names (features, image labels, a route's values): a key there is a
name, never a setting, whatever it says."""


def is_secret_key(name: str) -> bool:
    """Whether the config key ``name`` (its last part) names a secret. A key of a table in
    :data:`NAMED_TABLES` (``encoders.e.features.api_key``) names none."""
    parts = [p for p in name.replace("[", ".[").split(".") if not p.startswith("[")]
    if len(parts) > 1 and parts[-2] in NAMED_TABLES:
        return False
    lowered = parts[-1].lower() if parts else ""
    return any(w in lowered for w in SECRET_WORDS)


def remember(value: str) -> None:
    """Mask ``value`` from now on in everything :func:`mask` is given."""
    if value:
        with _lock:
            _values.add(value)


def is_secret(value: str) -> bool:
    """Whether ``value`` holds a remembered secret."""
    with _lock:
        known = list(_values)
    return any(v == value or (len(v) >= MIN_MASKED and v in value) for v in known)


def mask(text: str) -> str:
    """``text`` with every remembered secret (of :data:`MIN_MASKED` characters or more)
    replaced by ``***``; the longest first, so that one holding another is masked whole."""
    with _lock:
        known = sorted((v for v in _values if len(v) >= MIN_MASKED), key=len, reverse=True)
    for value in known:
        text = text.replace(value, REDACTED)
    return REDACTED if text and is_secret(text) else text


class MaskingFilter(logging.Filter):
    """A log handler's filter that masks remembered secrets in each line it writes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _values:
            message = record.getMessage()
            if (masked := mask(message)) != message:
                record.msg, record.args = masked, None
        return True
