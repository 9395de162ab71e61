"""A dataset's files read the same way from a local directory and from an fsspec location.

A location is a local path (or a ``file://`` URL) or an fsspec URL (``s3://bucket/prefix``,
``gs://…``, ``memory://…``). Paths inside it are relative and use ``/``; the paths handed back to
callers are the location joined with them, so a URL stays in the form the caller wrote.
"""

from __future__ import annotations

import importlib
import os
import stat
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO, cast

from tfrecordd.errors import InputError
from tfrecordd.fsys import is_url, local_path

Folders = dict[str, dict[str, int]]
"""Each folder reached (relative, ``""`` for the root) with its files' names and sizes."""


def join(location: str, relative: str) -> str:
    """``relative`` (``/``-separated) under ``location``; the location itself when empty."""
    if not relative or location.endswith("://"):
        return location + relative
    return f"{location.rstrip('/')}/{relative}" if location.rstrip("/") else f"/{relative}"


def subpath(folder: str, name: str) -> str:
    """``name`` in the relative ``folder`` (``""``: the root)."""
    return f"{folder}/{name}" if folder else name


def _fsspec() -> Any:
    # fsspec ships no type information; imported by name so its missing stubs are not an error.
    return importlib.import_module("fsspec")


def _url_fs(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    try:
        fs, path = _fsspec().core.url_to_fs(url, **dict(storage_options or {}))
    except (OSError, ValueError, ImportError) as e:
        raise InputError(url, f"cannot open: {e}") from e
    return fs, cast(str, path)


def _open(path: str, storage_options: Mapping[str, Any] | None) -> BinaryIO:
    """``path`` opened; ``FileNotFoundError`` when it is missing, ``InputError`` otherwise."""
    if is_url(path):
        fs, inner = _url_fs(path, storage_options)
        try:
            return cast(BinaryIO, fs.open(inner, "rb"))
        except FileNotFoundError:
            raise
        except (OSError, ValueError) as e:
            raise InputError(path, f"cannot open: {e}") from e
    try:
        f = open(local_path(path), "rb")  # noqa: SIM115 - returned open to the caller
    except FileNotFoundError:
        raise
    except OSError as e:
        raise InputError(path, f"cannot open: {e.strerror}") from e
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        raise InputError(path, "not a regular file")
    return f


def open_file(path: str, storage_options: Mapping[str, Any] | None = None) -> BinaryIO:
    """``path`` (local or a URL) opened for binary reading; only a regular file is opened."""
    try:
        return _open(path, storage_options)
    except FileNotFoundError:
        raise InputError(path, "no such file") from None


def read_file(path: str, storage_options: Mapping[str, Any] | None = None) -> bytes | None:
    """The whole content of the small file ``path`` (a manifest, a marker); ``None`` when
    there is no such file."""
    try:
        f = _open(path, storage_options)
    except FileNotFoundError:
        return None
    with f:
        return f.read()


class Store:
    """Read-only access to the files under one location."""

    def __init__(
        self, location: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
    ) -> None:
        self.location = os.fspath(location)
        self.storage_options = storage_options

    def path(self, relative: str) -> str:
        """The full path (or URL) of ``relative``."""
        return join(self.location, relative)

    def read(self, relative: str) -> bytes:
        """The content of the small file at ``relative``, which was listed."""
        data = read_file(self.path(relative), self.storage_options)
        if data is None:
            raise InputError(self.path(relative), "listed, then gone: is it being replaced?")
        return data

    def open(self, relative: str) -> BinaryIO:
        """The file at ``relative``, opened for binary reading."""
        return open_file(self.path(relative), self.storage_options)

    def walk(self, descend: Callable[[str], bool]) -> Folders:
        """Every file under the location, by folder. A folder below the root is entered only
        when ``descend(its relative path)`` says so; symlinked folders are not followed (a loop
        would never end), symlinked files are."""
        if is_url(self.location):
            return self._walk_url(descend)
        return self._walk_local(descend)

    def _walk_local(self, descend: Callable[[str], bool]) -> Folders:
        root = local_path(self.location)
        if not os.path.exists(root):
            raise InputError(self.location, "no such directory")
        if not os.path.isdir(root):
            raise InputError(self.location, "not a directory")
        found: Folders = {}
        pending = [""]
        while pending:
            relative = pending.pop()
            files = found.setdefault(relative, {})
            try:
                entries = list(os.scandir(os.path.join(root, relative) if relative else root))
            except OSError as e:
                raise InputError(self.path(relative), f"cannot list: {e.strerror}") from e
            for entry in entries:
                sub = f"{relative}/{entry.name}" if relative else entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if descend(sub):
                            pending.append(sub)
                    elif entry.is_file():
                        files[entry.name] = entry.stat().st_size
                except OSError:
                    continue  # gone since it was listed, or a dangling link: not a published file
        return found

    def _walk_url(self, descend: Callable[[str], bool]) -> Folders:
        fs, root = _url_fs(self.location, self.storage_options)
        try:
            if not fs.isdir(root):
                exists = fs.exists(root)
                raise InputError(
                    self.location, "not a directory" if exists else "no such directory"
                )
            listing: dict[str, dict[str, Any]] = fs.find(root, detail=True, withdirs=False)
        except (OSError, ValueError) as e:
            raise InputError(self.location, f"cannot list: {e}") from e
        base = root.rstrip("/")
        found: Folders = {"": {}}
        for path, info in listing.items():
            if base and not path.startswith(base + "/"):
                continue
            relative = path[len(base) + 1 :] if base else path.lstrip("/")
            folder, _, name = relative.rpartition("/")
            parts = folder.split("/") if folder else []
            if all(descend("/".join(parts[: i + 1])) for i in range(len(parts))):
                for i in range(len(parts)):
                    found.setdefault("/".join(parts[: i + 1]), {})
                found[folder][name] = int(info.get("size") or 0)
        return found
