"""The edge's password file: salted, slow hashes; managed by ``lakegate passwd``.

One line per user, ``USER:HASH``, where HASH is
``$scrypt$ln=<log2 N>,r=<r>,p=<p>$<salt, base64>$<key, base64>`` (scrypt,
RFC 7914, 16 random bytes of salt, 32-byte key). The parameters travel with
each hash, so they can be raised later without invalidating old entries.
Blank lines and lines starting with ``#`` are ignored. The file is written
atomically with mode 0600.

:class:`PasswordFile` checks credentials: it rereads the file when its
modification time changes, compares in constant time, and spends the same
work on an unknown user as on a known one (no user enumeration by timing).
Passwords never appear in logs, errors or reprs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import threading
from pathlib import Path

__all__ = [
    "DEFAULT_COST",
    "PasswordFile",
    "PasswordFileError",
    "hash_password",
    "read_password_file",
    "verify_password",
    "write_password_file",
]

#: scrypt parameters for new hashes: N = 2**15 (32 MiB, about 0.1 s), r = 8, p = 1.
DEFAULT_COST = {"ln": 15, "r": 8, "p": 1}
_SALT_BYTES = 16
_KEY_BYTES = 32


class PasswordFileError(ValueError):
    """The password file (or one hash in it) cannot be read; says where."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def _scrypt(password: bytes, salt: bytes, ln: int, r: int, p: int) -> bytes:
    n = 1 << ln
    return hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, dklen=_KEY_BYTES,
                          maxmem=max(64 * 1024 * 1024, 2 * 128 * r * n * p))


def hash_password(password: bytes, *, ln: int = DEFAULT_COST["ln"], r: int = DEFAULT_COST["r"],
                  p: int = DEFAULT_COST["p"]) -> str:
    """A salted scrypt hash of ``password`` in the file's HASH format."""
    if not 1 <= ln <= 20 or r < 1 or p < 1:
        raise ValueError(f"scrypt parameters out of range: ln={ln}, r={r}, p={p}")
    salt = secrets.token_bytes(_SALT_BYTES)
    return f"$scrypt$ln={ln},r={r},p={p}${_b64(salt)}${_b64(_scrypt(password, salt, ln, r, p))}"


def _parse(encoded: str) -> tuple[int, int, int, bytes, bytes]:
    parts = encoded.split("$")
    if len(parts) != 5 or parts[0] or parts[1] != "scrypt":
        raise PasswordFileError("not a $scrypt$ hash")
    try:
        params = dict(kv.split("=", 1) for kv in parts[2].split(","))
        ln, r, p = int(params["ln"]), int(params["r"]), int(params["p"])
        salt, key = _unb64(parts[3]), _unb64(parts[4])
    except (ValueError, KeyError) as exc:
        raise PasswordFileError(f"malformed $scrypt$ hash ({type(exc).__name__})") from None
    if not 1 <= ln <= 20 or r < 1 or p < 1 or not key:
        raise PasswordFileError(f"scrypt parameters out of range: ln={ln}, r={r}, p={p}")
    return ln, r, p, salt, key


def verify_password(password: bytes, encoded: str) -> bool:
    """True when ``password`` matches ``encoded`` (constant-time comparison)."""
    ln, r, p, salt, key = _parse(encoded)
    return hmac.compare_digest(_scrypt(password, salt, ln, r, p), key)


def read_password_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """USER -> HASH. Raises FileNotFoundError, or PasswordFileError naming
    the line of a malformed entry."""
    users: dict[str, str] = {}
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        user, sep, encoded = line.rpartition(":")
        if not sep or not encoded.startswith("$"):
            raise PasswordFileError(f"{path}:{n}: expected USER:$scrypt$..., got a line of "
                                    f"{len(line)} characters")
        try:
            _parse(encoded)
        except PasswordFileError as exc:
            raise PasswordFileError(f"{path}:{n}: user {user!r}: {exc}") from None
        users[user] = encoded
    return users


def write_password_file(path: str | os.PathLike[str], users: dict[str, str]) -> None:
    """Write USER:HASH lines atomically (temporary file + rename), mode 0600."""
    path = Path(path)
    for user in users:
        if "\n" in user or "\r" in user or not user:
            raise ValueError("a user name must be non-empty and on one line")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write("# lakegate password file: USER:$scrypt$... (managed by `lakegate passwd`)\n")
            for user, encoded in sorted(users.items()):
                fh.write(f"{user}:{encoded}\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class PasswordFile:
    """Credential checks against a password file (thread-safe; the check
    itself is slow on purpose, so the server runs it off the event loop)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._mtime: int | None = None
        self._users: dict[str, str] = {}
        self._dummy = hash_password(b"", ln=DEFAULT_COST["ln"])
        self.reload()

    def reload(self) -> None:
        """Read the file if it changed since the last read (raises on a bad file)."""
        mtime = self.path.stat().st_mtime_ns
        with self._lock:
            if mtime == self._mtime:
                return
        users = read_password_file(self.path)
        with self._lock:
            self._users = users
            self._mtime = mtime
            if users:  # dummy work for unknown users: the cost of a real entry
                ln, r, p, _s, _k = _parse(next(iter(users.values())))
                self._dummy = hash_password(b"", ln=ln, r=r, p=p)

    def check(self, username: str | None, password: bytes | None) -> bool:
        """True when ``username`` exists and ``password`` matches its hash."""
        try:
            self.reload()
        except (OSError, PasswordFileError):
            pass  # keep the last good contents
        with self._lock:
            encoded = self._users.get(username) if username is not None else None
            dummy = self._dummy
        ok = verify_password(password or b"", encoded or dummy)
        return ok and encoded is not None and password is not None

    def __len__(self) -> int:
        with self._lock:
            return len(self._users)

    def __repr__(self) -> str:
        return f"PasswordFile({str(self.path)!r}, users={len(self)})"
