"""PNG files written byte by byte (PIL writes no 16-bit colour PNG, nor a damaged one): the chunks of the PNG
specification (IHDR, tRNS, IDAT, IEND, each with its CRC), so a test knows every sample value the file holds."""

from __future__ import annotations

import struct
import zlib

import numpy as np

GREY, RGB, PALETTE, GREY_ALPHA, RGBA = 0, 2, 3, 4, 6  # PNG colour types


def chunk(kind: bytes, body: bytes, crc: int | None = None) -> bytes:
    """One PNG chunk: length, type, body, CRC-32 of type and body (or `crc`, to write a wrong one)."""
    crc = zlib.crc32(kind + body) if crc is None else crc
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def png_bytes(samples: np.ndarray, colour_type: int, bit_depth: int, before_data: bytes = b"",
              data: bytes | None = None) -> bytes:
    """A PNG of `samples` (H x W, or H x W x channels; uint8 for 8 bits, uint16 for 16, stored big-endian), every
    row unfiltered. `before_data`: chunks between IHDR and IDAT (tRNS, PLTE); `data`: the IDAT body instead of the
    compressed samples (a damaged body under a valid header)."""
    height, width = samples.shape[:2]
    stored = samples.astype(">u2" if bit_depth == 16 else np.uint8)
    rows = b"".join(b"\x00" + stored[y].tobytes() for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    body = zlib.compress(rows) if data is None else data
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + before_data + chunk(b"IDAT", body)
            + chunk(b"IEND", b""))


def damaged_body(good_png: bytes) -> bytes:
    """`good_png` with the compressed data of its (one) IDAT chunk turned to noise and its CRC made right again:
    the header reads, every checksum holds, and the pixels do not decode."""
    at = good_png.index(b"IDAT") - 4
    length = struct.unpack(">I", good_png[at:at + 4])[0]
    noise = bytes((7 * i + 3) % 256 for i in range(length))
    return good_png[:at] + chunk(b"IDAT", zlib.compress(b"")[:2] + noise[2:]) + good_png[at + 12 + length:]
