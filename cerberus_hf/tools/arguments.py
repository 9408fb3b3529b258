"""Argument types shared by the `cerberus-hf` subcommands.

Each refuses a bad value while the command line is parsed, before anything is loaded, with one line that
names the option (``cerberus-hf <command>: error: argument --prompts: must be an integer >= 1, got '0'``,
status 2, as argparse reports any bad argument).
"""

from __future__ import annotations

import argparse
import math
import os

from transformers.utils import CONFIG_NAME

from ..checkpoint import check_source


def _number(text: str, kind: type, what: str, valid) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if math.isnan(value) or not valid(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A count: an integer >= 1."""
    return _number(text, int, "an integer >= 1", lambda v: v >= 1)


def non_negative_int(text: str) -> int:
    """An integer >= 0 (0 meaning none)."""
    return _number(text, int, "an integer >= 0", lambda v: v >= 0)


def positive_float(text: str) -> float:
    """A number > 0 (finite)."""
    return _number(text, float, "a number > 0", lambda v: 0 < v < math.inf)


def probability(text: str) -> float:
    """A number in [0, 1]."""
    return _number(text, float, "a number in [0, 1]", lambda v: 0 <= v <= 1)


def fraction(text: str) -> float:
    """A share left out of a whole: a number in [0, 1)."""
    return _number(text, float, "a number in [0, 1)", lambda v: 0 <= v < 1)


def open_probability(text: str) -> float:
    """A number in (0, 1] (a top-p)."""
    return _number(text, float, "a number in (0, 1]", lambda v: 0 < v <= 1)


def threshold(text: str) -> float:
    """A number, inf included, NaN not (an entropy gate's threshold)."""
    return _number(text, float, "a number (inf: always draft)", lambda v: True)


def device(text: str) -> str:
    """A torch device that exists here: ``cpu``, ``cuda`` / ``cuda:N`` with CUDA, ``mps`` with MPS,
    ``xpu`` with an XPU."""
    import torch

    try:
        parsed = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"unknown device {text!r} (expected cpu, cuda, cuda:N, mps or xpu)") from None
    if parsed.type == "cpu":
        return text
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(f"device {text} is not available here "
                                             "(torch.cuda.is_available() is False)")
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            raise argparse.ArgumentTypeError(f"device {text} is not available here (torch.cuda.device_count() is "
                                             f"{count})")
        return text
    checks = {"mps": ("torch.backends.mps.is_available()", lambda: torch.backends.mps.is_available()),
              "xpu": ("torch.xpu.is_available()", lambda: hasattr(torch, "xpu") and torch.xpu.is_available())}
    if parsed.type in checks:
        check, available = checks[parsed.type]
        if not available():
            raise argparse.ArgumentTypeError(f"device {text} is not available here ({check} is False)")
        return text
    raise argparse.ArgumentTypeError(f"device {text} is not supported here (expected cpu, cuda, cuda:N, mps or xpu)")


def heads_source(text: str) -> str:
    """A head checkpoint: a folder with ``config.json``, or a Hub id."""
    try:
        check_source(text, CONFIG_NAME)
    except OSError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def heads_folder(text: str) -> str:
    """A head checkpoint in a local folder (a command that writes into it): a folder with ``config.json``."""
    if not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder" if os.path.exists(text)
                                         else f"no folder {text}")
    return heads_source(text)


def model_source(text: str) -> str:
    """A base model: a packaged model's name or source (`real_models.PACKAGED_MODELS`), a folder with
    ``config.json``, or a Hub id."""
    from ..real_models import PACKAGED_MODELS

    if any(text in (model.name, model.source) for model in PACKAGED_MODELS.values()):
        return text
    return heads_source(text)


def add_model_option(parser: argparse.ArgumentParser, flag: str = "--base") -> None:
    """Add ``flag`` (``--base``; ``distill``: ``--model``): the base model, by a packaged model's name (listed in its
    help, so a user sees which names load without a download), a folder or a Hub id; checked while parsing."""
    from ..real_models import PACKAGED_MODELS

    parser.add_argument(flag, default="smollm2-135m-instruct", type=model_source,
                        help=f"the base model: a packaged model ({', '.join(PACKAGED_MODELS)}), a folder with "
                             "config.json or a Hub id")


def check_heads_base(sources: list[str], base: str) -> None:
    """Refuse, before anything loads, heads made for a packaged base other than ``base`` (its short name, source or
    Hub id), naming the ``--base`` to pass; a folder in another project's layout is left to loading to judge."""
    from ..configuration_cerberus import CerberusConfig
    from ..errors import UserError
    from ..real_models import packaged_by_source

    for source in sources:
        try:
            packaged = packaged_by_source(CerberusConfig.from_pretrained(source).base_model_source)
        except (OSError, ValueError):
            continue
        if packaged is not None and base not in (packaged.name, packaged.source, packaged.hub_id):
            raise UserError(f"{source} holds heads for {packaged.hub_id}, not {base}: pass --base {packaged.name}")


def output_file(text: str) -> str:
    """A file to write: its folder exists (so a long run does not fail when it saves), and it is no folder."""
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a folder; expected a file name")
    parent = os.path.dirname(text) or "."
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"no folder {parent} to write {os.path.basename(text)} in")
    return text


class HelpFormatter(argparse.HelpFormatter):
    """``--help`` that ends each option's help with its default, ``(default: 8)`` (lists spaced, none as ``none``),
    unless the help already says it, the option is required or it is a flag (off unless given), so no default goes
    unsaid."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or action.nargs == 0 or action.required or action.default is argparse.SUPPRESS
                or "default" in text):
            return text
        value = action.default
        shown = ("none" if value is None or value == [] else
                 " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value))
        return f"{text} (default: {shown.replace('%', '%%')})".lstrip()


def set_types(parser: argparse.ArgumentParser, **types: tuple[str, ...]) -> None:
    """Give the options of ``parser`` named in each tuple (their ``dest``) the type of this module named by
    the keyword: ``set_types(parser, positive_int=("batch_size", "max_steps"))``. For a parser whose
    options are declared elsewhere with a plain ``type=int``."""
    by_dest = {action.dest: action for action in parser._actions}
    for name, dests in types.items():
        for dest in dests:
            by_dest[dest].type = globals()[name]
