"""``lakegate passwd FILE USER``: add or change a user of the edge's password file.

The password is read from the terminal (twice, not echoed) or, with
``--password-stdin``, from the first line of standard input. ``--delete``
removes the user. Hashes are salted scrypt (see :mod:`bridge.edge.auth`);
the file is rewritten atomically with mode 0600. Point ``edge.password_file``
at it; the edge rereads it when it changes.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from bridge.cli import UsageError
from bridge.config import Config

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="password file (created if missing)")
    p.add_argument("user", metavar="USER", help="user name (the CONNECT User Name)")
    p.add_argument("--password-stdin", action="store_true",
                   help="read the password from the first line of standard input")
    p.add_argument("--delete", action="store_true", help="remove USER from FILE")


def _read_password(from_stdin: bool) -> bytes:
    if from_stdin:
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
    else:
        if not sys.stdin.isatty():
            raise UsageError("no terminal to prompt for the password; use --password-stdin")
        password = getpass.getpass("Password: ")
        if getpass.getpass("Repeat password: ") != password:
            raise UsageError("the passwords do not match; nothing changed")
    if not password:
        raise UsageError("empty password; nothing changed")
    return password.encode("utf-8")


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.edge.auth import (
        PasswordFileError, hash_password, read_password_file, write_password_file,
    )

    user = args.user
    if not user or "\n" in user or "\r" in user:
        raise UsageError("USER must be a non-empty single line")
    try:
        users = read_password_file(args.file)
    except FileNotFoundError:
        users = {}
    except PasswordFileError as exc:
        raise UsageError(str(exc)) from None
    if args.delete:
        if user not in users:
            raise UsageError(f"user {user!r} is not in {args.file}; nothing changed")
        del users[user]
        write_password_file(args.file, users)
        print(f"deleted user {user!r} from {args.file}")
        return 0
    existed = user in users
    users[user] = hash_password(_read_password(args.password_stdin))
    write_password_file(args.file, users)
    print(f"{'changed' if existed else 'added'} user {user!r} in {args.file}")
    return 0
