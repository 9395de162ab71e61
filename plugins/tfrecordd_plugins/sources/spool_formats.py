"""Format readers: how the bytes of one claimed spool file become batches of events.

``whole-file`` makes the file one event (with its name and its parent folder's name as a label);
``jsonl`` sends :class:`~tfrecordd.plugin.Lines` batches of whole lines, cut from one reused
buffer (the lines are split where they are encoded); ``csv`` finds each record's end with
:mod:`.csvrecords` and sends one event per record, keyed by the header row. Every batch carries
the token of the offset after its last record, the file's last batch its end, and a record over
``max_line_bytes`` becomes a dead letter holding its first bytes; an input that cannot be read
on (:class:`.spool_reading.Rejected`) ends with a batch that marks the file as rejected.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Protocol

import anyio

from tfrecordd.format import compiled
from tfrecordd.plugin import Lines, RawBatch, RawEvent, SourceContext
from tfrecordd_plugins.sources import csvrecords
from tfrecordd_plugins.sources.csvrecords import BOM
from tfrecordd_plugins.sources.spool_positions import token as _token
from tfrecordd_plugins.sources.spool_reading import FileReader, Rejected

log = logging.getLogger("tfrecordd_plugins.sources.directory")  # the source's one logger


class FormatSettings(Protocol):
    """The source settings the format readers follow (the directory source's config)."""

    @property
    def format(self) -> str: ...
    @property
    def read_size(self) -> int: ...
    @property
    def max_line_bytes(self) -> int: ...
    @property
    def max_file_bytes(self) -> int: ...
    @property
    def csv_delimiter(self) -> str: ...
    @property
    def csv_encoding(self) -> str: ...


class FormatReaders:
    """Reads claimed files into batches by the configured format, reusing one read buffer."""

    def __init__(self, config: FormatSettings, spool_name: str) -> None:
        self.config = config
        self._spool_name = spool_name
        """The label of a whole file directly in the spool: the spool folder's name."""
        self._work = bytearray(work_size(config))

    async def read(
        self,
        ctx: SourceContext,
        claim: str,
        rel: str,
        reader: FileReader,
        offset: int,
        reopen: Callable[[], FileReader],
        *,
        final: bool = False,
    ) -> None:
        """Send the batches of the open ``reader`` (claim ``claim``, spool path ``rel``) from
        ``offset``; ``reopen`` gives another reader of the same file (a resumed CSV file's
        header is read from its start). A last line (or CSV record) without its line end is
        read only if ``final`` (the file was found still and closed) or no process has the file
        open for writing (a read lease, where one is granted); else the end's token stops
        before it, marked ``part``, and finishing decides (:mod:`.spool_finish`)."""
        if self.config.format == "whole-file":
            await self._read_whole(ctx, claim, rel, reader)
        elif self.config.format == "jsonl":
            await self._read_lines(ctx, claim, rel, reader, offset, final)
        else:
            await self._read_csv(ctx, claim, rel, reader, offset, reopen, final)

    async def _read_whole(
        self, ctx: SourceContext, claim: str, rel: str, reader: FileReader
    ) -> None:
        limit = self.config.max_file_bytes
        reads: list[bytes] = []  # joined once: adding each read to the rest is quadratic
        size = 0
        try:
            async for chunk in reader.chunks(0):
                reads.append(chunk)
                size += len(chunk)
                if size > limit:
                    raise Rejected(f"file larger than max_file_bytes ({limit})")
        except Rejected as e:
            await reject(ctx, claim, rel, str(e), size)
            return
        data = b"".join(reads)
        del reads
        parts = Path(rel).parts
        label = parts[-2] if len(parts) > 1 else self._spool_name
        value = {"filename": parts[-1], "label": label, "path": rel}
        event = RawEvent(data, rel, value=value, format="file")
        await ctx.send(
            RawBatch(ctx.name, [event], _token(claim, len(data), True, seen=reader.last_seen))
        )

    async def _read_lines(
        self,
        ctx: SourceContext,
        claim: str,
        rel: str,
        reader: FileReader,
        offset: int,
        final: bool,
    ) -> None:
        """Send the file's JSON lines from ``offset`` as :class:`Lines` batches of whole lines.

        Only whole buffers are handled here (a search for the last newline, a count of them): the
        lines are split where they are encoded. A line that outgrows ``max_line_bytes`` before
        its newline arrives is skipped as it is read, its first bytes kept for the dead letter.

        The file is read into one buffer, the source's own, over and over: a new buffer per read
        is fresh memory the kernel faults in page by page (with 64 MiB reads, a tenth of the
        daemon's CPU went to those faults). Only the batches are copied out of it.

        A buffer's last batch waits for the next read: when that read finds the end of the file,
        the batch carries the file's end, instead of a batch of its own after it (which would
        cost a commit of its own when it arrives between two shards). Where that batch is short
        of ``max_batch_events`` and ``max_batch_bytes`` only because the buffer ended, the next
        read's first lines complete it: a file's batches are all full but its last, whatever
        the reads (with 1 MiB reads of 220-byte lines, every other batch was a read's short
        tail, and a partitioned dataset's parts of a batch were half as large).
        """
        max_line, read_size = self.config.max_line_bytes, self.config.read_size
        max_events, max_bytes = ctx.max_batch_events, ctx.max_batch_bytes
        work = self._work
        kept = 0  # bytes at work[:kept] (a line's start), from stream position `offset`
        head: bytes | None = None  # first bytes of an overlong line still being skipped
        head_at = 0
        eof = False
        lines = False  # whether the last buffer held whole lines: if not, the end goes alone
        held: tuple[Lines, int] | None = None  # the last batch cut, and the offset after it
        short: tuple[int, int] | None = None  # held's (lines, bytes) if the buffer's end cut it
        part = False  # the file ends in a line without its line end, not read (not final)
        # The number of the line at `offset`, for dead letters; 0: not known (a file resumed
        # from a journalled offset, where counting would mean reading it again from its start).
        line = 1 if offset == 0 else 0
        head_line = 0

        async def send_held(last: bool) -> None:
            nonlocal held, short
            if held is not None:
                batch, end = held
                held = short = None
                token = _token(claim, end, last, seen=reader.last_seen, part=last and part)
                await ctx.send(RawBatch(ctx.name, [], token, batch))

        try:
            await reader.seek(offset)
            while not eof:
                if len(work) < kept + read_size:
                    # A new buffer, never a resize: a view of the old one may still be held by
                    # the thread that read into it. Doubled, so a long line is copied a few
                    # times, not once per read.
                    grown = bytearray(max(kept + read_size, 2 * len(work)))
                    grown[:kept] = work[:kept]
                    work = self._work = grown
                with memoryview(work) as view:
                    got = await reader.read_into(view[kept : kept + read_size])
                eof = not got
                if held is not None and eof and not kept and head is None:
                    await send_held(True)
                    return
                if head is not None or short is None:
                    await send_held(False)
                n, at = kept + got, 0  # work[at:n] is unread, from stream position `offset`
                if offset == 0 and not kept and n >= len(BOM) and work[: len(BOM)] == BOM:
                    # A UTF-8 byte-order mark (.NET's Encoding.UTF8, PowerShell 5.1's utf8) is
                    # no part of the first line.
                    at = offset = len(BOM)
                if head is not None:
                    nl = work.find(b"\n", 0, n)
                    if nl < 0 and not eof:
                        offset, kept = offset + n, 0
                        continue
                    at = nl + 1 if nl >= 0 else n
                    offset += at
                    event = too_long(rel, head_at, head, max_line, head_line)
                    line = line and line + 1
                    last = eof and at == n
                    token = _token(claim, offset, last, seen=reader.last_seen)
                    await ctx.send(RawBatch(ctx.name, [event], token))
                    head = None
                    if last:
                        return
                # work[:kept] is the end of a line from the reads before: no newline there.
                whole = n if eof and final else work.rfind(b"\n", max(at, kept), n) + 1 or at
                if eof and whole < n and (n - whole > max_line or await reader.written_out()):
                    # Over-long however it ends (dead-lettered now), or no writer left to end
                    # it: the last line is all there is.
                    whole = n
                part = eof and whole < n
                lines = whole > at
                start = at
                with memoryview(work) as view:
                    newlines: list[int] = []
                    if short is not None and held is not None and whole > start:
                        # The short batch held from the read before goes on with this one's
                        # first lines, within the caps (else it goes as it is).
                        room = max_bytes - short[1]
                        end = next(cuts(work, start, whole, max_events - short[0], room, newlines))
                        if end - start <= room:
                            batch = held[0]
                            data = batch.data + view[start:end]
                            held = (
                                Lines(data, rel, batch.offset, max_line, batch.line),
                                (offset + end - at),
                            )
                            short = _short(
                                short[0] + newlines[-1],
                                len(data),
                                end == whole,
                                max_events,
                                max_bytes,
                            )
                            start = end
                            line = line and line + newlines[-1]
                        newlines.clear()
                    for end in cuts(work, start, whole, max_events, max_bytes, newlines):
                        await send_held(False)
                        at_start = offset + start - at
                        batch = Lines(bytes(view[start:end]), rel, at_start, max_line, line)
                        held = batch, offset + end - at
                        short = _short(
                            newlines[-1], end - start, end == whole, max_events, max_bytes
                        )
                        start = end
                        line = line and line + newlines[-1]
                if eof:
                    await send_held(True)
                offset, kept = offset + whole - at, n - whole
                if whole:  # else the line goes on where it is
                    work[:kept] = work[whole:n]
                if kept > max_line:
                    head, head_at, head_line = bytes(work[:max_line]), offset, line
                    offset, kept = offset + kept, 0
        except Rejected as e:
            await send_held(False)
            await reject(ctx, claim, rel, str(e), offset)
            return
        finally:
            if len(work) > work_size(self.config):
                # A line longer than a read grew it: back to its usual size for the next file.
                self._work = bytearray(work_size(self.config))
        if not lines:
            token = _token(claim, offset, True, seen=reader.last_seen, part=part)
            await ctx.send(RawBatch(ctx.name, [], token))

    async def _read_csv(
        self,
        ctx: SourceContext,
        claim: str,
        rel: str,
        reader: FileReader,
        offset: int,
        reopen: Callable[[], FileReader],
        final: bool,
    ) -> None:
        """Send the file's CSV records from ``offset`` in batches whose tokens sit on record
        ends (the header row first, or read again when resuming past it). A record longer than
        ``max_line_bytes`` is dead-lettered whole (its first bytes kept) while the scanner reads
        on through it, so the next record starts exactly where the long one ends. A header row
        that cannot be read (:func:`.csvrecords.header`, or longer than ``max_line_bytes``) has
        the file refused whole: its columns are unknown."""
        cfg = self.config
        max_line = cfg.max_line_bytes
        max_events, max_bytes = ctx.max_batch_events, ctx.max_batch_bytes
        delimiter = cfg.csv_delimiter
        sep = ord(delimiter)
        header: list[str] | None = None
        events: list[RawEvent] = []
        batch_bytes = 0
        # Unread bytes from stream position `offset`, grown and cut in place: a record over
        # many reads costs its length, not its length times the reads.
        buf = bytearray()
        scanned = 0  # buf[:scanned] was scanned already, ending in `state`
        state = csvrecords.State.FIELD_START
        head: bytes | None = None  # first bytes of an overlong record still being skipped
        head_at = head_line = 0
        # The number of the line at `offset`, as in _read_lines (0: not known); a record's is
        # the line it starts on (a quoted field may hold line ends).
        line = 1 if offset == 0 else 0
        # The last full batch waits for the next one: if none comes, it carries the file's end
        # (as the JSON-lines reader's last batch does), not an empty batch of its own.
        held: RawBatch | None = None
        try:
            if offset > 0:
                header = await self._csv_header(reopen())
            async with aclosing(reader.chunks(offset)) as chunks:
                while True:
                    chunk = await anext(chunks, b"")
                    buf += chunk
                    if offset == 0 and header is None:
                        if len(buf) < len(csvrecords.BOM) and chunk:
                            continue
                        if buf.startswith(csvrecords.BOM):
                            del buf[: len(csvrecords.BOM)]
                            offset = len(csvrecords.BOM)
                    if not chunk and buf and not final:
                        final = await reader.written_out()  # no writer left: a last record
                    found = csvrecords.split(buf, not chunk and final, state, sep, scanned)
                    at = offset
                    for record, nxt in zip(found.records, found.ends, strict=True):
                        n = len(record)
                        if head is not None:
                            events.append(too_long(rel, head_at, head, max_line, head_line))
                            head = None
                        elif header is None:
                            if n > max_line:
                                raise Rejected(self._long_header())
                            if n and not record.isspace() and not csvrecords.preamble(record):
                                header = self._header(record)
                        elif n > max_line:
                            events.append(too_long(rel, at, record[:max_line], max_line, line))
                        elif not n or record.isspace():
                            pass
                        else:
                            where = f"{rel}:line {line}:{at}" if line else f"{rel}:{at}"
                            events.append(
                                csvrecords.event(record, where, header, delimiter, cfg.csv_encoding)
                            )
                            batch_bytes += n
                        line = line and line + buf.count(b"\n", at - offset, nxt)
                        at = offset + nxt
                        if len(events) >= max_events or batch_bytes >= max_bytes:
                            if held is not None:
                                await ctx.send(held)
                            held = RawBatch(ctx.name, events, _token(claim, at, False))
                            events, batch_bytes = [], 0
                    del buf[: found.consumed]
                    offset += found.consumed
                    state, scanned = found.state, len(buf)
                    if not chunk:
                        if head is not None:  # the input ended inside the over-long record
                            events.append(too_long(rel, head_at, head, max_line, head_line))
                        break
                    # A carriage return at the end may be the record's end: not counted yet.
                    if len(buf) - (state is csvrecords.State.AFTER_CR) > max_line:
                        if header is None:
                            raise Rejected(self._long_header())
                        # Over-long: keep its first bytes for the dead letter and drop the rest,
                        # carrying the scanner's state across so its end is found exactly.
                        if head is None:
                            head, head_at, head_line = bytes(buf[:max_line]), offset, line
                        line = line and line + buf.count(b"\n")
                        offset += len(buf)
                        buf.clear()
                        scanned = 0
        except Rejected as e:
            if held is not None:
                await ctx.send(held)
            if events:
                await ctx.send(RawBatch(ctx.name, events, _token(claim, offset, False)))
            await reject(ctx, claim, rel, str(e), offset)
            return
        if held is not None and not events:
            events, held = held.events, None
        if held is not None:
            await ctx.send(held)
        end = _token(claim, offset, True, seen=reader.last_seen, part=bool(buf))
        await ctx.send(RawBatch(ctx.name, events, end))

    def _header(self, record: bytes) -> list[str]:
        """The column names of a header row, or :class:`Rejected` saying why it has none."""
        try:
            return csvrecords.header(record, self.config.csv_delimiter, self.config.csv_encoding)
        except csvrecords.BadHeader as e:
            raise Rejected(str(e)) from None

    def _long_header(self) -> str:
        return f"the header row is longer than max_line_bytes ({self.config.max_line_bytes})"

    async def _csv_header(self, reader: FileReader) -> list[str]:
        """The header row of a CSV file being resumed past its start (``reader`` not open yet);
        :class:`Rejected` if it cannot be read (or is gone: the file was replaced)."""
        with anyio.CancelScope(shield=True):
            await reader.open()
        sep, max_line = ord(self.config.csv_delimiter), self.config.max_line_bytes
        try:
            buf = bytearray()
            scanned, state = 0, csvrecords.State.FIELD_START
            start = True
            async with aclosing(reader.chunks(0)) as chunks:
                while True:
                    chunk = await anext(chunks, b"")
                    buf += chunk
                    if start:
                        if len(buf) < len(csvrecords.BOM) and chunk:
                            continue
                        start = False
                        if buf.startswith(csvrecords.BOM):
                            del buf[: len(csvrecords.BOM)]
                    found = csvrecords.split(buf, not chunk, state, sep, scanned)
                    for record in found.records:
                        if len(record) > max_line:
                            raise Rejected(self._long_header())
                        if record.strip() and not csvrecords.preamble(record):
                            return self._header(record)
                    del buf[: found.consumed]
                    state, scanned = found.state, len(buf)
                    if not chunk:
                        raise Rejected("the header row it was read with is gone")
                    if len(buf) - (state is csvrecords.State.AFTER_CR) > max_line:
                        raise Rejected(self._long_header())
        finally:
            with anyio.CancelScope(shield=True):
                await reader.close()


async def reject(ctx: SourceContext, claim: str, rel: str, reason: str, offset: int) -> None:
    """Send the batch that ends a file whose rest (from ``offset``) cannot be read: a dead
    letter with ``reason``, and a token that has the file moved aside once it is committed."""
    log.warning("%s: %s rejected: %s", ctx.name, rel, reason)
    event = RawEvent(b"", f"{rel}:{offset}", error=f"input rejected: {reason}")
    await ctx.send(RawBatch(ctx.name, [event], _token(claim, offset, True, bad=reason)))


def work_size(config: FormatSettings) -> int:
    """The read buffer's size: a read, after the start of a line left from the read before."""
    return config.read_size + min(config.max_line_bytes, config.read_size)


def _short(
    lines: int, size: int, tail: bool, max_events: int, max_bytes: int
) -> tuple[int, int] | None:
    """A batch's ``(lines, size)`` if it is a buffer's ``tail`` short of both caps (the next
    read may complete it), else ``None``."""
    return (lines, size) if tail and lines < max_events and size < max_bytes else None


def cuts(
    buf: bytes | bytearray,
    start: int,
    whole: int,
    max_events: int,
    max_bytes: int,
    newlines: list[int] | None = None,
) -> Iterator[int]:
    """Where the batches of ``buf[start:whole]`` (whole lines) end: each holds
    ``max_events`` lines (the last may hold fewer) and, unless one line is longer, at most
    ``max_bytes`` bytes. Exact counts matter: a shard's record cap is filled by whole batches.
    One at a time: the source sends each batch (and lets the event loop run) before the next.
    ``newlines`` gets the newlines of each batch as it is yielded (counted on the way: the line
    numbers of dead letters)."""
    per_line = 0  # bytes per line in the batch before: where to look for this one's end
    while start < whole:
        bound = whole
        if bound - start > max_bytes:
            bound = (
                buf.rfind(b"\n", start, start + max_bytes) + 1
                or buf.find(b"\n", start + max_bytes, whole) + 1
                or whole
            )
        if compiled.COMPILED:
            end, found = compiled.line_end(buf, start, bound, max_events)
            if newlines is not None:
                newlines.append(found)
            yield end
            start = end
            continue
        end = bound
        # Counting newlines up to the end of a large buffer for every batch would cost more than
        # the batches: look about as far as the batch before suggests.
        if per_line and end - start > (reach := per_line * max_events * 5 // 4):
            end = buf.rfind(b"\n", start, start + reach) + 1 or bound
        lines = buf.count(b"\n", start, end) + (buf[end - 1] != 10)
        if lines > max_events:
            guess = start + (end - start) * max_events // lines
            end = buf.rfind(b"\n", start, guess) + 1 or buf.find(b"\n", start, end) + 1
            lines = buf.count(b"\n", start, end)
            while lines > max_events:
                end = buf.rfind(b"\n", start, end - 1) + 1
                lines -= 1
        while lines < max_events and end < bound:
            end = buf.find(b"\n", end, bound) + 1 or bound
            lines += 1
        if newlines is not None:
            newlines.append(lines - (buf[end - 1] != 10))
        yield end
        per_line = (end - start) // lines + 1
        start = end


def too_long(rel: str, at: int, head: bytes, limit: int, line: int = 0) -> RawEvent:
    where = f"{rel}:line {line}:{at}" if line else f"{rel}:{at}"
    return RawEvent(
        head, where, error=f"record longer than max_line_bytes ({limit}); first bytes kept"
    )
