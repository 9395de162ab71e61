"""Config values from the environment and from secret files.

Applied to the decoded TOML, to string values only (never to keys, numbers or booleans), so a
substituted value cannot change the config's structure, whatever it holds:

- ``${VAR}``: the environment variable ``VAR``; unset, a config error (set but empty: empty);
- ``${VAR:-default}``: ``default`` when ``VAR`` is unset or empty (``default`` is taken as
  written, not substituted again);
- ``${VAR:?message}``: a config error saying ``message`` when ``VAR`` is unset or empty;
- ``${file:/run/secrets/redis}``: the content of a file (a Docker or Kubernetes secret);
- ``${credential:NAME}``: the file ``NAME`` of ``$CREDENTIALS_DIRECTORY`` (systemd's
  ``LoadCredential=``/``SetCredentialEncrypted=``);
- ``$$``: a literal ``$``. A ``$`` followed by anything else is kept as it is.

A file's trailing line ends are dropped (editors add one, and a password with a newline fails
to authenticate with nothing to say why); spaces are kept. A value that holds a line end after
substitution is refused. What a file or credential gives is a secret wherever it goes; what a
variable gives is one under a secret-looking key (:func:`tfrecordd.secretvalues.is_secret_key`):
either is remembered by :mod:`tfrecordd.secretvalues` and never printed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tfrecordd import secretvalues
from tfrecordd.errors import ConfigError

CREDENTIALS_DIRECTORY = "CREDENTIALS_DIRECTORY"
"""The variable systemd sets to the folder of a unit's credentials."""
MAX_SECRET_BYTES = 64 << 10
"""The largest secret file read: a path to a large file by mistake is refused, not loaded."""

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_REFERENCE = re.compile(r"\$(?:(\$)|\{([^}]*)(\})?)")
_VARIABLE = re.compile(rf"^(?P<name>{_NAME})(?:(?P<op>:-|:\?)(?P<arg>.*))?$", re.S)


class _Problem(Exception):
    pass


def interpolate(data: Any, environ: Mapping[str, str] | None = None) -> Any:
    """``data`` (a decoded TOML document) with every reference in its string values
    substituted; raises :class:`~tfrecordd.errors.ConfigError` listing every problem, each
    with its key."""
    env = os.environ if environ is None else environ
    errors: list[str] = []
    out = _walk(data, "", env, errors)
    if errors:
        raise ConfigError(errors)
    return out


def _key(prefix: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{prefix}[{part}]"
    return f"{prefix}.{part}" if prefix else part


def _walk(value: Any, key: str, env: Mapping[str, str], errors: list[str]) -> Any:
    if isinstance(value, dict):
        return {k: _walk(v, _key(key, k), env, errors) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, _key(key, i), env, errors) for i, v in enumerate(value)]
    if isinstance(value, str) and "$" in value:
        try:
            return substitute(value, key, env)
        except _Problem as e:
            errors.append(f"{key or '(top level)'}: {e}")
    return value


def substitute(text: str, key: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with its references substituted, for the config key ``key``."""
    env = os.environ if environ is None else environ
    sources: list[str] = []
    secret = False

    def one(m: re.Match[str]) -> str:
        nonlocal secret
        if m.group(1):
            return "$"
        inner = m.group(2)
        if m.group(3) is None:
            raise _Problem(f"`${{{inner}` has no closing `}}`")
        if "${" in inner:
            # ${A:-${B}} would read `${B` as the default and leave a stray `}`.
            raise _Problem(f"`${{{inner}}}` nests a reference: nesting is not supported")
        if inner.startswith(("file:", "credential:")):
            value, where = _secret_file(inner)  # remembered there, alone: a URL around it is not
        else:
            value, where = _variable(inner, env)
            secret = secret or secretvalues.is_secret_key(key)
        sources.append(where)
        return value

    result = _REFERENCE.sub(one, text)
    if sources and ("\n" in result or "\r" in result):
        raise _Problem(
            f"holds a line end after substitution (from {', '.join(sources)}): refused, "
            "a config value is one line"
        )
    if secret:
        secretvalues.remember(result)
    return result


def _variable(inner: str, env: Mapping[str, str]) -> tuple[str, str]:
    m = _VARIABLE.match(inner)
    if m is None:
        raise _Problem(
            f"`${{{inner}}}` is not a reference: use ${{VAR}}, ${{VAR:-default}}, "
            "${VAR:?message}, ${file:PATH} or ${credential:NAME} ($$ for a literal $)"
        )
    name, op, arg = m.group("name"), m.group("op"), m.group("arg")
    value = env.get(name)
    if op == ":-":
        return (value if value else arg), f"${name}"
    if op == ":?":
        if not value:
            raise _Problem(f"${name} is {'empty' if value == '' else 'not set'}: {arg}")
        return value, f"${name}"
    if value is None:
        raise _Problem(
            f"the environment variable {name} is not set (use ${{{name}:-default}} for a default)"
        )
    return value, f"${name}"


def _secret_file(inner: str) -> tuple[str, str]:
    kind, _, name = inner.partition(":")
    if kind == "credential":
        folder = os.environ.get(CREDENTIALS_DIRECTORY)
        if not name or "/" in name or name in (".", ".."):
            raise _Problem(f"`${{credential:{name}}}`: a credential's name is a file name")
        if not folder:
            raise _Problem(
                f"`${{credential:{name}}}`: ${CREDENTIALS_DIRECTORY} is not set (systemd sets "
                f"it for a unit with LoadCredential={name}:…)"
            )
        path = Path(folder) / name
    else:
        if not name:
            raise _Problem("`${file:}` names no file")
        path = Path(name).expanduser()
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SECRET_BYTES + 1)
    except OSError as e:
        raise _Problem(f"cannot read the secret file {path}: {e.strerror or e}") from None
    if len(data) > MAX_SECRET_BYTES:
        raise _Problem(f"the secret file {path} is over {MAX_SECRET_BYTES} bytes: not a secret?")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise _Problem(f"the secret file {path} is not UTF-8 text") from None
    text = text.rstrip("\r\n")
    secretvalues.remember(text)
    return text, str(path)
