"""How fast `cerberus-hf distill` makes the base's answers here, per engine and batch size, and whether those
answers are the base's own.

Every configuration answers the same prompts (greedy, from a fresh file) one after the other; the table gives
answer tokens per second of wall time (prefill included) and, against plain one-at-a-time ``generate()`` in
the same dtype on the first ``--check`` prompts, how many answers are identical and how much of each answer
matches before the first difference (batched float arithmetic may round differently and flip a near-tie).

    python benchmarks/distill_throughput_amx_cpu/distill_throughput.py --prompts sharegpt --limit 256 \
        --max-new-tokens 128 --config continuous:64 --config continuous:128 --config transformers:128 --check 16
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from cerberus_hf.real_models import load_named_model
from cerberus_hf.training.data import Decontaminator, load_prompts, read_records
from cerberus_hf.training.distill import encode_prompt, eos_ids, generate_distillation_data, trim_at_eos


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown"


@torch.inference_mode()
def reference_answers(model, tokenizer, prompts, max_new_tokens: int) -> dict[str, list[int]]:
    eos = eos_ids(model, tokenizer)
    answers = {}
    for p in prompts:
        ids = encode_prompt(tokenizer, p["messages"], None)
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=sorted(eos) or None)
        answers[p["id"]] = trim_at_eos(out[0, len(ids):].tolist(), eos)[0]
    return answers


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", default="sharegpt")
    parser.add_argument("--limit", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--config", action="append", default=None, metavar="ENGINE:BATCH",
                        help="engine and batch size (repeatable; default continuous:16 continuous:64 "
                             "continuous:128 transformers:128)")
    parser.add_argument("--check", type=int, default=16, help="prompts compared with one-at-a-time generate()")
    parser.add_argument("--json", default=None, help="write the table here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    configs = args.config or ["continuous:16", "continuous:64", "continuous:128", "transformers:128"]

    model, tokenizer = load_named_model(args.model, getattr(torch, args.dtype))
    prompts = load_prompts(args.prompts, limit=args.limit, decontaminate=Decontaminator(), english_only=True)
    prompts = [p for p in prompts if len(encode_prompt(tokenizer, p["messages"], None)) <= args.max_prompt_tokens]
    checked = prompts[: args.check]
    started = time.perf_counter()
    reference = reference_answers(model, tokenizer, checked, args.max_new_tokens)
    plain_tokens = sum(len(a) for a in reference.values())
    plain_rate = plain_tokens / (time.perf_counter() - started)

    rows = [{"engine": "generate, one at a time", "batch": 1, "answers": len(checked), "tokens": plain_tokens,
             "tokens_per_s": plain_rate, "identical": len(checked), "prefix_share": 1.0}]
    with tempfile.TemporaryDirectory() as folder:
        for config in configs:
            engine, batch = config.split(":")
            path = Path(folder) / f"{engine}-{batch}.jsonl"
            started = time.perf_counter()
            generate_distillation_data(model, tokenizer, prompts, path, batch_size=int(batch),
                                       max_new_tokens=args.max_new_tokens, sample_fraction=0.0, engine=engine,
                                       progress=False)
            seconds = time.perf_counter() - started
            records = {r.id: list(r.output_ids) for r in read_records(path)}
            tokens = sum(len(a) for a in records.values())
            same, shares = 0, []
            for pid, answer in reference.items():
                got = records[pid]
                same += got == answer
                prefix = next((i for i, (a, b) in enumerate(zip(got, answer)) if a != b), min(len(got), len(answer)))
                shares.append(prefix / max(len(answer), 1))
            rows.append({"engine": engine, "batch": int(batch), "answers": len(records), "tokens": tokens,
                         "tokens_per_s": tokens / seconds, "identical": same, "prefix_share": sum(shares) / len(shares)})
            print(json.dumps(rows[-1]), flush=True)

    print(f"\ndistill throughput: {args.model} {args.dtype}, {len(prompts)} prompts from {args.prompts}, "
          f"{args.max_new_tokens} new tokens, {torch.get_num_threads()} threads, {cpu_model()}\n")
    print(f"| engine | batch | answers | answer tokens | tokens/s | identical to generate() (of {len(checked)}) "
          "| matching prefix |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['engine']} | {r['batch']} | {r['answers']} | {r['tokens']} | {r['tokens_per_s']:.1f} | "
              f"{r['identical']} | {r['prefix_share']:.1%} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_model(), "threads": torch.get_num_threads(),
                                               "args": vars(args), "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
