"""tau of shipped heads (their calibrated tree and gate) for several prompt-lookup lengths, on prompts of
the training data's held-out split (never MT-Bench), to choose ``prompt_lookup_num_tokens``.

    python scripts/lookup_sweep.py [N_PROMPTS] [--heads FOLDER] [--lengths 0 3 5 8]
"""

from __future__ import annotations

import argparse

import torch

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.training.data import read_records
from cerberus_hf.training.hidden_cache import split_record_ids
from cerberus_hf.real_models import load_named_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", type=int, nargs="?", default=6)
    parser.add_argument("--heads", default="model_cards/cerberus-smollm2-135m-instruct")
    parser.add_argument("--data", default="data/smollm2_selfdistill.jsonl")
    parser.add_argument("--lengths", type=int, nargs="+", default=[0, 3, 5, 8])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()

    torch.set_num_threads(2)
    base, _ = load_named_model("smollm2-135m-instruct", torch.float32)
    model = CerberusForCausalLM.from_pretrained(args.heads, base_model=base)
    records = read_records(args.data)
    held_out = split_record_ids([r.id for r in records], 0.05)  # training's default eval_fraction
    prompts = [torch.tensor([r.input_ids]) for r in records if r.id in held_out and r.mode == "greedy"][: args.prompts]
    print(f"{len(prompts)} held-out prompts")
    for length in args.lengths:
        steps = tokens = 0
        for prompt in prompts:
            model.generate(prompt, max_new_tokens=args.max_new_tokens, prompt_lookup_num_tokens=length)
            steps += model.generation_stats.steps
            tokens += model.generation_stats.new_tokens
        print(f"prompt_lookup_num_tokens {length}: tau {tokens / steps:.3f} ({tokens} tokens / {steps} forwards)",
              flush=True)


if __name__ == "__main__":
    main()
