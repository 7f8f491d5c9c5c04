"""The paramiko internals eva's pipelined SFTP writes rely on: the only module that touches them.

paramiko's public ``SFTPFile.write`` waits for each reply, and its pipelined mode
(``set_pipelined``) drops the replies of failed writes. To keep several WRITE requests in flight
and still check the server's status reply of every one, eva sends each request with
``SFTPClient._async_request`` and collects replies with ``SFTPClient._read_response``, which hands
each reply to the ``_async_response(t, msg, num)`` method of the object the request was sent
with (:class:`WriteAcks`). These names are private to paramiko and may change in any release:
``pyproject.toml`` bounds the paramiko version, and ``tests/test_upload_paramiko_compat.py``
(:func:`missing_private_apis`) fails naming the attribute that a new paramiko no longer has.
"""

from __future__ import annotations

import inspect
from typing import Protocol, cast

import paramiko
from paramiko.sftp import CMD_STATUS, CMD_WRITE, SFTP_OK, int64

# (owner, attribute) pairs that must exist for send_write / read_response to work.
PRIVATE_APIS = (
    (paramiko.SFTPClient, "_async_request"),
    (paramiko.SFTPClient, "_read_response"),
)
# What _read_response calls on the object a request was sent with (WriteAcks below).
RESPONSE_HOOK = "_async_response"


class SFTPClientInternals(Protocol):
    """The signatures of the private ``SFTPClient`` methods above (as in paramiko 5.x), which
    paramiko's type stubs leave out."""

    def _async_request(self, fileobj: object, t: int, *args: object) -> int: ...

    def _read_response(self, waitfor: int | None = None) -> object: ...


class WriteAcks:
    """Collects the status replies to pipelined WRITE requests of one file.

    ``pending`` counts the requests sent and not answered yet; ``error`` is the first failure
    the server reported (or an unexpected reply type)."""

    def __init__(self) -> None:
        self.pending = 0
        self.error: str | None = None

    def _async_response(self, t: int, msg: paramiko.Message, num: int) -> None:
        # Called by paramiko's SFTPClient._read_response (the name is paramiko's, not ours).
        self.pending -= 1
        if t != CMD_STATUS:
            self.error = self.error or f"unexpected SFTP reply type {t} to WRITE"
            return
        code = msg.get_int()
        if code != SFTP_OK and self.error is None:
            self.error = msg.get_text() or f"SFTP status {code}"


def send_write(
    sftp: paramiko.SFTPClient, acks: WriteAcks, handle: bytes, offset: int, data: memoryview
) -> None:
    """Send one WRITE of ``data`` at ``offset`` without waiting for its reply (counted in
    ``acks.pending``). ``Message.add_string`` copies ``data`` into the packet, so the caller may
    reuse its buffer at once."""
    cast(SFTPClientInternals, sftp)._async_request(acks, CMD_WRITE, handle, int64(offset), data)
    acks.pending += 1


def read_response(sftp: paramiko.SFTPClient) -> None:
    """Wait for the next reply on ``sftp`` and hand it to the ``WriteAcks`` it belongs to."""
    cast(SFTPClientInternals, sftp)._read_response()


def missing_private_apis() -> list[str]:
    """The paramiko internals above that the installed paramiko lacks (``[]`` when all are
    there), each as ``paramiko.<Owner>.<name>`` with the installed version."""
    missing = [
        f"paramiko.{owner.__name__}.{name}"
        for owner, name in PRIVATE_APIS
        if not callable(getattr(owner, name, None))
    ]
    read = getattr(paramiko.SFTPClient, "_read_response", None)
    if read is not None:
        try:
            source = inspect.getsource(read)
        except (OSError, TypeError):  # no source installed: only the attributes can be checked
            source = RESPONSE_HOOK
        if RESPONSE_HOOK not in source:
            missing.append(f"paramiko.SFTPClient._read_response calling <fileobj>.{RESPONSE_HOOK}")
    version = getattr(paramiko, "__version__", "?")
    return [f"{item} (paramiko {version})" for item in missing]
