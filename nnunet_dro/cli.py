"""The ``nnunet_dro`` command (also ``python -m nnunet_dro``): argument parsing and error reporting.

Sub-commands are discovered from :mod:`nnunet_dro.commands`. Bad input raises
:class:`nnunet_dro.errors.UserError`, which ends as one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from typing import Sequence

from nnunet_dro import __version__, commands
from nnunet_dro.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nnunet_dro",
        description="Distributionally robust nnU-Net: trainers, robustness evaluation, data tools.")
    parser.add_argument("--version", action="version", version=f"nnunet_dro {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"nnunet_dro {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"nnunet_dro {args.command}: interrupted", file=sys.stderr)
        return 130
