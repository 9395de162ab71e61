"""Shard tools: ``verify``, ``cat`` and ``transcode``.

``verify PATH...`` reads every record of every file, checking both CRCs of each record and the
integrity of the compressed stream, and prints a count per file and a total. It exits 0 only when
every file is sound; otherwise each bad file is named with the byte offset and whether it is
truncated, corrupted, or holds a record over ``--max-record-bytes`` (oversized: raise the
limit), and the exit code is 65. ``--json`` prints one JSON document instead.

``cat PATH...`` prints one JSON object per line for each record, always: feature name → list of
values, bytes as UTF-8 text where valid and ``{"base64": ...}`` otherwise. ``--sequence`` reads
``SequenceExample`` records as ``{"context": {...}, "feature_lists": {name: [[...], ...]}}``.
``--json`` wraps each line with where the record came from:
``{"path": ..., "offset": ..., "example": {...}}``.

``transcode SRC... --to C --out DIR`` rewrites each source in compression ``C`` as
``DIR/<source name with the new suffix>``, published atomically; an existing output is never
overwritten.

Each command takes a shell glob of an output directory as it is: a manifest, a file still being
written (``*.inprogress``) among the paths is skipped with a note on stderr saying
why (a manifest is checked with its shard by ``verify``); no shard at all among them exits 66.

Instead of PATHs, ``--config FILE [--dataset NAME]`` names a dataset of the daemon's config, and
a PATH that is a local directory holding partition folders (``dt=…``) stands for the dataset
it is: the command reads the dataset's published shards (:func:`tfrecordd.reader.list_shards`),
only those of the partitions ``--partition`` selects (repeatable, folder paths or patterns) and,
with ``--completed``, only those the completion markers list. ``cat`` reads a dataset's
``SequenceExample`` records as such without ``--sequence``; ``transcode`` writes a dataset's
shards into its partition folders under ``--out``. ``verify`` reads a dataset's late shards too
(``_late/``), and checks each completion marker against its partition
(:mod:`tfrecordd.cli.markers`): a listed shard missing or of another size, SHA-256 or record
count, or a shard the marker does not list, is a problem (exit 65).

``verify`` and ``transcode`` report progress on stderr: a bar when stderr is a terminal, one line
per finished file otherwise (see :mod:`tfrecordd.progress`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from tfrecordd.cli import help_of
from tfrecordd.cli.datasetargs import (
    UsageError,
    add_selection_options,
    manifest_path,
    no_shards,
    select_shards,
)
from tfrecordd.cli.markers import check_markers, marker_folders
from tfrecordd.errors import (
    EXIT_DATA,
    EXIT_OK,
    CompressionError,
    DecodeError,
    OutputError,
    RecordError,
    TfrecorddError,
)
from tfrecordd.format import proto
from tfrecordd.format.compress import Compressor
from tfrecordd.format.compression import (
    DEFAULT_MAX_DECOMPRESSED_BYTES,
    SUFFIXES,
    Compression,
    compression_from_name,
)
from tfrecordd.format.framing import DEFAULT_MAX_RECORD_BYTES
from tfrecordd.format.reader import iter_records_with_offsets
from tfrecordd.format.writer import open_writer
from tfrecordd.outputs import manifest
from tfrecordd.progress import Progress

_PATHS_HELP = (
    "TFRecord files or fsspec URLs, or a dataset directory holding partition folders "
    "(or use --config)"
)
_BATCH_RECORDS = 1024
_BATCH_BYTES = 4 * 1024 * 1024
_UNITS = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def _size(text: str) -> int:
    """A byte count such as ``4096``, ``64M`` or ``2G`` (binary units)."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    scale = _UNITS.get(t[-1:], 1)
    digits = t[:-1] if t[-1:] in _UNITS else t
    try:
        value = int(digits) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def _add_limits(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--compression",
        choices=[c.value for c in Compression],
        help="how the inputs are compressed (default: detected from content and name)",
    )
    p.add_argument(
        "--max-record-bytes",
        type=_size,
        default=DEFAULT_MAX_RECORD_BYTES,
        metavar="SIZE",
        help="largest record accepted (default: %(default)s)",
    )
    p.add_argument(
        "--max-decompressed-bytes",
        type=_size,
        default=DEFAULT_MAX_DECOMPRESSED_BYTES,
        metavar="SIZE",
        help="cap on what one file may decompress to (default: %(default)s)",
    )


