"""Build cerberus_hf/data/prompts.jsonl: a diverse, original prompt set for self-distillation.

The command line: make the prompts (`build`), check them against the MT-Bench file (no prompt may share a run of 8 or
more words with any of its questions; a hit is printed and the exit status is 1), write the JSONL and print its
statistics. Part of `make_prompts`, which reproduces `cerberus_hf/data/prompts.jsonl`: `python scripts/make_prompts`
(see `__init__.py`).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from pathlib import Path

from cerberus_hf.training.data import MT_BENCH_QUESTIONS, OVERLAP_WORDS, Decontaminator, words

from .build import build

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUTPUT = ROOT / "cerberus_hf" / "data" / "prompts.jsonl"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--bench", type=Path, default=MT_BENCH_QUESTIONS, help="MT-Bench JSONL to check against")
    args = parser.parse_args(argv)

    prompts = build(args.seed)
    if args.bench.is_file():
        check = Decontaminator([args.bench])
        hits = [(p["id"], check.shared({"prompt": p["turns"][0]})) for p in prompts]
        hits = [(pid, " ".join(shared)) for pid, shared in hits if shared]
        print(f"contamination check vs {args.bench}: {len(hits)} prompt(s) share a run of >= {OVERLAP_WORDS} words")
        for pid, shared in hits[:20]:
            print(f"  {pid}: ...{shared}...")
        if hits:
            return 1
    else:
        print(f"contamination check skipped: {args.bench} not found", file=sys.stderr)

    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("w", encoding="utf-8") as handle:
        for p in prompts:
            handle.write(json.dumps(p, ensure_ascii=False) + "\n")

    counts = collections.Counter(p["category"] for p in prompts)
    lengths = [len(words(p["turns"][0])) for p in prompts]
    print(f"wrote {len(prompts)} prompts to {args.output}")
    print(f"words per prompt: mean {statistics.mean(lengths):.1f}, median {statistics.median(lengths)}, "
          f"min {min(lengths)}, max {max(lengths)}")
    for category, n in sorted(counts.items()):
        cl = [len(words(p["turns"][0])) for p in prompts if p["category"] == category]
        print(f"  {category:15s} {n:4d}  mean words {statistics.mean(cl):6.1f}")
    return 0
