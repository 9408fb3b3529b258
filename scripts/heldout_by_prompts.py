"""Held-out accuracy of head checkpoints on each data file's held-out split separately.

Training on several files scores one mixed held-out set; this says where a gain lands (for example, answers
to ShareGPT prompts against answers to the project's prompts). Each file's held-out records are the ones
training held out (same id hash and fraction); the top-1 / top-5 rank each checkpoint's own draft vocabulary
(or the first file's ``--vocab`` most frequent answer tokens when it has none), as drafting does. Heads are
scored on ``--positions`` held-out positions of each file (the hidden-state cache); a drafter that drafts
chains through the base's first layers (Kangaroo) on all of them, from the exit states training wrote.

    python scripts/heldout_by_prompts.py --data data/smollm2_selfdistill.jsonl --data /tmp/sharegpt_first4518.jsonl \
        --heads model_cards/cerberus-smollm2-135m-instruct --heads /tmp/big_cerberus
"""

from __future__ import annotations

import argparse

import torch

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.real_models import load_named_model
from cerberus_hf.training.chain_trainer import AdapterBatch, evaluate_adapter, exit_states
from cerberus_hf.training.sequences import group_by_tokens, heldout_members
from cerberus_hf.training.data import frequent_tokens, read_records
from cerberus_hf.training.hidden_cache import build_hidden_cache, default_cache_dir, record_sequence, split_record_ids
from cerberus_hf.training.evaluation import EVAL_SUBSET_SEED, evaluate_heads, position_subset


def chain_heldout(model, states: list[torch.Tensor], lengths: list[int], records, answers: list[int], members,
                  held_out: set[str], vocab: torch.Tensor) -> dict:
    """A chain drafter's next-token accuracy on every held-out answer position among ``records[members]``,
    teacher-forced as training scores it (`chain_trainer.evaluate_adapter`) from ``states``, the exit states
    training wrote for the full list ``records`` it read (``lengths``: their lengths, computed once per layer)."""
    chosen = sorted(heldout_members(records, answers, held_out, members), key=lengths.__getitem__)
    batches = [AdapterBatch(group, states, answers, records, None, 0.0, torch.device("cpu"))
               for group in group_by_tokens(chosen, lengths, 4096)]
    return evaluate_adapter(model.heads, batches, vocab=vocab)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", action="append", required=True, help="data files, in the order training read them")
    parser.add_argument("--heads", action="append", required=True)
    parser.add_argument("--base", default="smollm2-135m-instruct")
    parser.add_argument("--eval-fraction", type=float, default=0.05)
    parser.add_argument("--positions", type=int, default=4096, help="held-out positions scored per file")
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--teacher-topk", type=int, default=0,
                        help="read the hidden-state cache built with this --teacher-topk (the states are the same)")
    args = parser.parse_args()

    base = load_named_model(args.base, torch.float32, with_tokenizer=False)[0]
    files = [read_records(path) for path in args.data]
    records = [r for part in files for r in part]
    models = {folder: CerberusForCausalLM.from_pretrained(folder, base_model=base).float() for folder in args.heads}
    max_seq_len = getattr(base.config, "max_position_embeddings", None)
    answers = [record_sequence(r, max_seq_len)[1] for r in records]
    chains = {folder for folder, m in models.items() if getattr(m.heads, "drafts_chains", False)}
    states = {layer: exit_states(base, records, layer, default_cache_dir(), max_seq_len)
              for layer in {models[folder].heads.exit_layer for folder in chains}}
    lengths = {layer: [s.shape[0] for s in layer_states] for layer, layer_states in states.items()}
    if len(chains) < len(models):
        cache = build_hidden_cache(base, records, default_cache_dir(), teacher_topk=args.teacher_topk)
    held_outs = [split_record_ids([r.id for r in part], args.eval_fraction) for part in files]
    fallback = frequent_tokens(files[0], args.vocab)
    print("| heads | " + " | ".join(f"{path}: top-1 | {path}: top-5" for path in args.data) + " |")
    print("|---" * (1 + 2 * len(files)) + "|")
    for folder, model in models.items():
        vocab = model.heads.draft_vocab if model.heads.draft_vocab is not None else fallback
        cells = []
        start = 0
        for part, held_out in zip(files, held_outs):
            if folder in chains:
                layer = model.heads.exit_layer
                members = range(start, start + len(part))
                result = chain_heldout(model, states[layer], lengths[layer], records, answers, members, held_out,
                                       vocab)
            else:
                positions = position_subset(cache.positions(record_ids=held_out), args.positions, EVAL_SUBSET_SEED)
                result = evaluate_heads(model, cache, positions, vocab=vocab)
            start += len(part)
            cells += [" / ".join(f"{v:.3f}" for v in torch.atleast_1d(torch.tensor(result[key])).tolist())
                      for key in ("top1", "top5")]
        print(f"| {folder} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
