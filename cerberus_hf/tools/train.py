"""`cerberus-hf train`: train a drafter on a frozen base from distillation data: draft heads (Medusa, Cerberus, Hydra,
Clover), Kangaroo's adapter, or an EAGLE-3 or DFlash drafter unrolled over whole sequences.

Heads train from single answer positions (`training.trainer.train_heads`), the adapter as a chain drafter
(`training.chain_trainer.train_chain_drafter`), EAGLE-3 and DFlash over sequences
(`training.sequence_trainer.train_sequence_drafter`).
"""

from __future__ import annotations

import argparse
import gc
import logging
import time

import torch

from ..configuration_cerberus import HEAD_TYPES, STATE_SOURCES
from ..drafters import DRAFTER_CLASSES
from ..real_models import load_named_model
from ..training.base_features import FEATURE_MODES
from ..training.data import read_records
from ..training.hidden_cache import build_hidden_cache
from ..training.trainer import HeadTrainingSettings, default_cache_dir, train_heads
from . import arguments

# what `train` trains: every head type but those made of the base's own layers (`mtp`, trained with the base)
TRAINABLE = tuple(h for h in HEAD_TYPES if not DRAFTER_CLASSES[h].needs_base_layers)


def add_cli(subparsers):
    """Register the ``train`` subcommand; returns its parser."""
    parser = subparsers.add_parser(
        "train", help=f"train a drafter on a frozen base ({', '.join(TRAINABLE)})",
        description=__doc__.split("\n\n")[0])
    _add_arguments(parser)
    # bad counts, sizes and shares: one-line errors while parsing
    arguments.set_types(parser, positive_float=("epochs", "lr", "head_weight_decay"),
                        non_negative_int=("teacher_topk",), probability=("distill_weight", "text_distill_weight"),
                        fraction=("warmup_ratio", "eval_fraction", "head_dropout"),
                        open_probability=("train_fraction",),
                        positive_int=("num_heads", "num_layers", "batch_size", "max_steps", "eval_every", "save_every",
                                      "num_threads", "train_vocab", "exit_layer", "batch_tokens", "adapter_heads",
                                      "adapter_head_dim", "context_window"))
    # the options only some head types read: the others refuse them rather than ignore them
    unrolled = ("eagle3", "dflash")  # trained on whole sequences, unrolled over the depths (`sequence_trainer`)
    heads = tuple(h for h in HEAD_TYPES if h not in ("kangaroo", *unrolled))  # trained from single positions
    only = {"batch_size": heads, "head_weight_decay": (*heads, *unrolled), "text_distill_weight": heads,
            "train_fraction": heads, "projection_dtype": heads, "num_layers": ("medusa", "cerberus", "hydra", "dflash"),
            "exit_layer": ("kangaroo",), "batch_tokens": ("kangaroo", *unrolled),
            "adapter_heads": ("kangaroo", "clover", "hydra", *unrolled),
            "adapter_head_dim": ("kangaroo", "clover", "hydra", *unrolled), "context_window": ("clover", "hydra"),
            "prefix_layer": ("hydra",), "head_dropout": heads, "state_source": heads, "init_from": (*heads, *unrolled),
            "feature_layers": unrolled, "compute_dtype": unrolled}
    parser.set_defaults(func=run_cli, only_for={name: (types, parser.get_default(name)) for name, types in only.items()})
    return parser


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    arguments.add_model_option(parser)
    parser.add_argument("--head-type", default="cerberus", choices=TRAINABLE, help="the drafter family to train")
    parser.add_argument("--num-heads", type=int, default=4,
                        help="tokens drafted per step: heads, or the depths of a drafter that drafts them in turn")
    parser.add_argument("--num-layers", type=int, default=1,
                        help="residual blocks per head (Medusa, Cerberus, Hydra) or DFlash's decoder layers")
    parser.add_argument("--data", required=True, action="append",
                        help="distillation JSONL (from `cerberus-hf distill`); repeat to train on several as one set")
    parser.add_argument("--output", default=None,
                        help="folder for the heads, metrics and checkpoints (required unless --cache-only)")
    parser.add_argument("--epochs", type=float, default=1.0, help="passes over the training records")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (AdamW, cosine decay after warm-up)")
    parser.add_argument("--batch-size", type=int, default=256, help="answer positions per step")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="total steps (overrides --epochs; default: as many as --epochs takes)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initialisation and of the batches")
    parser.add_argument("--distill-weight", type=float, default=0.0,
                        help="share of the target given to the base's own distribution (0..1)")
    parser.add_argument("--text-distill-weight", type=float, default=1.0,
                        help="the same share for 'text' records (a dataset's answers; default: the base's distribution "
                             "only). Held-out accuracy is then measured on the base's own answers")
    parser.add_argument("--head-weight-decay", type=float, default=0.8, help="head k's loss weight is this ** k")
    parser.add_argument("--warmup-ratio", type=float, default=0.05,
                        help="share of the steps over which the learning rate warms up")
    parser.add_argument("--eval-every", type=int, default=250, help="evaluate on the held-out records every N steps")
    parser.add_argument("--save-every", type=int, default=None,
                        help="write a checkpoint every N steps, to resume from (default: every min(--eval-every, "
                             "100) steps; kangaroo, eagle3 and dflash: every 50)")
    parser.add_argument("--eval-fraction", type=float, default=0.05,
                        help="share of the records held out of training, for evaluation and calibration")
    parser.add_argument("--train-fraction", type=float, default=1.0,
                        help="share of the training records used (nested subsets; for data-scaling curves)")
    parser.add_argument("--cache-dir", default=None,
                        help="hidden-state cache folder, shared between runs (default: $CERBERUS_HF_CACHE/hidden_states)")
    parser.add_argument("--teacher-topk", type=int, default=32,
                        help="base log-probabilities kept per cached position, for --distill-weight (0: none)")
    parser.add_argument("--num-threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--projection-dtype", default="float32", choices=("float32", "bfloat16"),
                        help="dtype of the products with the frozen lm_head in the loss (bfloat16: faster)")
    parser.add_argument("--train-vocab", type=int, default=None, metavar="N",
                        help="score the loss over the data's N most frequent answer tokens and each batch's targets "
                             "instead of the whole vocabulary (about N/vocab of the projection's cost); the heads "
                             "then draft among those N tokens (default: the whole vocabulary)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="dtype the base is loaded in")
    parser.add_argument("--init-from", default=None, metavar="FOLDER",
                        help="start from the heads saved in FOLDER (same head type and shape options) instead of fresh "
                             "ones: train on one data set, then another, or adapt shipped heads to your data "
                             "(default: fresh heads)")
    parser.add_argument("--no-resume", action="store_true", help="discard checkpoints in --output and start over")
    parser.add_argument("--features", default="cache", choices=FEATURE_MODES,
                        help="kangaroo and eagle3: read the base's states from caches filled before training (cache), "
                             "or run the base in each step and write nothing to disk (online: no cache, a base "
                             "forward per step)")
    parser.add_argument("--cache-only", action="store_true",
                        help="only compute the hidden-state cache (e.g. while distillation data is still being written)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_drafter_options(parser)


def _add_drafter_options(parser: argparse.ArgumentParser) -> None:
    """The options of some families' drafters: their shape, what they read, how they are computed."""
    kangaroo = parser.add_argument_group("kangaroo", "the adapter on the base's first layers (--head-type kangaroo; "
                                         "--num-heads is the longest draft)")
    kangaroo.add_argument("--exit-layer", type=int, default=2, help="base layers the drafter runs before the adapter")
    kangaroo.add_argument("--batch-tokens", type=int, default=8192, help="padded sequence tokens per step")
    parser.add_argument("--state-source", default="lm_head_input", choices=STATE_SOURCES,
                        help="which of the base's last states the heads read: the lm_head's input (after the final "
                             "norm) or the last decoder layer's output (before it, as Clover-2 reads it); each has "
                             "a hidden-state cache of its own")
    parser.add_argument("--head-dropout", type=float, default=0.0,
                        help="dropout on what the heads read and project, in training (Hydra++: 0.2)")
    adapter = parser.add_argument_group("adapter", "Kangaroo's adapter, Clover's augmenting block and Hydra++'s prefix "
                                        "layer (--head-type kangaroo, clover, or hydra with --prefix-layer)")
    adapter.add_argument("--adapter-heads", type=int, default=2, help="attention heads of the adapter or layer")
    adapter.add_argument("--adapter-head-dim", type=int, default=32,
                         help="width of each of those attention heads")
    adapter.add_argument("--context-window", type=int, default=16,
                         help="Clover and Hydra++: how many of the newest verified states the augmenting block or "
                              "the prefix layer reads")
    parser.add_argument("--compute-dtype", default="float32", choices=("float32", "bfloat16"),
                        help="EAGLE-3 and DFlash: dtype of the unrolled steps (autocast) and of the projection in the loss; "
                             "bfloat16 is several times faster on AMX CPUs and GPUs (weights stay float32)")
    parser.add_argument("--feature-layers", type=int, nargs="+", default=None, metavar="I",
                        help="EAGLE-3 and DFlash: the base states they fuse, as hidden_states indices (default: "
                             "EAGLE-3's low, middle and high layer; DFlash's choice for its --num-layers; their "
                             "attention takes the base's shape unless --adapter-heads or --adapter-head-dim are given)")
    adapter.add_argument("--prefix-layer", action="store_true",
                         help="Hydra: Hydra++'s prefix layer (a decoder layer over the base's states) before the heads")


def run_cli(args: argparse.Namespace) -> int:
    """Run the ``train`` subcommand from parsed arguments, then end the process group of a ``torchrun`` run (if any)
    while the interpreter is whole: a gloo worker thread that frees the last collective's tensors once the interpreter
    is being torn down aborts the process (SIGABRT, "terminate called without an active exception") after a finished
    run. The run's DDP wrappers hold the group, so they are collected first and destroying it joins its threads."""
    try:
        return _run(args)
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            gc.collect()
            torch.distributed.destroy_process_group()


def _run(args: argparse.Namespace) -> int:
    from ..modeling_cerberus import CerberusForCausalLM

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.output is None and not args.cache_only:
        raise SystemExit("cerberus-hf train: --output is required (unless --cache-only)")
    if args.features == "online" and args.head_type not in ("kangaroo", "eagle3", "dflash"):
        raise SystemExit(f"cerberus-hf train: --features online trains kangaroo, eagle3 and dflash only: --head-type "
                         f"{args.head_type}'s steps sample single positions across all records, so each step would run "
                         "the base over whole records; use the hidden-state cache (--cache-dir on a disk with room)")
    base = load_named_model(args.base, getattr(torch, args.dtype), with_tokenizer=False)[0]
    if args.cache_only:
        started = time.perf_counter()
        records = [record for path in args.data for record in read_records(path)]
        cache = build_hidden_cache(base, records, args.cache_dir if args.cache_dir is not None else default_cache_dir(),
                                   teacher_topk=args.teacher_topk, show_progress=not args.no_progress,
                                   state_source=args.state_source)
        print(f"{cache.info['folder']}: {len(cache.record_ids)} records, {cache.num_positions} answer positions, "
              f"{cache.info['shards_computed']} of {cache.info['shards']} shards computed in "
              f"{time.perf_counter() - started:.0f} s; base top-1 = data token at {cache.base_agreement()}")
        return 0
    _refuse_options_of_other_head_types(args)
    if args.head_type == "kangaroo":
        return _run_chain_cli(args, base)
    if args.head_type in ("eagle3", "dflash"):
        return _run_sequence_cli(args, base)
    shape = {name: getattr(args, name) for name in ("num_layers", "adapter_heads", "adapter_head_dim", "context_window",
                                                    "prefix_layer", "head_dropout", "state_source")
             if args.head_type in args.only_for[name][0]}  # the drafter's shape options that apply to this head type
    model = CerberusForCausalLM.from_base(base, head_type=args.head_type, num_heads=args.num_heads, **shape)
    metrics = train_heads(model, args.data if len(args.data) > 1 else args.data[0], args.output,
                          _head_training_settings(args))
    cost = metrics["cost"]
    if metrics["eval"] is not None:
        print("held-out top-1 per head: " + " ".join(f"{v:.3f}" for v in metrics["top1"]))
        print("held-out top-5 per head: " + " ".join(f"{v:.3f}" for v in metrics["top5"]))
    if cost["positions_per_s"] is None:  # its last checkpoint was the final step: only evaluated and saved again
        print(f"the run was already complete: {metrics['steps']} steps ({metrics['epochs']} epochs), nothing left to "
              f"train ({cost['wall_time_s']:.0f} s on {cost['device']})")
    else:
        print(f"{metrics['steps']} steps ({metrics['epochs']} epochs) in {cost['wall_time_s']:.0f} s "
              f"(cache {cost['cache_time_s']:.0f} s, training {cost['train_time_s']:.0f} s, "
              f"{cost['positions_per_s']} positions/s) on {cost['device']}")
    print(f"heads saved to {args.output}")
    return 0


# The `HeadTrainingSettings` fields that the options of the same name set (the others keep their defaults).
_HEAD_TRAINING_OPTIONS = ("epochs", "lr", "batch_size", "warmup_ratio", "head_weight_decay", "distill_weight",
                          "text_distill_weight", "eval_every", "save_every", "seed", "max_steps", "eval_fraction",
                          "train_fraction", "cache_dir", "num_threads", "projection_dtype", "teacher_topk",
                          "train_vocab", "init_from")


def _head_training_settings(args: argparse.Namespace) -> HeadTrainingSettings:
    """The `train_heads` settings that parsed ``train`` options give."""
    return HeadTrainingSettings(**{name: getattr(args, name) for name in _HEAD_TRAINING_OPTIONS},
                                resume=not args.no_resume, show_progress=not args.no_progress)


def _refuse_options_of_other_head_types(args: argparse.Namespace) -> None:
    given = [name for name, (types, default) in args.only_for.items()
             if args.head_type not in types and getattr(args, name) != default]
    if args.head_type == "hydra" and not args.prefix_layer:  # Hydra reads the attention's shape for its prefix only
        prefix = [name for name in ("adapter_heads", "adapter_head_dim", "context_window")
                  if getattr(args, name) != args.only_for[name][1]]
        if prefix:
            raise SystemExit(f"cerberus-hf train: {', '.join('--' + n.replace('_', '-') for n in prefix)} shape(s) "
                             "Hydra's prefix layer: add --prefix-layer")
    if given:
        raise SystemExit(f"cerberus-hf train: {', '.join('--' + n.replace('_', '-') for n in given)} do(es) not "
                         f"apply to --head-type {args.head_type}")


def _run_chain_cli(args: argparse.Namespace, base) -> int:
    """``cerberus-hf train --head-type kangaroo``: the adapter, trained on whole sequences (`chain_trainer`)."""
    from ..modeling_cerberus import CerberusForCausalLM
    from ..training.chain_trainer import train_chain_drafter

    model = CerberusForCausalLM.from_base(base, head_type=args.head_type, num_heads=args.num_heads,
                                          exit_layer=args.exit_layer, adapter_heads=args.adapter_heads,
                                          adapter_head_dim=args.adapter_head_dim)
    metrics = train_chain_drafter(
        model, args.data, args.output, epochs=args.epochs, lr=args.lr, batch_tokens=args.batch_tokens,
        warmup_ratio=args.warmup_ratio, distill_weight=args.distill_weight, teacher_topk=args.teacher_topk,
        eval_every=args.eval_every, save_every=args.save_every or 50, eval_fraction=args.eval_fraction,
        seed=args.seed, max_steps=args.max_steps, cache_dir=args.cache_dir, num_threads=args.num_threads,
        train_vocab=args.train_vocab, features=args.features, resume=not args.no_resume,
        show_progress=not args.no_progress,
    )
    cost = metrics["cost"]
    if metrics["eval"] is not None:
        print(f"held-out top-1 {metrics['eval']['top1']:.3f}, top-5 {metrics['eval']['top5']:.3f} "
              f"({metrics['eval']['positions']} answer positions)")
    print(f"{metrics['steps']} steps ({metrics['epochs']} epochs) in {cost['wall_time_s']:.0f} s (exit states "
          f"{cost['cache_time_s']:.0f} s, training {cost['train_time_s']:.0f} s) on {cost['device']}")
    print(f"adapter saved to {args.output}")
    return 0


def _run_sequence_cli(args: argparse.Namespace, base) -> int:
    """``cerberus-hf train --head-type eagle3`` or ``dflash``: the depths unrolled over whole sequences
    (`sequence_trainer`)."""
    from ..modeling_cerberus import CerberusForCausalLM
    from ..training.sequence_trainer import train_sequence_drafter

    shape = {name: getattr(args, name) for name in ("adapter_heads", "adapter_head_dim", "feature_layers", "num_layers")
             if args.head_type in args.only_for[name][0] and getattr(args, name) != args.only_for[name][1]}
    # the others: the family's defaults for this base
    model = CerberusForCausalLM.from_base(base, head_type=args.head_type, num_heads=args.num_heads, **shape)
    metrics = train_sequence_drafter(
        model, args.data, args.output, epochs=args.epochs, lr=args.lr, batch_tokens=args.batch_tokens,
        warmup_ratio=args.warmup_ratio, step_weight_decay=args.head_weight_decay, distill_weight=args.distill_weight,
        teacher_topk=args.teacher_topk, eval_every=args.eval_every, save_every=args.save_every or 50,
        eval_fraction=args.eval_fraction, seed=args.seed, max_steps=args.max_steps, cache_dir=args.cache_dir,
        num_threads=args.num_threads, train_vocab=args.train_vocab, compute_dtype=args.compute_dtype,
        init_from=args.init_from, features=args.features, resume=not args.no_resume,
        show_progress=not args.no_progress,
    )
    cost = metrics["cost"]
    if metrics["eval"] is not None:
        print("held-out top-1 per depth: " + " ".join(f"{v:.3f}" for v in metrics["top1"]))
        print("held-out top-5 per depth: " + " ".join(f"{v:.3f}" for v in metrics["top5"]))
    print(f"{metrics['steps']} steps ({metrics['epochs']} epochs) in {cost['wall_time_s']:.0f} s (features "
          f"{cost['cache_time_s']:.0f} s, training {cost['train_time_s']:.0f} s) on {cost['device']}")
    print(f"drafter saved to {args.output}")
    return 0
