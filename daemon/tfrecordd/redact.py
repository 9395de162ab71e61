"""Secrets kept out of everything tfrecordd prints: logs, config errors, ``check-config``.

Redaction is the default. A URL keeps its scheme, host and path but never its user-info
password (nor a user name standing alone, which is often a token) or a secret-looking query
parameter. A ``storage_options`` value is shown only when its key is known to be harmless
(:data:`HARMLESS_OPTIONS`: endpoints, regions, switches); every other value, whatever its key is
called (an Azure ``connection_string``, a GCS ``token`` file, a custom header), is ``***``.
Free text (an error message that quotes a config value) has its URLs and ``key=value`` secrets
masked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "***"

HARMLESS_OPTIONS = frozenset(
    {
        "anon",
        "asynchronous",
        "cache_regions",
        "client_kwargs",
        "config_kwargs",
        "default_block_size",
        "default_cache_type",
        "default_fill_cache",
        "endpoint",
        "endpoint_url",
        "max_concurrency",
        "project",
        "region",
        "region_name",
        "requester_pays",
        "retries",
        "s3_additional_kwargs",
        "skip_instance_cache",
        "ssl",
        "timeout",
        "use_listings_cache",
        "use_ssl",
        "verify",
        "version_aware",
    }
)
"""``storage_options`` keys (at any depth) whose values are printed as they are."""

_SECRET_WORDS = ("key", "secret", "token", "pass", "pwd", "credential", "auth", "sig", "sas")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_PAIR = re.compile(
    r"(?i)\b([A-Za-z_]*(?:accountkey|signature|password|passwd|secret|token|sig|apikey)"
    r"[A-Za-z_]*)=([^;&\s'\"]+)"
)


def _secret_word(name: str) -> bool:
    lowered = name.lower()
    return any(w in lowered for w in _SECRET_WORDS)


def redact_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with every value whose key is not in :data:`HARMLESS_OPTIONS` replaced by
    ``"***"``; nested mappings under a harmless key are redacted the same way, and the strings
    kept have their URLs redacted."""

    def clean(value: Any) -> Any:
        if isinstance(value, Mapping):
            return redact_options(value)
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        if isinstance(value, str):
            return redact_text(value)
        return value

    return {
        str(k): clean(v) if str(k).lower() in HARMLESS_OPTIONS else REDACTED
        for k, v in options.items()
    }


def redact_url(url: str) -> str:
    """``url`` without secrets: ``scheme://user:***@host/…`` (``***@`` for a lone user name,
    often a token), and secret-looking query parameters' values as ``***``."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
    except ValueError:
        return REDACTED
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{REDACTED}@{host}" if colon else f"{REDACTED}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_secret_word(k) for k, _ in pairs):
            query = urlencode([(k, REDACTED if _secret_word(k) else v) for k, v in pairs], safe="*")
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted and ``name=value`` secrets (``AccountKey=``,
    ``password=``, ``sig=``…) masked."""
    text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    return _PAIR.sub(lambda m: f"{m.group(1)}={REDACTED}", text)
