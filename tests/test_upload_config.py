"""``collection.storage.sftp`` parsing and validation (docs/config.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from eva.upload.config import (
    DEFAULT_PORT,
    UploadConfigError,
    load_upload_config,
    parse_sftp_config,
    validate_remote_dir,
)

pytestmark = pytest.mark.kernel_independent


def collection(**sftp: object) -> dict:
    return {"storage": {"sftp": sftp}}


def test_full_table_parses(tmp_path: Path) -> None:
    config = parse_sftp_config(
        collection(
            host="data.example.org",
            port=2222,
            user="robot",
            identity_file="keys/id_ed25519",
            remote_dir="/srv/datasets",
            known_hosts="/etc/eva/known_hosts",
        ),
        base_dir=tmp_path,
    )
    assert config is not None
    assert config.host == "data.example.org"
    assert config.port == 2222
    assert config.user == "robot"
    assert config.identity_file == tmp_path / "keys/id_ed25519"  # relative to the config file
    assert config.known_hosts == Path("/etc/eva/known_hosts")
    assert config.target_path("pick") == "/srv/datasets/pick"


def test_defaults() -> None:
    config = parse_sftp_config(collection(host="h", remote_dir="/data"))
    assert config is not None
    assert config.port == DEFAULT_PORT == 22
    assert config.user is None and config.identity_file is None
    assert config.known_hosts == Path("~/.ssh/known_hosts").expanduser()


@pytest.mark.parametrize("table", [{}, {"storage": {}}, {"storage": {"other": {}}}])
def test_no_backend_configured_is_none(table: dict) -> None:
    assert parse_sftp_config(table) is None


@pytest.mark.parametrize(
    "remote_dir, words",
    [
        ("data", "absolute"),
        ("/", "root"),
        ("//", "root"),
        ("/data/", "end with '/'"),
        ("/data/./x", "canonical"),
        ("/data/../etc", "canonical"),
        ("/..", "canonical"),
        ("/data//x", "empty part"),
        ("/data/\nx", "control"),
        ("/data/\x00", "control"),
        ("/data\x7f", "control"),
        ("", "non-empty"),
        (5, "non-empty string"),
    ],
)
def test_remote_dir_must_be_absolute_and_canonical(remote_dir: object, words: str) -> None:
    with pytest.raises(UploadConfigError) as info:
        parse_sftp_config(collection(host="h", remote_dir=remote_dir))
    assert "collection.storage.sftp.remote_dir" in str(info.value)
    assert words in str(info.value)


@pytest.mark.parametrize("good", ["/data", "/srv/eva data/sets", "/a/b.c/d_e-f"])
def test_canonical_remote_dirs_pass(good: str) -> None:
    assert validate_remote_dir(good) == good


@pytest.mark.parametrize(
    "table, key",
    [
        ({"remote_dir": "/d"}, "host"),
        ({"host": "", "remote_dir": "/d"}, "host"),
        ({"host": "-oProxyCommand=x", "remote_dir": "/d"}, "host"),
        ({"host": "a b", "remote_dir": "/d"}, "host"),
        ({"host": "h"}, "remote_dir"),
        ({"host": "h", "remote_dir": "/d", "port": 0}, "port"),
        ({"host": "h", "remote_dir": "/d", "port": 70000}, "port"),
        ({"host": "h", "remote_dir": "/d", "port": "22"}, "port"),
        ({"host": "h", "remote_dir": "/d", "port": True}, "port"),
        ({"host": "h", "remote_dir": "/d", "user": ""}, "user"),
        ({"host": "h", "remote_dir": "/d", "identity_file": 3}, "identity_file"),
        ({"host": "h", "remote_dir": "/d", "password": "x"}, "password"),
    ],
)
def test_invalid_values_name_their_key(table: dict, key: str) -> None:
    with pytest.raises(UploadConfigError) as info:
        parse_sftp_config(collection(**table))
    assert "collection.storage.sftp" in str(info.value)
    assert key in str(info.value)


def test_storage_must_be_tables() -> None:
    with pytest.raises(UploadConfigError, match="collection.storage must be a table"):
        parse_sftp_config({"storage": 3})
    with pytest.raises(UploadConfigError, match="collection.storage.sftp must be a table"):
        parse_sftp_config({"storage": {"sftp": "host"}})


def test_load_from_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "eva.toml"
    path.write_text(
        '[collection]\nlog_dir = "/tmp/logs"\n\n'
        '[collection.storage.sftp]\nhost = "127.0.0.1"\nport = 2022\n'
        'identity_file = "id_key"\nremote_dir = "/srv/up"\n'
    )
    _, config = load_upload_config(path)
    assert config is not None
    assert (config.host, config.port, config.remote_dir) == ("127.0.0.1", 2022, "/srv/up")
    assert config.identity_file == tmp_path / "id_key"


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(UploadConfigError, match="missing.toml: config file not found"):
        load_upload_config(missing)
    broken = tmp_path / "broken.toml"
    broken.write_text("[collection\n")
    with pytest.raises(UploadConfigError, match="broken.toml: invalid TOML"):
        load_upload_config(broken)
    bad = tmp_path / "bad.toml"
    bad.write_text('[collection.storage.sftp]\nhost = "h"\nremote_dir = "rel"\n')
    with pytest.raises(UploadConfigError, match=r"bad.toml: collection.storage.sftp.remote_dir"):
        load_upload_config(bad)
    no_collection = tmp_path / "empty.toml"
    no_collection.write_text("")
    with pytest.raises(UploadConfigError, match=r"no \[collection\] table"):
        load_upload_config(no_collection)
