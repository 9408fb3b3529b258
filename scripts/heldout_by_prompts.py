"""Held-out accuracy of head checkpoints on each data file's held-out split separately.

Training on several files scores one mixed held-out set; this says where a gain lands (for example, answers
to ShareGPT prompts against answers to the project's prompts). Each file's held-out records are the ones
training held out (same id hash and fraction); the top-1 / top-5 rank each checkpoint's own draft vocabulary
(or the first file's ``--vocab`` most frequent answer tokens when it has none), as drafting does.

    python scripts/heldout_by_prompts.py --data data/smollm2_selfdistill.jsonl --data /tmp/sharegpt_first4518.jsonl \
        --heads model_cards/cerberus-smollm2-135m-instruct --heads /tmp/big_cerberus
"""

from __future__ import annotations

import argparse

import torch

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.real_models import load_named_model
from cerberus_hf.training.data import frequent_tokens, read_records
from cerberus_hf.training.hidden_cache import build_hidden_cache, split_record_ids
from cerberus_hf.training.trainer import EVAL_SUBSET_SEED, _subset, default_cache_dir, evaluate_heads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", action="append", required=True, help="data files, in the order training read them")
    parser.add_argument("--heads", action="append", required=True)
    parser.add_argument("--base", default="smollm2-135m-instruct")
    parser.add_argument("--eval-fraction", type=float, default=0.05)
    parser.add_argument("--positions", type=int, default=4096, help="held-out positions scored per file")
    parser.add_argument("--vocab", type=int, default=4096)
    args = parser.parse_args()

    base = load_named_model(args.base, torch.float32, with_tokenizer=False)[0]
    files = [read_records(path) for path in args.data]
    cache = build_hidden_cache(base, [r for records in files for r in records], default_cache_dir(), teacher_topk=0)
    fallback = frequent_tokens(files[0], args.vocab)
    print("| heads | " + " | ".join(f"{path}: top-1 | {path}: top-5" for path in args.data) + " |")
    print("|---" * (1 + 2 * len(files)) + "|")
    for folder in args.heads:
        model = CerberusForCausalLM.from_pretrained(folder, base_model=base).float()
        vocab = model.heads.draft_vocab if model.heads.draft_vocab is not None else fallback
        cells = []
        for records in files:
            held_out = split_record_ids([r.id for r in records], args.eval_fraction)
            positions = _subset(cache.positions(record_ids=held_out), args.positions, EVAL_SUBSET_SEED)
            result = evaluate_heads(model, cache, positions, vocab=vocab)
            cells += [" / ".join(f"{v:.3f}" for v in result[key]) for key in ("top1", "top5")]
        print(f"| {folder} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
