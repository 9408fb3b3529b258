"""`cerberus-hf ngram`: count the n-gram model that lattice rescoring reads, and store it beside the heads.

It is counted over the answer tokens of the heads' training split (the held-out split stays unseen, so
`calibrate` can fit the rescoring weight on it honestly), each answer token with the end of its prompt as
context. The file (`ngram.safetensors`) loads with the heads.
"""

from __future__ import annotations

import argparse
import os
import time

from ..blocks.ngram import NGRAM_WEIGHTS_NAME, NgramModel
from ..training.data import Record, read_records
from ..training.hidden_cache import split_record_ids
from . import arguments


def training_sequences(records: list[Record], held_out_fraction: float) -> list[tuple[list[int], int]]:
    """``(prompt + answer, answer start)`` of every record outside the held-out split (training's split)."""
    held_out = split_record_ids([r.id for r in records], held_out_fraction) if held_out_fraction else set()
    return [(list(r.input_ids + r.output_ids), len(r.input_ids)) for r in records if r.id not in held_out]


def build_ngram(data: list[str], vocab_size: int, order: int = 3, held_out_fraction: float = 0.05) -> NgramModel:
    """An n-gram model of ``order`` over the training split of the answer files ``data``."""
    records = [record for path in data for record in read_records(path)]
    return NgramModel.build(training_sequences(records, held_out_fraction), vocab_size, order)


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser("ngram", help="count the n-gram model for lattice rescoring, beside the heads",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", required=True, type=arguments.heads_source,
                        help="head checkpoint folder (the model is written into it)")
    parser.add_argument("--data", required=True, action="append",
                        help="answer JSONL (repeatable); its training split is counted")
    parser.add_argument("--order", type=arguments.positive_int, default=3,
                        help="n-gram order (3: two tokens of context)")
    parser.add_argument("--held-out-fraction", type=arguments.fraction, default=0.05,
                        help="training's --eval-fraction: the held-out records are left out (0: count every record)")
    parser.add_argument("--output", default=None, type=arguments.output_file,
                        help=f"the file to write (default: HEADS/{NGRAM_WEIGHTS_NAME}, which loads with the heads)")
    parser.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    from ..configuration_cerberus import CerberusConfig

    config = CerberusConfig.from_pretrained(args.heads)
    started = time.perf_counter()
    model = build_ngram(args.data, config.vocab_size, args.order, args.held_out_fraction)
    seconds = time.perf_counter() - started
    output = args.output or os.path.join(args.heads, NGRAM_WEIGHTS_NAME)
    model.save(output)
    grams = ", ".join(f"{m}-grams {model.tables[f'{m}.codes'].numel():,}" for m in range(1, model.order + 1))
    print(f"order {model.order} over {model.tokens:,} answer tokens: {grams}; {os.path.getsize(output) / 1e6:.1f} MB "
          f"in {output}; counted in {seconds:.1f} s")
    return 0
