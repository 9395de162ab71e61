"""The wire format of a stream connection: how its bytes split into frames (one event each),
within the frame size limit, and how the server's replies are written in the same framing.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["REJECTED_BIT", "Deframer", "Frame", "ack_reply", "reject_reply"]

REJECTED_BIT = 1 << 63
"""Set in a length-prefixed reply that reports a rejected frame rather than an ack."""


@dataclass(slots=True)
class Frame:
    """One frame: the event's bytes, or with ``error`` set, the first bytes of a bad frame."""

    payload: bytes
    error: str | None = None


class Deframer:
    """Splits a byte stream into frames, holding at most one unfinished frame.

    Frames are lines ending in ``\\n`` (``framing = "lines"``) or a 4-byte big-endian length
    followed by that many bytes (``framing = "length-prefixed"``). A frame longer than
    ``max_frame`` comes out as an error frame holding its first bytes, and the stream goes on
    with the next frame; a frame left unfinished when the stream ends is an error frame too (a
    cut line may still be valid JSON, so it is never taken as an event).
    """

    def __init__(self, framing: str, max_frame: int) -> None:
        self.lines = framing == "lines"
        self.max = max_frame
        self.buf = bytearray()
        self.head: bytearray | None = None  # first bytes of an oversized frame being skipped
        self.size = 0  # that frame's length: announced (length-prefixed) or seen so far (lines)
        self.skip = 0  # length-prefixed: bytes of that frame still to skip
        self.scanned = 0  # lines: bytes at the start of buf already searched for a newline

    def partial(self) -> bool:
        """True while a frame has begun and not ended."""
        return bool(self.buf) or self.head is not None

    def feed(self, data: bytes) -> list[Frame]:
        """The frames that ``data`` completes, in order."""
        self.buf += data
        out: list[Frame] = []
        if self.lines:
            self._lines(out)
        else:
            self._prefixed(out)
        return out

    def _too_long(self, head: bytes | bytearray, size: int) -> Frame:
        return Frame(
            bytes(head),
            f"frame of {size} bytes is over max_frame_bytes ({self.max}); first bytes kept",
        )

    def _lines(self, out: list[Frame]) -> None:
        buf, start = self.buf, 0
        # The bytes kept from the feeds before hold no newline: searched once, not at each feed
        # (a long frame in small reads would cost its length times the reads).
        at = self.scanned
        while (nl := buf.find(b"\n", at)) >= 0:
            if self.head is not None:
                out.append(self._too_long(self.head, self.size + nl - start))
                self.head = None
            elif nl - start > self.max:
                out.append(self._too_long(buf[start : start + self.max], nl - start))
            else:
                out.append(Frame(bytes(buf[start:nl])))
            start = at = nl + 1
        del buf[:start]
        self.scanned = len(buf)
        if self.head is not None:
            self.size += len(buf)
            buf.clear()
        elif len(buf) > self.max:
            self.head, self.size = buf[: self.max], len(buf)
            buf.clear()
        if not buf:
            self.scanned = 0

    def _prefixed(self, out: list[Frame]) -> None:
        buf, pos = self.buf, 0
        while True:
            if self.head is not None:
                n = min(self.skip, len(buf) - pos)
                self.head += buf[pos : pos + min(n, self.max - len(self.head))]
                pos += n
                self.skip -= n
                if self.skip:
                    break
                out.append(self._too_long(self.head, self.size))
                self.head = None
                continue
            if len(buf) - pos < 4:
                break
            (size,) = struct.unpack_from(">I", buf, pos)
            pos += 4
            if size > self.max:
                self.head, self.size, self.skip = bytearray(), size, size
                continue
            if len(buf) - pos < size:
                pos -= 4
                break
            out.append(Frame(bytes(buf[pos : pos + size])))
            pos += size
        del buf[:pos]

    def end(self, why: str) -> Frame | None:
        """The unfinished frame, if any, as a dead letter (the connection ended or stalled)."""
        if self.head is not None:
            frame = self._too_long(self.head, self.size)
            self.head = None
            self.buf.clear()
            self.scanned = 0
            return frame
        if not self.buf:
            return None
        got = len(self.buf)
        body = self.buf if self.lines or got <= 4 else self.buf[4:]
        frame = Frame(bytes(body[: self.max]), f"unfinished frame ({got} bytes): {why}")
        self.buf.clear()
        self.scanned = 0
        return frame


def ack_reply(framing: str, n: int) -> bytes:
    """The reply saying that every frame up to number ``n`` is durable: ``ACK <n>\\n`` for
    lines, an 8-byte big-endian ``n`` for length-prefixed framing."""
    return f"ACK {n}\n".encode() if framing == "lines" else _u64(n)


def reject_reply(framing: str, n: int, reason: str) -> bytes:
    """The reply saying that frame number ``n`` was rejected (and dead-lettered):
    ``ERR <n> <reason>\\n`` for lines, ``n`` with :data:`REJECTED_BIT` set for length-prefixed
    framing."""
    return f"ERR {n} {reason}\n".encode() if framing == "lines" else _u64(n | REJECTED_BIT)


def _u64(n: int) -> bytes:
    return n.to_bytes(8, "big")
