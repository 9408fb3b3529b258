"""Teacher-forced accuracy of an EAGLE-3 drafter per depth, on several answer files, for several draft vocabularies.

Why: the shipped EAGLE-3 drafter's held-out top-1 (0.66 at depth 0) promises more than it gets on MT-Bench (tau 2.4
against the 2.76 calibration's walk expects on held-out ShareGPT answers). This splits the gap into its parts: the
answers' domain (the same drafter on MT-Bench answers and on ShareGPT records it never saw, both cut to the bench's
length) and the draft vocabulary (how many answer tokens it holds, and what widening it at serving time would give:
the projection is the frozen base ``lm_head``, so any vocabulary can be scored without retraining).

The MT-Bench answers are the base's own greedy answers, made for evaluation only (`distill` refuses MT-Bench prompts
by default, so it is given an unrelated decontamination file):

    echo '{"turns": ["an unrelated placeholder"]}' > /tmp/none.jsonl
    cerberus-hf distill --prompts ../shared/bench/mt_bench.jsonl --turns first --decontaminate /tmp/none.jsonl \
        --output /tmp/mtb_answers.jsonl --max-new-tokens 128 --batch-size 16 --dtype float32
    python benchmarks/eagle3_domain_accuracy_epyc_cpu/eagle3_domain_accuracy.py \
        --heads model_cards/eagle3-smollm2-135m-instruct \
        --answers mt-bench=/tmp/mtb_answers.jsonl --answers sharegpt-unseen=data/sharegpt_selfdistill.jsonl:8752:150

An ``--answers`` file may name ``:SKIP:LIMIT`` records (the ShareGPT file's records from 8,752 on were added after
every shipped drafter was trained). Only greedy records are scored. The vocabularies are the ``--rank-data`` files'
most frequent answer tokens, as ``train --train-vocab`` chooses them; the folder's own draft vocabulary is scored
first.
"""

from __future__ import annotations

import argparse
import json
import tempfile

import torch

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.real_models import load_named_model
from cerberus_hf.training.data import Record, frequent_tokens, read_records
from cerberus_hf.training.sequence_trainer import evaluate_unrolled, record_batches


def records_of(spec: str, greedy_only: bool = False) -> list[Record]:
    """The records ``PATH[:SKIP[:LIMIT]]`` names: the file's from record SKIP on (only its greedy ones where asked), at
    most LIMIT of them."""
    path, *bounds = spec.split(":")
    skip = int(bounds[0]) if bounds else 0
    limit = int(bounds[1]) if len(bounds) > 1 else None
    return [r for r in read_records(path)[skip:] if r.mode == "greedy" or not greedy_only][:limit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", required=True, help="a folder of EAGLE-3 heads")
    parser.add_argument("--base", default="smollm2-135m-instruct")
    parser.add_argument("--answers", action="append", required=True, help="NAME=PATH[:SKIP[:LIMIT]], repeatable")
    parser.add_argument("--rank-data", action="append",
                        default=["data/smollm2_selfdistill.jsonl", "data/sharegpt_selfdistill.jsonl:0:8752"],
                        help="PATH[:SKIP:LIMIT] whose answer tokens rank the vocabularies (default: the training data)")
    parser.add_argument("--cut", type=int, default=128, help="answer tokens kept per record (the bench's length)")
    parser.add_argument("--vocab", type=int, nargs="+", default=[8192, 16384, 0],
                        help="vocabulary sizes scored besides the folder's own (0: the whole vocabulary)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="write the table here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    base, _ = load_named_model(args.base, dtype=torch.float32, with_tokenizer=False)
    drafter = CerberusForCausalLM.from_pretrained(args.heads, base_model=base).heads
    # as `train --train-vocab` ranks them (`frequent_tokens`); a size of 0 scores the whole vocabulary
    ranked = frequent_tokens([r for spec in args.rank_data for r in records_of(spec)], max(args.vocab))
    own = getattr(drafter, "draft_vocab", None)
    choices = ([("own", own)] if own is not None else []) + [(str(size), ranked[:size] if size else None)
                                                             for size in args.vocab]

    table = []
    with tempfile.TemporaryDirectory() as cache:
        for spec in args.answers:
            name, _, source = spec.partition("=")
            records = [Record(r.id, r.input_ids, r.output_ids[: args.cut], r.mode, r.finished)
                       for r in records_of(source, greedy_only=True)]
            batches = record_batches(base, drafter, records, cache)
            tokens = torch.tensor([t for r in records for t in r.output_ids])
            for label, vocab in choices:
                coverage = 1.0 if vocab is None else torch.isin(tokens, vocab).float().mean().item()
                result = evaluate_unrolled(drafter, batches, vocab=vocab)
                size = int(base.config.vocab_size) if vocab is None else len(vocab)
                row = {"answers": name, "records": len(records), "vocab": label, "size": size,
                       "coverage": round(coverage, 4), "top1": result["top1"], "positions": result["positions"][0]}
                table.append(row)
                print(f"| {name} | {row['records']} | {label} ({size}) | {coverage:.3f} | "
                      + " | ".join(f"{v:.3f}" for v in result["top1"]) + " |", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"heads": args.heads, "cut": args.cut, "rows": table}, handle, indent=1)


if __name__ == "__main__":
    main()
