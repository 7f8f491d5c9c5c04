"""The errors of an upload (``eva.upload``): each an ``UploadError`` whose one-line message names
the file, path or setting at fault."""

from __future__ import annotations


class UploadError(Exception):
    """The upload failed; the message names the file, path or setting at fault."""


class HostKeyError(UploadError):
    """The server's host key is unknown (and not accepted) or differs from known_hosts.

    ``state`` says which ("unknown", "changed", "revoked"; "" for other refusals); ``server`` is
    the known_hosts name and ``fingerprint`` the offered key's SHA-256 (so a page can show them)."""

    def __init__(
        self, message: str, *, state: str = "", server: str = "", fingerprint: str = ""
    ) -> None:
        super().__init__(message)
        self.state = state
        self.server = server
        self.fingerprint = fingerprint


class UploadInterrupted(UploadError):
    """The upload was cancelled; the staging directory is kept so it can be resumed."""
