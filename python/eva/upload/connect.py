"""SSH connections for an upload: host key checking against known_hosts and key authentication.

:class:`Connector` opens authenticated paramiko transports to one server, every one pinned to
the same verified host key. The host key is checked against ``known_hosts`` as OpenSSH does
(``@revoked`` entries refused, unparsable lines skipped); an unknown key is refused unless the
caller accepts new keys, and is then appended to ``known_hosts`` in place
(:func:`append_known_host`) after the first successful login. The console's first contact:
:func:`probe_host_key` shows the key and :func:`trust_host_key` records an unknown one. Authentication is by key only: the
configured identity file, else the keys of the running ssh-agent.
"""

from __future__ import annotations

import getpass
import os
import socket
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry

from eva.upload.config import SftpConfig
from eva.upload.errors import HostKeyError, UploadError

# Ciphers in order of preference: AES-GCM is the cheapest per byte in paramiko
# (bench/bench_upload.py measures the upload).
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr")


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


def host_key_state(
    key: paramiko.PKey, known: dict[str, paramiko.PKey], revoked: list[paramiko.PKey]
) -> str:
    """What known_hosts says of the server's key: "known", "unknown" (no key listed for this
    server), "changed" (another key listed, of this or another type) or "revoked"."""
    if any(key == bad for bad in revoked):
        return "revoked"
    if not known:
        return "unknown"
    return "known" if known.get(key.get_name()) == key else "changed"


def host_key_error(
    state: str, host: str, key: paramiko.PKey, known: dict[str, paramiko.PKey], path: Path
) -> HostKeyError:
    """The refusal of a key that is not "known" (its message advises the CLI's flag for an
    unknown key; the console offers its own trust step instead)."""
    if state == "revoked":
        text = f"host key {_fingerprint(key)} is marked @revoked in {path}; refusing to connect"
    elif state == "unknown":
        text = (
            f"unknown host key {_fingerprint(key)} (not in {path}); verify it and rerun with "
            "--accept-new-host-key"
        )
    elif key.get_name() in known:
        text = (
            f"host key {_fingerprint(key)} does NOT match {path}; refusing to connect (possible "
            "man-in-the-middle, or the server was reinstalled: fix known_hosts)"
        )
    else:
        text = (
            f"server offered a {key.get_name()} host key but {path} only lists "
            f"{', '.join(sorted(known))} for it"
        )
    return HostKeyError(f"{host}: {text}", state=state, server=host, fingerprint=key.fingerprint)


