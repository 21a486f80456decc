"""A lean HTTP/1.1 client connection for the closed loop: one persistent connection per lane,
one request at a time, the response body handed on as it arrives.

Built on asyncio.Protocol so a streamed token costs one `data_received` call and no coroutine
switch: about 6 us of client CPU per token against about 17 us through aiohttp's streams,
which at 50,000 tokens/s is the difference between a client loop that is mostly idle and one
that is mostly busy, and so between small and large measured-TTFT errors (docs/LOADGEN.md).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from urllib.parse import urlsplit

# a piece of the body, the perf_counter it arrived at, and the response's status
OnBody = Callable[[bytes, float, int], None]


class ResponseError(ConnectionError):
    """The connection failed or closed before the response was complete, or it was not HTTP."""


class Endpoint:
    def __init__(self, url: str):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"{url!r}: only http:// and https:// URLs can be driven")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.path = parts.path or "/"
        host = self.host if parts.port is None else f"{self.host}:{parts.port}"
        self.head = f"POST {self.path} HTTP/1.1\r\nHost: {host}\r\n".encode()


class Connection(asyncio.Protocol):
    def __init__(self):
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future | None = None
        self.on_body: OnBody | None = None
        self.last_data = 0.0
        self._reset()

    def _reset(self) -> None:
        self._head = b""
        self._in_body = False
        self.status = 0
        self._chunked = False
        self._left: int | None = None  # body bytes (content-length) or chunk bytes left
        self._chunk_buf = b""
        self._crlf_next = False
        self._close_after = False

    # --- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        now = self.last_data = time.perf_counter()
        if self.done is None or self.done.done():
            return  # nothing asked: a stray byte after a response is ignored
        if not self._in_body:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            data = self._head[end + 4 :]
            if not self._parse_head(self._head[:end]):
                return
        if self._chunked:
            self._chunks(data, now)
        elif data:
            if self._left is not None:
                data = data[: self._left]
                self._left -= len(data)
            self.on_body(data, now, self.status)
            if self._left == 0:
                self._finish()

    def connection_lost(self, exc) -> None:
        self.transport = None
        if self.done is not None and not self.done.done():
            if self._in_body and not self._chunked and self._left is None:
                self.done.set_result(self.status)  # a body delimited by the close
            else:
                self.done.set_exception(
                    ResponseError("the server closed the connection mid-response")
                )

    # --- parsing -------------------------------------------------------------------------
    def _parse_head(self, head: bytes) -> bool:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            self.done.set_exception(ResponseError(f"not an HTTP response: {lines[0][:80]!r}"))
            self.transport.close()
            return False
        self.status = int(parts[1])
        self._close_after = parts[0] == b"HTTP/1.0"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length":
                self._left = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value:
                self._chunked = True
            elif name == b"connection":
                self._close_after = value == b"close"
        self._in_body = True
        if self._chunked:
            self._left = None
        elif self._left == 0:
            self._finish()
        return True

    def _chunks(self, data: bytes, now: float) -> None:
        buf = self._chunk_buf + data if self._chunk_buf else data
        self._chunk_buf = b""
        while buf:
            if self._left is None:  # a chunk-size line, or the CRLF that ends a chunk's data
                end = buf.find(b"\r\n")
                if end < 0:
                    self._chunk_buf = buf
                    return
                line, buf = buf[:end], buf[end + 2 :]
                if self._crlf_next:
                    self._crlf_next = False
                    continue
                size = int(line.split(b";", 1)[0], 16)
                if size == 0:
                    self._finish()  # trailers, if any, are not read: the connection closes
                    return
                self._left = size
            piece, buf = buf[: self._left], buf[self._left :]
            self._left -= len(piece)
            self.on_body(piece, now, self.status)
            if self._left == 0:
                self._left, self._crlf_next = None, True

    def _finish(self) -> None:
        status = self.status
        if self._close_after and self.transport is not None:
            self.transport.close()
        self._reset()
        self.done.set_result(status)


class Lane:
    """A lane's connection, opened on first use and again after the server closes it."""

    def __init__(self, endpoint: Endpoint, connect_timeout_s: float = 30.0):
        self.endpoint = endpoint
        self.connect_timeout_s = connect_timeout_s
        self.conn: Connection | None = None
        self.last_status = 0  # the status line of the last response, even one cut short

    async def post(self, body: bytes, headers: bytes, on_body: OnBody, timeout_s: float) -> int:
        """Send one POST; `on_body` gets the body as it arrives; returns the status. Raises
        OSError (connect), ResponseError, or TimeoutError when no byte came for timeout_s."""
        loop = asyncio.get_running_loop()
        self.last_status = 0  # a connection refused has no status, not the last request's
        if self.conn is None or self.conn.transport is None or self.conn.transport.is_closing():
            ep = self.endpoint
            _, self.conn = await asyncio.wait_for(
                loop.create_connection(Connection, ep.host, ep.port, ssl=ep.ssl),
                self.connect_timeout_s,
            )
        conn = self.conn
        if conn.transport is None:  # lost before this lane resumed: a server dying as it accepted
            self.conn = None
            raise ResponseError("the server closed the connection as it opened")
        conn.done, conn.on_body, conn.last_data = loop.create_future(), on_body, time.perf_counter()
        conn.transport.write(
            b"".join((self.endpoint.head, headers, b"Content-Length: %d\r\n\r\n" % len(body), body))
        )
        try:
            while True:  # a timeout is `timeout_s` with no byte, not a total
                left = conn.last_data + timeout_s - time.perf_counter()
                if left <= 0:
                    raise TimeoutError(f"no data for {timeout_s:g} s")
                try:
                    # not asyncio.wait_for: before Python 3.12 it returns the result, and
                    # loses the cancellation, when the response completes as the lane is
                    # cancelled; flat out (bench calibrate) a lane then ran on past its stop
                    async with asyncio.timeout(left):
                        status = await asyncio.shield(conn.done)
                except TimeoutError:
                    continue
                self.last_status = status
                return status
        except BaseException:
            self.last_status = conn.status
            if not conn.done.done():
                conn.done.cancel()  # nobody waits for it any more
            elif not conn.done.cancelled():
                conn.done.exception()  # retrieved: it is the one being raised
            self.close()  # a half-read response leaves the connection unusable
            raise

    def close(self) -> None:
        if self.conn is not None and self.conn.transport is not None:
            self.conn.transport.close()
        self.conn = None
