"""`cerberus-hf calibrate`: the command around `cerberus_hf.calibration` (see there for what it fits and how)."""

from __future__ import annotations

import argparse
import json
import shlex
import tempfile
from pathlib import Path

import torch
from transformers import GenerationConfig

from ..calibration.pipeline import (
    DYNAMIC_BUDGETS,
    RESCORING_LM_WEIGHTS,
    RESCORING_WEIGHTS,
    calibrate,
    calibrate_chain,
    load_sequences,
)
from ..calibration.first_use import calibrate_machine
from ..calibration.machine import MeasurePlan
from ..calibration.report import format_chain_report, format_report
from ..calibration.statistics import POSITIONS_NAME
from ..configuration_cerberus import CerberusConfig
from ..blocks.tree import DynamicTree
from ..errors import UserError
from ..training.data import Record, frequent_tokens, read_records
from ..training.hidden_cache import check_token_ids
from . import arguments


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser("calibrate", help="fit the draft tree and the gate to heads and device",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", required=True, type=arguments.heads_source, help="head checkpoint folder")
    parser.add_argument("--data", default=None,
                        help="self-distillation JSONL (`cerberus-hf distill`); its held-out split is used (default: "
                             "the base answers --limit prompts of --prompts now)")
    parser.add_argument("--prompts", default=None, metavar="SOURCE",
                        help="without --data: the prompts the base answers for calibration, 'packaged' (the "
                             "package's prompts, the default), 'sharegpt' or a JSONL file; for a drafter brought "
                             "from elsewhere (imported, or an export loaded back), which comes without the answers "
                             "it was trained on")
    parser.add_argument("--held-out-fraction", type=arguments.fraction, default=0.05,
                        help="training's --eval-fraction, to select the held-out records (0: use every record)")
    parser.add_argument("--limit", type=arguments.positive_int, default=200, help="sequences to use")
    parser.add_argument("--max-nodes", type=arguments.positive_int, default=63, help="largest static tree considered")
    parser.add_argument("--top-k", type=arguments.positive_int, default=10,
                        help="guesses per head the static tree may take")
    parser.add_argument("--dynamic-max-nodes", type=arguments.positive_int, default=32,
                        help="largest dynamic tree considered")
    parser.add_argument("--dynamic-top-k", type=arguments.positive_int, default=4,
                        help="children expanded per node and nodes kept per level of the dynamic tree")
    parser.add_argument("--dynamic-budgets", nargs="*", default=[f"{p}:{r}" for p, r in DYNAMIC_BUDGETS],
                        metavar="TOP_P:MIN_RATIO",
                        help="Clover per-node budgets tried for the dynamic tree (none: the plain tree only)")
    parser.add_argument("--rescoring-weights", type=float, nargs="+", default=list(RESCORING_WEIGHTS),
                        help="n-gram weights tried for the rescored tree (needs HEADS/ngram.safetensors or --ngram)")
    parser.add_argument("--rescoring-lm-weights", type=float, nargs="+", default=list(RESCORING_LM_WEIGHTS),
                        help="LM weights tried beside 0 for the rescored tree (needs HEADS/rescorer/ or --rescorer)")
    parser.add_argument("--rescorer", default=None,
                        help="Kangaroo checkpoint for this base to rescore with as a small LM (default: the folder's "
                             "rescorer/; written there with --write)")
    parser.add_argument("--rescoring-candidates", type=arguments.positive_int, default=8,
                        help="guesses per depth the rescored tree considers under each path")
    parser.add_argument("--ngram", default=None,
                        help="n-gram model file to rescore with (default: the folder's; written there with --write)")
    parser.add_argument("--repeats", type=arguments.positive_int, default=5,
                        help="timing repeats per size for the cost curve")
    parser.add_argument("--draft-vocab", type=arguments.positive_int, default=None,
                        help="draft among the N most frequent answer tokens of --data (cheaper heads; exact output; "
                             "default: the whole vocabulary)")
    parser.add_argument("--device", default="cpu", type=arguments.device, help="where the base and the heads run")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="the dtype the base and heads compute in: each dtype has its own cost curve and entry")
    parser.add_argument("--report", default=None, type=arguments.output_file, help="write the full report (JSON) here")
    parser.add_argument("--write", action="store_true",
                        help=f"store the settings in the folder's generation config and the positions they were fitted "
                             f"to in {POSITIONS_NAME}")
    parser.add_argument("--machine", action="store_true",
                        help=f"only this machine's half, from the folder's {POSITIONS_NAME}: measure the costs, fit, "
                             "and store the entry in the user's cache as generate() would on first use (no --data)")
    parser.add_argument("--strict", action="store_true",
                        help="fit the settings generate(strict=True) uses: strict verification's cost curve and trees "
                             "no larger than it can verify on this machine (stored beside the entry's own)")
    # the options only trees read: a drafter that drafts chains refuses them rather than ignore them
    tree_options = ("max_nodes", "top_k", "dynamic_max_nodes", "dynamic_top_k", "dynamic_budgets",
                    "rescoring_weights", "rescoring_lm_weights", "rescoring_candidates", "ngram", "rescorer")
    parser.set_defaults(func=run_cli, tree_defaults={name: parser.get_default(name) for name in tree_options})


