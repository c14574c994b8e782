"""Messages between the local backend and its slot supervisors: length-prefixed JSON on pipes.

A frame is a 4-byte big-endian length, then that many bytes of UTF-8 JSON. Binary contents
(stdin, files) travel base64-encoded inside the JSON.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 1 << 30


def write_frame(fd: int, message: dict[str, Any]) -> None:
    """Send one message; blocks until the pipe has taken all of it."""
    body = json.dumps(message).encode()
    data = memoryview(HEADER.pack(len(body)) + body)
    while data:
        data = data[os.write(fd, data) :]


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes | None:
    chunks = []
    while size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError("no reply from the sandbox supervisor in time")
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int, deadline: float | None = None) -> dict[str, Any] | None:
    """Receive one message, or None if the other side closed the pipe.

    Raises:
        TimeoutError: `deadline` (a `time.monotonic()` value) passed first.
        ValueError: the frame is malformed.
    """
    header = _read_exactly(fd, HEADER.size, deadline)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {size} bytes is larger than {MAX_FRAME_BYTES}")
    body = _read_exactly(fd, size, deadline)
    if body is None:
        return None
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ValueError("a frame must hold a JSON object")
    return message