def _records(args: argparse.Namespace, path: str) -> Iterator[tuple[int, bytes]]:
    compression = Compression(args.compression) if args.compression else None
    return iter_records_with_offsets(
        path,
        compression=compression,
        max_record_bytes=args.max_record_bytes,
        max_decompressed_bytes=args.max_decompressed_bytes,
    )


def _problem(e: TfrecorddError) -> dict[str, Any]:
    """A JSON-able description of what is wrong with a file."""
    if isinstance(e, RecordError):
        return {"kind": e.kind, "offset": e.offset, "detail": e.detail, "message": str(e)}
    if isinstance(e, CompressionError):
        kind = getattr(e, "kind", "invalid")
        return {
            "kind": f"{kind} compressed stream",
            "offset": e.offset,
            "detail": e.detail,
            "message": str(e),
        }
    return {"kind": "input", "offset": None, "detail": str(e), "message": str(e)}


def _plural(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _verify_file(
    args: argparse.Namespace, path: str, progress: Progress, out: TextIO
) -> tuple[dict[str, Any], int | None]:
    """Read ``path`` whole and compare it with its manifest: its JSON entry, and the exit
    code of what is wrong (``None``: sound)."""
    progress.start(path)
    count = 0
    entry: dict[str, Any] = {"path": path}
    code: int | None = None
    try:
        for _ in _records(args, path):
            count += 1
            if count % _BATCH_RECORDS == 0:
                progress.advance(_BATCH_RECORDS)
    except TfrecorddError as e:
        entry.update(ok=False, records=count, error=_problem(e))
        code = e.exit_code
        line, done = f"BAD  {e}", f"BAD after {_plural(count, 'record')}"
    else:
        problems = [] if args.no_manifest else _manifest_problems(args, path)
        done = _plural(count, "record")
        if problems:
            detail = f"{path}: does not match its manifest: " + "; ".join(problems)
            entry.update(ok=False, records=count, error={"kind": "manifest", "detail": detail})
            code = EXIT_DATA
            line = f"BAD  {detail}"
        else:
            entry.update(ok=True, records=count, error=None)
            if path_has_manifest(path):
                entry["manifest"] = True
            line = f"OK   {path}: {done}"
    progress.clear()
    # Without --json, verify prints a line per file itself: no second plain line for it.
    if not args.json:
        print(line, file=out, flush=True)
    progress.advance(count % _BATCH_RECORDS)
    progress.done(path, done)
    return entry, code


def _verify(args: argparse.Namespace) -> int:
    out: TextIO = sys.stdout
    listing: list[str] = []
    selection = select_shards(args, args.paths, late=True, listing_errors=listing)
    if (
        not selection.shards
        and not listing
        and not any(marker_folders(d)[1] for d in selection.datasets)
    ):
        raise no_shards(selection)
    files: list[dict[str, Any]] = []
    codes: list[int] = [EXIT_DATA] * len(listing)
    for problem in listing:
        if not args.json:
            print(f"BAD  {problem}", file=out, flush=True)
    paths = [s.path for s in selection.shards]
    with Progress("verify", len(paths), lines=_progress_lines(args)) as progress:
        for path in paths:
            entry, code = _verify_file(args, path, progress, out)
            files.append(entry)
            if code is not None:
                codes.append(code)
    markers = [m for d in selection.datasets for m in check_markers(d)]
    for m in markers:
        if not m.ok:
            codes.append(EXIT_DATA)
        if args.json:
            continue
        if m.ok:
            listed = f"{_plural(m.shards or 0, 'shard')}, {_plural(m.records or 0, 'record')}"
            print(f"OK   {m.path}: {listed}, as in the partition", file=out)
        for problem in m.problems:
            print(f"BAD  {m.path}: {problem}", file=out)
    total = sum(f["records"] for f in files)
    bad = sum(not f["ok"] for f in files)
    bad_markers = sum(not m.ok for m in markers)
    if args.json:
        doc: dict[str, Any] = {
            "ok": not codes,
            "files": files,
            "total_records": total,
            "bad_files": bad,
            "skipped": selection.skipped,
        }
        if selection.datasets:
            doc |= {
                "markers": [m.as_json() for m in markers],
                "bad_markers": bad_markers,
                "listing_errors": listing,
            }
        json.dump(doc, out, indent=2)
        out.write("\n")
    else:
        summary = f"total: {_plural(total, 'record')} in {_plural(len(files), 'file')}, {bad} bad"
        if markers:
            summary += f"; {_plural(len(markers), 'completion marker')}, {bad_markers} bad"
        print(summary, file=out)
    if not codes:
        return EXIT_OK
    return EXIT_DATA if EXIT_DATA in codes else codes[0]


def _progress_lines(args: argparse.Namespace) -> bool:
    """Whether verify writes a progress line per file on stderr off a terminal: yes, unless
    stderr is the very file its own line per file goes to on stdout (``2>&1``: once is
    enough)."""
    if args.json:
        return True
    try:
        out, err = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return True
    return (out.st_dev, out.st_ino) != (err.st_dev, err.st_ino)


def path_has_manifest(path: str) -> bool:
    """Whether a local shard has a manifest beside it."""
    return "://" not in path and os.path.exists(manifest_path(path))


def _manifest_problems(args: argparse.Namespace, path: str) -> list[str]:
    if not path_has_manifest(path):
        return []
    try:
        return manifest.check(
            path,
            manifest_path(path),
            max_record_bytes=args.max_record_bytes,
            max_decompressed_bytes=args.max_decompressed_bytes,
        )
    except (OSError, ValueError, TfrecorddError) as e:
        return [f"manifest unreadable: {e}"]


def _features(values: dict[str, proto.FeatureValues]) -> dict[str, list[Any]]:
    # A key that is not UTF-8 comes surrogate-escaped; printed as its bytes' escapes (\xff).
    return {
        k.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"): proto.jsonable(v)
        for k, v in sorted(values.items())
    }


def _cat(args: argparse.Namespace) -> int:
    # A reader gone (``| head``) ends it as every command: quietly (tfrecordd.cli.main).
    return _cat_to(args, sys.stdout)


def _cat_to(args: argparse.Namespace, out: TextIO) -> int:
    left: int | None = args.limit
    selection = select_shards(args, args.paths)
    if not selection.shards:
        raise no_shards(selection)
    sequence = args.sequence or any(d.sequence for d in selection.datasets)
    for path in (s.path for s in selection.shards):
        if left is not None and left <= 0:
            break
        for offset, record in _records(args, path):
            if left is not None:
                if left <= 0:
                    break
                left -= 1
            obj: dict[str, Any]
            try:
                if sequence:
                    context, lists = proto.parse_sequence_example(record)
                    obj = {
                        "context": _features(context),
                        "feature_lists": {
                            k: [proto.jsonable(v) for v in vs] for k, vs in sorted(lists.items())
                        },
                    }
                else:
                    obj = _features(proto.parse_example(record))
            except DecodeError as e:
                raise DecodeError(f"{path}: record at offset {offset}: {e}") from e
            if args.json:
                obj = {"path": path, "offset": offset, "example": obj}
            out.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")
    out.flush()
    return EXIT_OK


def output_name(source: str, compression: Compression) -> str:
    """The file name a transcoded copy of ``source`` gets: its base name with the new suffix."""
    name = os.path.basename(source.rstrip("/"))
    for suffix in sorted(SUFFIXES.values(), key=len, reverse=True):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    else:
        if compression_from_name(name) is not None:
            name = os.path.splitext(name)[0]
        name = name.removesuffix(".tfrecord")
    return name + SUFFIXES[compression]


def _transcode_one(args: argparse.Namespace, src: str, dst: str, progress: Progress) -> int:
    to = Compression(args.to)
    if os.path.lexists(dst):
        raise OutputError(dst, "exists already; refusing to overwrite")
    try:
        with open_writer(dst, to, level=args.level) as writer:
            batch: list[bytes] = []
            size = 0
            for _, record in _records(args, src):
                batch.append(record)
                size += len(record)
                if len(batch) >= _BATCH_RECORDS or size >= _BATCH_BYTES:
                    writer.write_many(batch)
                    progress.advance(len(batch))
                    batch, size = [], 0
            writer.write_many(batch)
            progress.advance(len(batch))
            count = writer.records
    except FileExistsError as e:
        raise OutputError(dst, "exists already; refusing to overwrite") from e
    except OSError as e:
        raise OutputError(dst, f"cannot write: {e.strerror or e}") from e
    progress.clear()
    print(f"{src} -> {dst}: {_plural(count, 'record')}", file=sys.stdout, flush=True)
    progress.done(src, _plural(count, "record"))
    return EXIT_OK


def _transcode(args: argparse.Namespace) -> int:
    to = Compression(args.to)
    if to is Compression.NONE and args.level is not None:
        raise UsageError(f"--level {args.level} with --to none: a level sets how hard to compress")
    try:
        Compressor(to, args.level)
    except ValueError as e:
        raise UsageError(f"--level {args.level}: {e}") from None
    try:
        # As `mkdir -p`: an --out that does not exist yet is made, with its parents.
        os.makedirs(args.out, exist_ok=True)
    except FileExistsError:
        raise OutputError(args.out, "exists and is not a directory") from None
    except OSError as e:
        raise OutputError(args.out, f"cannot create the directory: {e.strerror or e}") from e
    codes: list[int] = []
    selection = select_shards(args, args.sources)
    if not selection.shards:
        raise no_shards(selection)
    with Progress("transcode", len(selection.shards)) as progress:
        for shard in selection.shards:
            src = shard.path
            folder = os.path.join(args.out, *shard.partition.split("/"))
            dst = os.path.join(folder, output_name(src, to))
            progress.start(src)
            try:
                _make_folders(args.out, shard.partition)
                codes.append(_transcode_one(args, src, dst, progress))
            except TfrecorddError as e:
                progress.clear()
                print(f"tfrecordd: {e}", file=sys.stderr)
                progress.done(src, "failed")
                codes.append(e.exit_code)
    failed = [c for c in codes if c != EXIT_OK]
    return failed[0] if failed else EXIT_OK


def _make_folders(out: str, partition: str) -> None:
    """The partition's folders under ``out``, as a dataset's are (a transcoded dataset keeps
    its layout)."""
    if not partition:
        return
    try:
        os.makedirs(os.path.join(out, *partition.split("/")), exist_ok=True)
    except OSError as e:
        raise OutputError(os.path.join(out, partition), f"cannot create: {e.strerror}") from e


def _command(
    sub: Any, name: str, func: Callable[[argparse.Namespace], int], help: str
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help=help, description=help)
    p.set_defaults(func=func)
    return p


def add_commands(sub: Any) -> None:
    """Register ``verify``, ``cat`` and ``transcode`` on the CLI's subparsers."""
    p = _command(
        sub,
        "verify",
        _verify,
        help_of("verify"),
    )
    p.add_argument("paths", nargs="*", metavar="PATH", help=_PATHS_HELP)
    add_selection_options(p)
    p.add_argument(
        "--no-manifest",
        action="store_true",
        help="do not compare shards with the manifests beside them",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    _add_limits(p)

    p = _command(sub, "cat", _cat, help_of("cat"))
    p.add_argument("paths", nargs="*", metavar="PATH", help=_PATHS_HELP)
    add_selection_options(p)
    p.add_argument(
        "--json", action="store_true", help='wrap each line as {"path", "offset", "example"}'
    )
    p.add_argument("--limit", type=int, metavar="N", help="stop after N records in all")
    p.add_argument(
        "--sequence",
        action="store_true",
        help="records are SequenceExamples (known from the config with --config)",
    )
    _add_limits(p)

    p = _command(sub, "transcode", _transcode, help_of("transcode"))
    p.add_argument("sources", nargs="*", metavar="SRC", help=_PATHS_HELP)
    add_selection_options(p)
    p.add_argument(
        "--to", required=True, choices=[c.value for c in Compression], help="new compression"
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="directory for the new files, made if missing (a dataset's in its partition folders)",
    )
    p.add_argument(
        "--level",
        type=int,
        help="compression level (default: per compression); not with --to none",
    )
    _add_limits(p)