class Connector:
    """Opens authenticated transports to one server, all pinned to the same verified host key."""

    def __init__(
        self, config: SftpConfig, *, accept_new_host_key: bool, connect_timeout: float
    ) -> None:
        self.config = config
        self.accept_new_host_key = accept_new_host_key
        self.connect_timeout = connect_timeout
        self.host_name = known_hosts_name(config.host, config.port)
        self.pinned_key: paramiko.PKey | None = None
        self.new_key_to_record: paramiko.PKey | None = None
        self.host_key_recorded = False
        self.revoked_keys: list[paramiko.PKey] = []

    def known_keys(self) -> dict[str, paramiko.PKey]:
        """This host's keys from known_hosts (by key type); also collects ``@revoked`` keys.

        Read line by line, like OpenSSH: a line paramiko cannot parse (a ``@cert-authority``
        entry, an unknown key type, garbage) is skipped instead of making the file unusable."""
        path = self.config.known_hosts
        host_keys = paramiko.HostKeys()
        self.revoked_keys = []
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise HostKeyError(f"{path}: cannot read known_hosts ({e.strerror})") from None
        for lineno, raw_line in enumerate(text.splitlines(), 1):
            line = raw_line.strip()
            if not line or line.startswith("#"):
                continue
            marker = None
            if line.startswith("@"):
                marker, _, line = line.partition(" ")
            try:
                entry = HostKeyEntry.from_line(line.strip(), lineno)
            except Exception:  # InvalidHostKey, unknown key types, bad base64
                continue
            if entry is None or entry.key is None:
                continue
            if marker == "@revoked":
                self.revoked_keys.append(entry.key)
            elif marker is None:
                for name in entry.hostnames:
                    host_keys.add(name, entry.key.get_name(), entry.key)
        keys_by_type = host_keys.lookup(self.host_name)
        return dict(keys_by_type) if keys_by_type else {}

    def _check_host_key(self, key: paramiko.PKey, known: dict[str, paramiko.PKey]) -> None:
        if self.pinned_key is not None:
            if key != self.pinned_key:
                raise HostKeyError(f"{self.host_name}: host key changed between connections")
            return
        state = host_key_state(key, known, self.revoked_keys)
        if state == "unknown" and self.accept_new_host_key:
            self.new_key_to_record = key
        elif state != "known":
            raise host_key_error(state, self.host_name, key, known, self.config.known_hosts)
        self.pinned_key = key

    def _authenticate(self, transport: paramiko.Transport) -> None:
        user = self.config.user or getpass.getuser()
        where = f"{user}@{self.config.describe()}"
        if self.config.identity_file is not None:
            path = self.config.identity_file
            try:
                key = paramiko.PKey.from_path(path)
            except FileNotFoundError:
                raise UploadError(f"identity_file {path}: not found") from None
            except paramiko.PasswordRequiredException:
                raise UploadError(
                    f"identity_file {path}: is passphrase-protected; add it to ssh-agent and "
                    "leave identity_file unset"
                ) from None
            except (OSError, paramiko.SSHException, ValueError) as e:
                raise UploadError(f"identity_file {path}: cannot load key ({e})") from None
            try:
                transport.auth_publickey(user, key)
            except paramiko.SSHException as e:
                raise UploadError(f"{where}: key {path} was not accepted ({e})") from None
            return
        agent = paramiko.Agent()
        try:
            keys = agent.get_keys()
            if not keys:
                raise UploadError(
                    f"{where}: no identity_file configured and no keys in ssh-agent (SSH_AUTH_SOCK)"
                )
            for key in keys:
                try:
                    transport.auth_publickey(user, key)
                    return
                except paramiko.AuthenticationException:
                    continue
            raise UploadError(f"{where}: none of the {len(keys)} ssh-agent keys was accepted")
        finally:
            agent.close()

    def open_transport(self) -> paramiko.Transport:
        known = self.known_keys()
        transport = self.handshake(known)
        try:
            self._check_host_key(transport.get_remote_server_key(), known)
            self._authenticate(transport)
            self._record_new_host_key()
            return transport
        except BaseException:
            transport.close()
            raise

    def handshake(self, known: dict[str, paramiko.PKey]) -> paramiko.Transport:
        """A transport to the server after the key exchange (host key not checked, no login)."""
        address = (self.config.host, self.config.port)
        try:
            sock = socket.create_connection(address, timeout=self.connect_timeout)
        except OSError as e:
            raise UploadError(f"cannot connect to {self.config.describe()}: {e}") from None
        transport = paramiko.Transport(sock)
        try:
            security = transport.get_security_options()
            available = security.ciphers
            security.ciphers = tuple(c for c in PREFERRED_CIPHERS if c in available) + tuple(
                c for c in available if c not in PREFERRED_CIPHERS
            )
            if known:  # ask for a host key type we can verify, like OpenSSH does
                security.key_types = tuple(k for k in security.key_types if k in known) + tuple(
                    k for k in security.key_types if k not in known
                )
            try:
                transport.start_client(timeout=self.connect_timeout)
            except (paramiko.SSHException, OSError, EOFError) as e:
                raise UploadError(
                    f"SSH handshake with {self.config.describe()} failed: {e}"
                ) from None
            return transport
        except BaseException:
            transport.close()
            raise

    def _record_new_host_key(self) -> None:
        """Append an accepted new host key to known_hosts (only after a successful login)."""
        key = self.new_key_to_record
        if key is None:
            return
        self.new_key_to_record = None
        record_host_key(self.config.known_hosts, self.host_name, key)
        self.host_key_recorded = True


