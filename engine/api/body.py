"""A request's body: read whole within a time, decoded from its Content-Encoding within a size
(docs/RELIABILITY.md fault 17).

aiohttp's own decoding is off (`auto_decompress=False`, connections.py): it answered a body
that was not what its encoding said with a traceback in the log, and an encoding it lacks
(br, zstd) with a plain-text 400 before any handler ran. Here each is a JSON 400 naming
Content-Encoding, and a decoded body is held to the same size as a plain one (no zip bomb).
"""

from __future__ import annotations

import asyncio
import zlib

from aiohttp import web

from engine.api.validate import ApiError, show

# Content-Encoding -> zlib's wbits: gzip, and deflate as RFC 9110 means it (zlib-wrapped)
# or as some clients send it (raw)
ENCODINGS = {"identity": None, "gzip": (31,), "deflate": (15, -15)}


async def read_body(request: web.Request, max_size: int, timeout_s: float) -> bytes:
    """The body, decoded: a 408 when it is not all there within `timeout_s`, a 413 over
    `max_size` bytes (before or after decoding), a 400 for an encoding not in ENCODINGS or a
    body that is not what its encoding says."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ENCODINGS:
        raise ApiError(
            400,
            f"Content-Encoding {show(encoding)} is not supported; send one of "
            f"{', '.join(ENCODINGS)}",
            "Content-Encoding",
        )
    try:
        async with asyncio.timeout(timeout_s):
            raw = await request.read()
    except TimeoutError:
        raise ApiError(
            408, f"the request body did not arrive whole within {timeout_s:g} s"
        ) from None
    wbits = ENCODINGS[encoding]
    return raw if wbits is None else _decoded(raw, encoding, wbits, max_size)


def _decoded(raw: bytes, encoding: str, wbits: tuple[int, ...], max_size: int) -> bytes:
    for bits in wbits:
        decoder = zlib.decompressobj(bits)
        try:
            body = decoder.decompress(raw, max_size + 1)
        except zlib.error:
            continue
        if len(body) > max_size:
            raise ApiError(413, f"request body too large once decoded (over {max_size} bytes)")
        if decoder.eof and not decoder.unused_data:
            return body
    raise ApiError(400, f"the body is not valid {encoding} data", "Content-Encoding")
