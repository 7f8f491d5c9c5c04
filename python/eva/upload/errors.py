"""The errors of an upload (``eva.upload``): each an ``UploadError`` whose one-line message names
the file, path or setting at fault."""

from __future__ import annotations


class UploadError(Exception):
    """The upload failed; the message names the file, path or setting at fault."""


class HostKeyError(UploadError):
    """The server's host key is unknown (and not accepted) or differs from known_hosts."""


class UploadInterrupted(UploadError):
    """The upload was cancelled; the staging directory is kept so it can be resumed."""