def run_cli(args: argparse.Namespace) -> int:
    if args.machine:
        return _run_machine(args)
    if args.data is not None and args.prompts is not None:
        raise UserError("--prompts gives the prompts the base answers when there is no --data: give one of them")
    if args.draft_vocab:
        config = CerberusConfig.from_pretrained(args.heads)  # before the model: a refusal needs no weights
        if config.draft_vocab_trained:
            raise UserError(f"{args.heads} was trained over its own {config.draft_vocab_size}-token vocabulary (train "
                            "--train-vocab); rows outside it are untrained, so it keeps drafting among those tokens: "
                            "leave out --draft-vocab")
    # before the model: a bad data file fails fast
    records = read_records(args.data) if args.data is not None else _base_answers(args)
    model = _load_for_calibration(args, records)
    check_token_ids(records, model.base)
    sequences = load_sequences(records, args.limit, args.held_out_fraction if args.data is not None else 0.0)
    if model.heads.drafts_chains:
        given = [name for name, default in args.tree_defaults.items() if getattr(args, name) != default]
        if given:
            raise UserError(f"{', '.join('--' + n.replace('_', '-') for n in given)} do(es) not apply to "
                            f"{model.config.head_type}, which drafts chains (no trees, no rescoring)")
        if args.strict:
            raise UserError(f"--strict fits trees; {model.config.head_type} drafts chains, which "
                            "generate(strict=True) verifies with the entry's own settings")
        report = calibrate_chain(model, sequences, repeats=args.repeats)
        print(format_chain_report(report))
    else:
        report = calibrate(model, sequences, top_k=args.top_k, max_nodes=args.max_nodes, repeats=args.repeats,
                           dynamic_top_k=args.dynamic_top_k, dynamic_max_nodes=args.dynamic_max_nodes,
                           rescoring_weights=tuple(args.rescoring_weights),
                           rescoring_candidates=args.rescoring_candidates,
                           rescoring_lm_weights=tuple(args.rescoring_lm_weights),
                           dynamic_budgets=parse_budgets(args.dynamic_budgets), strict=args.strict)
        print(format_report(report))
    if args.report:
        with open(args.report, "w") as handle:
            json.dump(report, handle, indent=1)
    if args.write:
        _write_calibration(args, model, records)
        print(f"stored in {args.heads}: generation_config.json cerberus_calibration[{report['key']!r}]"
              + (f", a {args.draft_vocab}-token draft vocabulary with the heads" if args.draft_vocab else ""))
    return 0


ANSWER_TOKENS = 128  # new tokens per answer the base gives for a calibration without --data


def _base_answers(args: argparse.Namespace) -> list[Record]:
    """The base's greedy answers to ``--limit`` prompts of ``--prompts`` (in a temporary file, not kept): the data a
    drafter brought from elsewhere is calibrated on when no answers of the base come with it. Every answer counts as
    held out (none was trained on here)."""
    from ..real_models import load_named_model
    from ..training.data import load_prompts
    from ..training.distill import generate_distillation_data

    config = CerberusConfig.from_pretrained(args.heads)
    source = None if args.prompts in (None, "packaged") else args.prompts
    prompts = load_prompts(source, limit=args.limit)
    base, tokenizer = load_named_model(config.base_model_source or config.base_model_name_or_path,
                                       getattr(torch, args.dtype))
    print(f"the base answers {len(prompts)} prompts of {args.prompts or 'packaged'} ({ANSWER_TOKENS} tokens each) "
          "to calibrate on")
    with tempfile.TemporaryDirectory() as folder:
        path = generate_distillation_data(base.to(args.device), tokenizer, prompts, Path(folder) / "answers.jsonl",
                                          batch_size=16, max_new_tokens=ANSWER_TOKENS, sample_fraction=0.0)
        return read_records(path)


