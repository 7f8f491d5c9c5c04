"""Canary for the paramiko internals eva's pipelined SFTP writes use (eva.upload.paramiko_compat).

If a paramiko release renames or removes one of them, the first test fails naming it, before any
upload runs into an AttributeError half-way through a transfer.
"""

from __future__ import annotations

import paramiko
import pytest

from eva.upload import paramiko_compat
from eva.upload.paramiko_compat import WriteAcks, missing_private_apis

pytestmark = pytest.mark.kernel_independent


def test_installed_paramiko_has_every_private_api_eva_uses() -> None:
    missing = missing_private_apis()
    assert not missing, (
        "eva.upload.paramiko_compat relies on paramiko internals the installed paramiko lacks: "
        + ", ".join(missing)
        + "; adapt paramiko_compat.py (and the paramiko bound in pyproject.toml)"
    )


@pytest.mark.parametrize("name", ["_async_request", "_read_response"])
def test_the_canary_names_a_missing_attribute(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.delattr(paramiko.SFTPClient, name)
    missing = missing_private_apis()
    assert any(item.startswith(f"paramiko.SFTPClient.{name} ") for item in missing), missing
    assert all(f"(paramiko {paramiko.__version__})" in item for item in missing)


def test_the_canary_notices_a_renamed_response_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paramiko_compat, "RESPONSE_HOOK", "_renamed_hook")
    assert missing_private_apis() == [
        "paramiko.SFTPClient._read_response calling <fileobj>._renamed_hook "
        f"(paramiko {paramiko.__version__})"
    ]


def test_write_acks_count_replies_and_keep_the_first_error() -> None:
    def status(code: int, text: str = "") -> paramiko.Message:
        msg = paramiko.Message()
        msg.add_int(code)
        msg.add_string(text)
        msg.rewind()
        return msg

    acks = WriteAcks()
    acks.pending = 3
    respond = getattr(acks, paramiko_compat.RESPONSE_HOOK)  # what paramiko calls
    respond(paramiko.sftp.CMD_STATUS, status(paramiko.sftp.SFTP_OK), 1)
    assert (acks.pending, acks.error) == (2, None)
    respond(paramiko.sftp.CMD_STATUS, status(4, "disk full"), 2)
    respond(paramiko.sftp.CMD_STATUS, status(4, "later failure"), 3)
    assert (acks.pending, acks.error) == (0, "disk full")
