# Reproduces: the README's "a step syncs with the host once" on CUDA (docs/cuda.md: 1.1 syncs a step;
#   benchmarks/cuda_h200_fp32_scale_2026_11_27/syncs_*.txt); step 3 of scripts/gpu_run.sh.
# Run (on a GPU): python scripts/count_host_syncs.py --tiny llama --head-type hydra --max-new-tokens 48
"""Count the host-device synchronisations of one `generate()` call on CUDA, and say where they come from.

A draft-verify step must sync at least once (the host reads how many draft tokens were accepted to cut
the cache and to choose the next draft); every further sync stalls the GPU while Python catches up. This
runs one call under ``torch.cuda.set_sync_debug_mode("warn")``, which warns at each synchronising
operation, and groups the warnings by the line of this library (or of transformers) that caused them.

    python scripts/count_host_syncs.py --heads model_cards/hydra-smollm2-135m-instruct --dtype bfloat16
    python scripts/count_host_syncs.py --tiny llama --head-type hydra       # a tiny random base, no download
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import traceback
import warnings
from pathlib import Path

import torch

from cerberus_hf.blocks.profiling import asking_line


def count_syncs(model, input_ids: torch.Tensor, **generate_kwargs) -> dict:
    """Run ``model.generate`` once with sync warnings on; the count per causing line, and the call's steps."""
    where: collections.Counter[str] = collections.Counter()
    original = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            where[asking_line(traceback.extract_stack()[:-1])] += 1
        else:
            original(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            model.generate(input_ids, **generate_kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = original
    stats = getattr(model, "generation_stats", None)
    steps = stats.steps if stats is not None else None
    total = sum(where.values())
    return {"syncs": total, "steps": steps, "syncs_per_step": total / steps if steps else None,
            "new_tokens": stats.new_tokens if stats is not None else None,
            "by_line": dict(where.most_common())}


def model_and_prompt(heads: str | None, tiny: str | None, head_type: str, device: str, dtype: torch.dtype
                     ) -> tuple[torch.nn.Module, torch.Tensor]:
    """(a drafted model in eval mode on ``device``, one prompt's ids): untrained ``head_type`` heads on a ``tiny`` random
    base of that architecture (`cerberus_hf.testing`), or the ``heads`` folder on the real base it names, asked why the
    sky is blue."""
    from cerberus_hf import CerberusForCausalLM

    if tiny:
        from cerberus_hf.testing import prompt_ids, tiny_model

        model = CerberusForCausalLM.from_base(tiny_model(tiny).to(device, dtype), head_type=head_type)
        input_ids = prompt_ids(0, length=16).to(device)
        # a tiny random base may emit EOS at once, and a 1-token call says nothing about a step; min_new_tokens would
        # add a logits processor, which takes the loop off its one-read path, so there is no EOS to stop at instead
        for config in (model.generation_config, model.base.generation_config):
            config.eos_token_id = None
    else:
        from cerberus_hf.real_models import load_named_model

        base, tokenizer = load_named_model("smollm2-135m-instruct", dtype=dtype)
        model = CerberusForCausalLM.from_pretrained(heads, base_model=base.to(device))
        chat = [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}]
        input_ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                                  return_dict=True)["input_ids"].to(device)
    return model.eval(), input_ids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", help="head checkpoint folder (the real base it names is loaded)")
    parser.add_argument("--tiny", help="a tiny random base of this architecture (cerberus_hf.testing) instead")
    parser.add_argument("--head-type", default="hydra", help="with --tiny: untrained heads of this family")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--json", help="write the counts here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("count_host_syncs needs a CUDA device")
    model, input_ids = model_and_prompt(args.heads, args.tiny, args.head_type, "cuda", getattr(torch, args.dtype))
    report = {"device": torch.cuda.get_device_name(), "dtype": args.dtype, "heads": args.heads or args.tiny,
              "max_new_tokens": args.max_new_tokens, "runs": {}}
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False)
    for label, target in (("drafted (the checkpoint's defaults)", model), ("plain generate() of the base", model.base)):
        target.generate(input_ids, **kwargs)  # warm-up: first-call allocations are not the steady state
        report["runs"][label] = count_syncs(target, input_ids, **kwargs)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    for label, run in report["runs"].items():
        print(f"{label}: {run['syncs']} syncs over {run['steps']} steps "
              f"({run['syncs_per_step'] if run['syncs_per_step'] is None else round(run['syncs_per_step'], 1)} "
              f"per step, {run['new_tokens']} new tokens)")
        for line, n in list(run["by_line"].items())[:15]:
            print(f"  {n:5d}  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
