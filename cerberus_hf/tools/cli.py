"""The `cerberus-hf` command: one subcommand per job, each defined next to the code it runs."""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules defining subcommands; each exposes add_cli(subparsers), which adds its parser and sets `func`.
SUBCOMMAND_MODULES = (
    "tools.demo", "training.distill", "training.trainer", "tools.calibrate", "tools.ngram", "tools.model_card",
    "tools.bench", "tools.divergence",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cerberus-hf", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(f"cerberus_hf.{name}").add_cli(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
