"""`cerberus-hf refresh-folder`: bring folders of heads saved by an earlier release to this release's layout: the code
that release copied into them is replaced by stubs that import the installed package, ``custom_generate/`` and the
tokenizer's entry are written and ``config.json`` gets its ``auto_map``; weights, configs, calibration and card are
kept.

The work is `remote_code.refresh_folder`'s.
"""

from __future__ import annotations

import argparse

from ..remote_code import refresh_folder


def add_cli(subparsers) -> None:
    """Register the ``refresh-folder`` subcommand."""
    parser = subparsers.add_parser(
        "refresh-folder", help="replace the code an earlier release copied into saved heads by the current stubs",
        description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", metavar="FOLDER", help="saved heads (a folder with config.json)")
    parser.set_defaults(func=_run_cli)


def _run_cli(args: argparse.Namespace) -> int:
    for folder in args.folders:
        removed, written = refresh_folder(folder)
        print(f"{folder}: removed {len(removed)} copied modules, wrote {len(written)} files")
    return 0
