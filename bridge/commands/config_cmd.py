"""``lakegate config show``: the effective configuration, secrets masked."""

from __future__ import annotations

import argparse

from bridge.cli import common_parser
from bridge.config import Config
from bridge.config_render import render_toml


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    show = sub.add_parser("show", help="print the effective configuration with each value's source", parents=[common_parser()])
    show.add_argument("--format", choices=("toml", "json"), default="toml")
    show.add_argument("--no-sources", action="store_true", help="omit the '# source' comments")


def run(args: argparse.Namespace, config: Config) -> int:
    if args.format == "json":
        print(config.to_json(masked=True))
    else:
        print(render_toml(config, masked=True, with_sources=not args.no_sources), end="")
    return 0
