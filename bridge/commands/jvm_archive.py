"""``lakegate jvm-archive``: make the local Spark JVM's class-data-sharing archive
(``bridge.spark.class_archive``): later local sessions start about 2 s sooner.

Prints where the archive is (``--check``: only whether there is a usable one,
exit 1 when not). ``spark.class_archive_dir = ""`` turns the archive off:
then there is nothing to make (exit 2, one line).
"""

from __future__ import annotations

import argparse
import time

from bridge.config import Config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check", action="store_true", help="only say whether a usable archive exists (exit 1: none)")
    p.add_argument("--force", action="store_true", help="make it again even when a usable one exists")


def run(args: argparse.Namespace, config: Config) -> int:
    from bridge.cli import UsageError
    from bridge.javacheck import require_java
    from bridge.spark import class_archive

    if class_archive.archive_dir(config) is None:
        raise UsageError('spark.class_archive_dir is "": the JVM class archive is off '
                         '(set it to "auto" or a directory)')
    require_java()  # JavaMissing: one line, exit 2
    path = class_archive.archive_path(config)
    usable = class_archive.usable_archive(config)
    if args.check:
        print(f"jvm-archive: {usable} (usable)" if usable else f"jvm-archive: none at {path}")
        return 0 if usable else 1
    if usable and not args.force:
        print(f"jvm-archive: {usable} exists (--force makes it again)")
        return 0
    print(f"jvm-archive: making {path} (a short Spark run; about 30 s) ...", flush=True)
    t = time.monotonic()
    try:
        made = class_archive.build(config)
    except RuntimeError as exc:
        print(f"lakegate: jvm-archive: {exc}")
        return 1
    print(f"jvm-archive: {made} ({made.stat().st_size / 1e6:.0f} MB) in {time.monotonic() - t:.0f} s; "
          "local Spark sessions now start with it")
    return 0