def _write_calibration(args: argparse.Namespace, model, records: list[Record]) -> None:
    """Store ``model``'s calibration in the ``--heads`` folder. A calibration alone rewrites only
    ``generation_config.json`` and the positions (none after ``--strict``, which keeps the folder's): the folder's
    other files stay as they are (an n-gram file may be a link
    shared with another folder). ``--draft-vocab``, ``--ngram`` or ``--rescorer`` change the checkpoint, which
    is then written whole, from a fresh copy of the folder so that its weights keep the precision they were
    stored in, not the dtype calibration ran in."""
    if not (args.draft_vocab or args.ngram or args.rescorer):
        stored_config = GenerationConfig.from_pretrained(args.heads)
        stored_config.cerberus_calibration = model.generation_config.cerberus_calibration
        stored_config.save_pretrained(args.heads)
        if model.calibration_statistics is not None:
            model.calibration_statistics.save(args.heads)
        return
    stored = _load_for_calibration(args, records, cast=False)
    stored.generation_config.cerberus_calibration = model.generation_config.cerberus_calibration
    stored.calibration_statistics = model.calibration_statistics
    stored.save_pretrained(args.heads)


def _run_machine(args: argparse.Namespace) -> int:
    """``--machine``: this machine's half of a calibration from the folder's positions, into the user's cache."""
    given = [option for option in ("data", "prompts", "write", "strict", "draft_vocab", "report")
             if getattr(args, option)]
    if given:
        raise UserError(f"{', '.join('--' + n.replace('_', '-') for n in given)} do(es) not apply to --machine, which "
                        f"fits this machine to the folder's {POSITIONS_NAME} and stores the entry in the user's cache")
    model = _load_for_calibration(args, [])
    if model.calibration_statistics is None:
        raise UserError(f"{args.heads} has no {POSITIONS_NAME}: run `cerberus-hf calibrate --heads "
                        f"{shlex.quote(args.heads)} --write` once (on any machine) to measure them (the base answers "
                        "the packaged prompts; --data ANSWERS.jsonl calibrates on yours)")
    fitted, path, seconds = calibrate_machine(model, MeasurePlan(repeats=args.repeats))
    settings = fitted.settings
    print(f"{model.device.type} in {args.dtype}: {settings['tree_kind']} tree, gate {settings['gate_signal']} < "
          f"{settings['gate_threshold']}, {fitted.tokens_per_s:.1f} tokens/s modelled against plain's "
          f"{fitted.plain_tokens_per_s:.1f}; measured in {seconds:.1f} s, stored in {path}")
    return 0


def _load_for_calibration(args: argparse.Namespace, records: list[Record], cast: bool = True):
    """The checkpoint of ``--heads`` with the n-gram, rescorer and draft vocabulary the options ask for; on
    ``--device`` in ``--dtype`` when ``cast``, else as stored."""
    from ..modeling_cerberus import CerberusForCausalLM

    model = CerberusForCausalLM.from_pretrained(args.heads)
    if cast:
        model = model.to(args.device, getattr(torch, args.dtype))
    if args.ngram:
        model.load_ngram(args.ngram)
    if args.rescorer:
        model.load_rescorer(args.rescorer)
    if args.draft_vocab:
        model.set_draft_vocab(frequent_tokens(records, args.draft_vocab))
    return model


def parse_budgets(values: list[str]) -> tuple[tuple[float, float], ...]:
    """``["0.95:0.25", ...]`` as (top_p, min_ratio) pairs, each checked as `DynamicTree` checks it."""
    budgets = []
    for value in values:
        top_p, colon, min_ratio = value.partition(":")
        try:
            budget = (float(top_p), float(min_ratio))
            DynamicTree(nodes=1, depth=1, top_p=budget[0], min_ratio=budget[1])
        except ValueError as error:
            raise UserError(f"--dynamic-budgets {value!r}: expected TOP_P:MIN_RATIO with 0 < TOP_P <= 1 and "
                            f"0 <= MIN_RATIO <= 1 ({error})") from None
        budgets.append(budget)
    return tuple(budgets)
