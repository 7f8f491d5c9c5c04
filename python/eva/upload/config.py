"""The ``collection.storage.sftp`` table of the TOML config (docs/config.md), parsed and validated.

The rest of ``collection`` belongs to ``eva.config``; this module reads only the upload backend so
that uploading does not depend on (or re-validate) the capture settings. Every error names the key.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eva.config import ConfigError, collection_table, read_toml

KEY = "collection.storage.sftp"
DEFAULT_PORT = 22
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
_KNOWN_KEYS = frozenset({"host", "port", "user", "identity_file", "remote_dir", "known_hosts"})


class UploadConfigError(ConfigError):
    """The upload backend configuration is missing a key or holds an invalid value (a
    ``ConfigError``: one type to catch for every config problem)."""


@dataclass(frozen=True)
class SftpConfig:
    host: str
    remote_dir: str
    port: int = DEFAULT_PORT
    user: str | None = None
    identity_file: Path | None = None
    # Beyond host/port/user/identity_file/remote_dir: where host keys are checked and recorded (OpenSSH's default file).
    known_hosts: Path = Path(DEFAULT_KNOWN_HOSTS).expanduser()

    def target_path(self, dataset_name: str) -> str:
        """``<remote_dir>/<dataset-name>``: the preferred (first-choice) remote directory."""
        return posixpath.join(self.remote_dir, dataset_name)

    def describe(self) -> str:
        user = f"{self.user}@" if self.user else ""
        return f"sftp://{user}{self.host}:{self.port}{self.remote_dir}"


def _has_control_chars(text: str) -> bool:
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def validate_remote_dir(value: object, key: str = f"{KEY}.remote_dir") -> str:
    """Absolute and canonical: starts with '/', no '.'/'..'/empty parts, no trailing '/', not '/'."""
    if not isinstance(value, str) or not value:
        raise UploadConfigError(f"{key} must be a non-empty string, got {value!r}")
    if _has_control_chars(value):
        raise UploadConfigError(f"{key} {value!r} contains control characters")
    if not value.startswith("/"):
        raise UploadConfigError(f"{key} {value!r} must be an absolute path (start with '/')")
    if value == "/" or value.strip("/") == "":
        raise UploadConfigError(f"{key} must not be the root directory '/'")
    if value.endswith("/"):
        raise UploadConfigError(f"{key} {value!r} must not end with '/'")
    parts = value[1:].split("/")
    if any(part == "" for part in parts):
        raise UploadConfigError(f"{key} {value!r} contains an empty part ('//')")
    if any(part in (".", "..") for part in parts):
        raise UploadConfigError(f"{key} {value!r} must be canonical: no '.' or '..' parts")
    return value


def _optional_str(table: dict[str, Any], name: str) -> str | None:
    value = table.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise UploadConfigError(f"{KEY}.{name} must be a non-empty string, got {value!r}")
    if _has_control_chars(value):
        raise UploadConfigError(f"{KEY}.{name} {value!r} contains control characters")
    return value


def parse_sftp_config(
    collection: dict[str, Any], *, base_dir: Path | None = None
) -> SftpConfig | None:
    """Read ``storage.sftp`` from the raw ``collection`` table; None when no backend is configured.

    Relative ``identity_file`` / ``known_hosts`` paths are taken relative to ``base_dir`` (the
    config file's directory), like every other path in the config.
    """
    storage = collection.get("storage")
    if storage is None:
        return None
    if not isinstance(storage, dict):
        raise UploadConfigError(f"collection.storage must be a table, got {type(storage).__name__}")
    table = storage.get("sftp")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise UploadConfigError(f"{KEY} must be a table, got {type(table).__name__}")
    unknown = sorted(set(table) - _KNOWN_KEYS)
    if unknown:
        raise UploadConfigError(
            f"{KEY}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_KNOWN_KEYS))})"
        )

    host = table.get("host")
    if not isinstance(host, str) or not host.strip():
        raise UploadConfigError(f"{KEY}.host is required (a host name or address)")
    if _has_control_chars(host) or any(c.isspace() for c in host) or host.startswith("-"):
        raise UploadConfigError(f"{KEY}.host {host!r} is not a valid host name")

    port = table.get("port", DEFAULT_PORT)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise UploadConfigError(f"{KEY}.port must be an integer 1-65535, got {port!r}")

    if "remote_dir" not in table:
        raise UploadConfigError(f"{KEY}.remote_dir is required (an absolute remote directory)")
    remote_dir = validate_remote_dir(table["remote_dir"])

    base = Path(base_dir) if base_dir is not None else Path.cwd()

    def local_path(name: str) -> Path | None:
        text = _optional_str(table, name)
        if text is None:
            return None
        path = Path(text).expanduser()
        return path if path.is_absolute() else base / path

    identity_file = local_path("identity_file")
    known_hosts = local_path("known_hosts") or Path(DEFAULT_KNOWN_HOSTS).expanduser()
    return SftpConfig(
        host=host,
        port=port,
        user=_optional_str(table, "user"),
        identity_file=identity_file,
        remote_dir=remote_dir,
        known_hosts=known_hosts,
    )


def read_config_file(path: Path) -> dict[str, Any]:
    """The ``collection`` table of a TOML config file (errors name the file)."""
    try:
        return collection_table(read_toml(path), where=str(path))
    except ConfigError as e:
        raise UploadConfigError(str(e)) from None


def load_upload_config(path: Path) -> tuple[dict[str, Any], SftpConfig | None]:
    """The raw ``collection`` table of a config file and its parsed ``storage.sftp`` (None when
    not configured); every error names the file."""
    path = Path(path)
    collection = read_config_file(path)
    try:
        return collection, parse_sftp_config(collection, base_dir=path.resolve().parent)
    except UploadConfigError as e:
        raise UploadConfigError(f"{path}: {e}") from None
