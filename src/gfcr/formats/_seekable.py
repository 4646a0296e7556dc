"""Read one line at a byte offset of a zstd file written in the seekable format.

The seekable format (facebook/zstd, ``contrib/seekable_format/zstd_seekable_compression_format.md``)
is ordinary zstd frames followed by a skippable frame whose last 9 bytes are the footer
``Number_Of_Frames (u32 LE) | Seek_Table_Descriptor (u8, bit 7: checksums) | 0x8F92EAB1 (u32 LE)``,
preceded by one entry per frame, ``Compressed_Size (u32) | Decompressed_Size (u32) [| Checksum (u32)]``.
So a reader decompresses only the frames that hold the wanted bytes. A zstd file without that
table is decompressed whole (once per :class:`SealedReader`). ``zstandard`` is optional
(``pip install 'gfcr[zstd]'``): without it :func:`need_zstandard` names the file and the fix.
"""

from __future__ import annotations

import bisect
import io
from pathlib import Path
from typing import Any

SEEKABLE_MAGIC = 0x8F92EAB1
SKIPPABLE_MAGIC = 0x184D2A5E


class ZstdUnavailable(RuntimeError):
    """A sealed chunk was met and ``zstandard`` is not installed."""


def need_zstandard(path: Path) -> Any:
    """The ``zstandard`` module, or :class:`ZstdUnavailable` with a one-line fix."""
    try:
        import zstandard
    except ImportError as e:
        raise ZstdUnavailable(f"{path} is a sealed zstd chunk and the 'zstandard' package is not installed: "
                              "pip install 'gfcr[zstd]' (or zstandard>=0.22)") from e
    return zstandard


def seek_table(fh: io.BufferedReader) -> list[tuple[int, int, int, int]] | None:
    """``[(compressed start, compressed size, decompressed start, decompressed size)]`` per frame,
    or None when the file ends without a seek table. Raises ValueError for a table that does not fit."""
    fh.seek(0, io.SEEK_END)
    size = fh.tell()
    if size < 17:
        return None
    fh.seek(size - 9)
    foot = fh.read(9)
    if int.from_bytes(foot[5:9], "little") != SEEKABLE_MAGIC:
        return None
    n = int.from_bytes(foot[0:4], "little")
    esize = 12 if foot[4] & 0x80 else 8
    start = size - 9 - n * esize
    if start < 8:
        raise ValueError(f"seek table of {n} frames does not fit in {size} bytes")
    fh.seek(start - 8)
    head = fh.read(8)
    if int.from_bytes(head[0:4], "little") & 0xFFFFFFF0 != SKIPPABLE_MAGIC & 0xFFFFFFF0:
        raise ValueError("seek table is not in a skippable frame")
    table = fh.read(n * esize)
    frames, c, d = [], 0, 0
    for k in range(n):
        e = table[k * esize:(k + 1) * esize]
        cs, ds = int.from_bytes(e[0:4], "little"), int.from_bytes(e[4:8], "little")
        frames.append((c, cs, d, ds))
        c, d = c + cs, d + ds
    if c > start - 8:
        raise ValueError("seek table frames overrun the file")
    return frames


class SealedReader:
    """Lines at decompressed offsets of one sealed chunk; frames decompressed on demand, kept."""

    def __init__(self, path: Path):
        self.path = path
        self.zstd = need_zstandard(path)
        self.fh = open(path, "rb")  # noqa: SIM115 - closed by close()
        self.frames = seek_table(self.fh)
        self.starts = [f[2] for f in self.frames] if self.frames is not None else []
        self.cache: dict[int, bytes] = {}
        self.whole: bytes | None = None

    def _frame(self, k: int) -> bytes:
        if k not in self.cache:
            c, cs, _d, ds = self.frames[k]  # type: ignore[index]
            self.fh.seek(c)
            self.cache = {k: self.zstd.ZstdDecompressor().decompress(self.fh.read(cs), max_output_size=max(ds, 1))}
        return self.cache[k]

    def line_at(self, offset: int) -> bytes:
        """The bytes from ``offset`` to the next newline (included), or to the end of the data."""
        if self.frames is None:
            if self.whole is None:
                self.fh.seek(0)
                self.whole = self.zstd.ZstdDecompressor().stream_reader(self.fh, read_across_frames=True).read()
            end = self.whole.find(b"\n", offset)
            return self.whole[offset:] if end < 0 else self.whole[offset:end + 1]
        k = bisect.bisect_right(self.starts, offset) - 1
        if k < 0 or offset >= self.frames[-1][2] + self.frames[-1][3]:
            return b""
        out, pos = [], offset - self.frames[k][2]
        while k < len(self.frames):
            data = self._frame(k)
            end = data.find(b"\n", pos)
            if end >= 0:
                out.append(data[pos:end + 1])
                break
            out.append(data[pos:])  # a line across a frame boundary: the next frame holds the rest
            k, pos = k + 1, 0
        return b"".join(out)

    def close(self) -> None:
        self.fh.close()
