"""What crosses between the trusted test process and the sandbox: frames on a socket.

Length-prefixed frames, optionally carrying file descriptors, read with a deadline (a
worker that stops half-way through a frame cannot hang the trusted side). Both sides import
this module (the sandbox its copy in the scratch tree); what the frames hold is the
business of :mod:`grading.sandbox.wire`.
"""

from __future__ import annotations

import select
import socket
import struct
import time

HEADER = struct.Struct("!Q")
MAX_FRAME = 1 << 30  # 1 GiB: far above any lab's arrays, far below a memory bomb
MAX_REPLY = 64 << 20  # a worker's reply to the trusted side: 64 MiB, checked before reading it
MAX_FDS = 8


class FrameError(Exception):
    """The peer sent something that is not a frame (too large, or cut short)."""


# ---- framing ---------------------------------------------------------------------------------


def send_frame(sock: socket.socket, payload: bytes, fds: list[int] | tuple[int, ...] = ()) -> None:
    """One frame: an 8-byte length, then the payload; ``fds`` ride with the length."""
    header = HEADER.pack(len(payload))
    if fds:
        sent = socket.send_fds(sock, [header], list(fds))
        if sent < len(header):
            sock.sendall(header[sent:])
    elif len(payload) < 1 << 20:  # one system call for the usual small frame
        sock.sendall(header + payload)
        return
    else:
        sock.sendall(header)
    if payload:
        sock.sendall(payload)


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


def _wait_readable(sock: socket.socket, deadline: float | None) -> None:
    while True:
        left = _remaining(deadline)
        ready, _, _ = select.select([sock], [], [], left)
        if ready:
            return


def recv_frame(
    sock: socket.socket, deadline: float | None = None, max_size: int = MAX_FRAME,
    max_fds: int = 0, alone: bool = False,
) -> tuple[bytes, list[int]]:
    """Read one frame before ``deadline`` (``time.monotonic()``); ``TimeoutError`` after it,
    ``EOFError`` when the peer closed, ``FrameError`` for a frame larger than ``max_size``.
    ``alone``: the peer never sends a frame before this one is read (a worker's strict
    request and reply), so the frame may be read in one go."""
    if alone and not max_fds:
        return _recv_plain(sock, deadline, max_size), []
    fds: list[int] = []
    header = b""
    while len(header) < HEADER.size:
        _wait_readable(sock, deadline)
        if max_fds and not header:
            chunk, got, _, _ = socket.recv_fds(sock, HEADER.size, max_fds)
            fds.extend(got)
        else:
            chunk = sock.recv(HEADER.size - len(header))
        if not chunk:
            for fd in fds:
                _close(fd)
            raise EOFError("the peer closed the connection")
        header += chunk
    (size,) = HEADER.unpack(header)
    if size > max_size:
        for fd in fds:
            _close(fd)
        raise FrameError(f"a frame of {size} bytes is larger than the {max_size}-byte limit")
    buf = bytearray(size)
    view = memoryview(buf)
    got_bytes = 0
    while got_bytes < size:
        _wait_readable(sock, deadline)
        n = sock.recv_into(view[got_bytes:], size - got_bytes)
        if n == 0:
            raise EOFError("the peer closed the connection in the middle of a frame")
        got_bytes += n
    return bytes(buf), fds


def _recv_plain(sock: socket.socket, deadline: float | None, max_size: int) -> bytes:
    """:func:`recv_frame` without descriptors: a frame usually arrives in one read."""
    data = bytearray()
    size = None
    while size is None or len(data) < HEADER.size + size:
        _wait_readable(sock, deadline)
        want = 1 << 16 if size is None else HEADER.size + size - len(data)
        chunk = sock.recv(want)
        if not chunk:
            raise EOFError("the peer closed the connection")
        data += chunk
        if size is None and len(data) >= HEADER.size:
            (size,) = HEADER.unpack_from(data)
            if size > max_size:
                raise FrameError(f"a frame of {size} bytes is larger than the {max_size}-byte "
                                 "limit")
    if len(data) > HEADER.size + size:
        raise FrameError("the peer sent more than one frame at once")
    return bytes(data[HEADER.size:])


def _close(fd: int) -> None:
    import os

    try:
        os.close(fd)
    except OSError:
        pass
