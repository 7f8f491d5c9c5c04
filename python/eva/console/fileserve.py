"""Serving a file the console has just opened: the bytes come from that fd, never from a path.

Starlette's ``FileResponse`` opens its path again when it sends: a directory swapped for a link
between the console's check and that open would hand out a file outside the dataset. Here the
handler opens the file (``eva.dataset.fsafe.open_beneath``, on every request) and this response
reads the same fd with ``pread``, answers one byte range (``Range: bytes=a-b``, ``a-``, ``-n``;
a list of ranges gets the whole file, as HTTP allows) and closes the fd when done, also when
the client goes away.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from email.utils import formatdate
from typing import Literal

import anyio
import anyio.to_thread
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from eva.dataset.identity import stat_identity

CHUNK = 256 * 1024
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def byte_range(header: str | None, size: int) -> tuple[int, int] | Literal[False] | None:
    """The inclusive ``(first, last)`` byte range ``header`` asks of a file of ``size`` bytes;
    None for the whole file (no header, several ranges, a form this server does not read), False
    when the range lies outside the file (416)."""
    if not header:
        return None
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        return None
    first, last = match.group(1), match.group(2)
    if not first and not last:
        return None
    if not first:  # the last n bytes
        n = int(last)
        return (max(size - n, 0), size - 1) if n > 0 and size > 0 else False
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or (last and int(last) < start):
        return False
    return start, end


class OpenFileResponse(Response):
    """The regular file open as ``fd`` (this response owns it and closes it), or one range of
    it for a ``Range`` request."""

    def __init__(
        self,
        fd: int,
        range_header: str | None,
        *,
        media_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.fd = fd
        self.background = None
        st = os.fstat(fd)
        size = st.st_size
        wanted = byte_range(range_header, size)
        base = {
            "accept-ranges": "bytes",
            "last-modified": formatdate(st.st_mtime, usegmt=True),
            # the file's whole identity (eva.dataset.identity): a rewrite in place that puts the
            # size, mtime and inode back still changes the tag a client's cached copy is kept by
            "etag": '"{}"'.format("-".join(f"{v:x}" for v in stat_identity(st))),
            **(headers or {}),
        }
        if wanted is False:
            self.status_code, self.first, self.length = 416, 0, 0
            base["content-range"] = f"bytes */{size}"
        elif wanted is None:
            self.status_code, self.first, self.length = 200, 0, size
        else:
            first, last = wanted
            self.status_code, self.first, self.length = 206, first, last - first + 1
            base["content-range"] = f"bytes {first}-{last}/{size}"
        base["content-length"] = str(self.length)
        self.media_type = media_type
        self.body = b""
        self.init_headers(base)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            if scope.get("method") == "HEAD" or self.length == 0:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    message: Message = {"type": ""}
                    while message["type"] != "http.disconnect":
                        message = await receive()
                    group.cancel_scope.cancel()  # the client left: stop reading the file

                group.start_soon(watch)
                await self._send_body(send)
                group.cancel_scope.cancel()
        finally:
            os.close(self.fd)

    async def _send_body(self, send: Send) -> None:
        offset, remaining = self.first, self.length
        while remaining > 0:
            chunk = await anyio.to_thread.run_sync(os.pread, self.fd, min(CHUNK, remaining), offset)
            if not chunk:  # the file shrank since fstat: the response ends short
                raise OSError(f"file shrank while served at byte {offset}")
            offset += len(chunk)
            remaining -= len(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": remaining > 0})