def record_host_key(path: Path, host_name: str, key: paramiko.PKey) -> None:
    """Append ``host_name``'s ``key`` to known_hosts: hashed (``|1|salt|hash``, paramiko's
    ``HostKeys.hash_host``) when the file's latest entry is hashed (OpenSSH's HashKnownHosts was
    on when it was last written), plain otherwise."""
    name = paramiko.HostKeys.hash_host(host_name) if _latest_entry_hashed(path) else host_name
    line = HostKeyEntry([name], key).to_line()
    if line is None:  # paramiko: an entry without a key or a name
        raise UploadError(f"{path}: cannot record the host key of {host_name}")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    append_known_host(path, line.encode())


def _latest_entry_hashed(path: Path) -> bool:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:  # missing (a new file) or unreadable (append_known_host then says why)
        return False
    for raw_line in reversed(text.splitlines()):
        line = raw_line.strip()
        if line and not line.startswith(("#", "@")):
            return line.startswith("|1|")
    return False


def append_known_host(path: Path, line: bytes) -> None:
    """Append ``line`` to known_hosts in place, as OpenSSH does: a symlinked file (dotfiles kept
    in a repository) stays a link and its target gets the line, and the file keeps its mode and
    owner (a copy + rename would replace the link and reset both). One O_APPEND write of a whole
    line, after a newline when the file lacks a final one; a new file is 0600."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise UploadError(f"{path}: cannot record the host key ({e.strerror or e})") from None
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except OSError as e:
        raise UploadError(f"{path}: cannot record the host key ({e.strerror or e})") from None
    finally:
        os.close(fd)


# ---- first contact: what the console shows and trusts -------------------------------------


@dataclass(frozen=True)
class HostKeyReport:
    """The server's host key and what known_hosts says of it (``host_key_state``)."""

    server: str  # the known_hosts name: host, or [host]:port
    key_type: str
    fingerprint: str  # SHA256:..., as OpenSSH prints it
    state: str  # known | unknown | changed | revoked
    known_hosts: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def probe_host_key(
    config: SftpConfig, *, connect_timeout: float = 20.0
) -> tuple[HostKeyReport, paramiko.PKey]:
    """Read the server's host key (key exchange only, no login) and check it against
    known_hosts; raises ``UploadError`` when the server cannot be reached."""
    connector = Connector(config, accept_new_host_key=False, connect_timeout=connect_timeout)
    known = connector.known_keys()
    transport = connector.handshake(known)
    try:
        key = transport.get_remote_server_key()
    finally:
        transport.close()
    state = host_key_state(key, known, connector.revoked_keys)
    report = HostKeyReport(
        connector.host_name, key.get_name(), key.fingerprint, state, str(config.known_hosts)
    )
    return report, key


def trust_host_key(
    config: SftpConfig, fingerprint: str, *, connect_timeout: float = 20.0
) -> HostKeyReport:
    """Record the server's key in known_hosts on first contact: only a key known_hosts lists
    nothing for, and only the one whose ``fingerprint`` the operator was shown (the key is read
    again here). A changed or revoked key raises ``HostKeyError``: that is fixed in known_hosts
    by hand, never from here. A key already known is left as it is."""
    report, key = probe_host_key(config, connect_timeout=connect_timeout)
    if report.state in ("changed", "revoked"):
        connector = Connector(config, accept_new_host_key=False, connect_timeout=connect_timeout)
        known = connector.known_keys()
        raise host_key_error(report.state, report.server, key, known, config.known_hosts)
    if report.fingerprint != fingerprint:
        raise HostKeyError(
            f"{report.server}: the server now offers host key {report.fingerprint}, not the "
            f"{fingerprint} shown; nothing recorded",
            state="mismatch",
            server=report.server,
            fingerprint=report.fingerprint,
        )
    if report.state == "unknown":
        record_host_key(config.known_hosts, report.server, key)
    return replace(report, state="known")
