"""What threads buy: tokens/s of one shared model called from 1, 2 and 4 threads at once, plain generate() against
the shipped Hydra heads, in float32 and bfloat16, in one interleaved run on the same MT-Bench prompts.

Every thread count decodes the same prompts (split among the threads, each thread a queue of its own); the rounds
interleave every (dtype, method, threads) cell, so drift hits all alike. Each output is compared with plain
generate()'s in its dtype, decoded alone. Prints the table, writes the JSON and the plot.

    python benchmarks/threads_hydra_cpu/bench_threads.py [--prompts 8] [--max-new-tokens 64] [--threads 1 2 4] \
        [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import platform
import threading
import time
from pathlib import Path

import torch

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.hardware import describe_device
from cerberus_hf.real_models import load_named_model
from cerberus_hf.tools.bench import DEFAULT_PROMPTS, encode_prompts, load_bench_prompts

HEADS = "model_cards/hydra-smollm2-135m-instruct"


def decode_in_threads(generate, prompts: list[torch.Tensor], threads: int) -> tuple[float, dict[int, list[int]]]:
    """(wall seconds, outputs by prompt index) of ``prompts`` decoded by ``threads`` threads, prompt i by thread
    i % threads."""
    outputs: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads + 1)

    def work(index: int) -> None:
        barrier.wait()
        try:
            for i in range(index, len(prompts), threads):
                outputs[i] = generate(prompts[i])[0].tolist()
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in pool:
        thread.join()
    seconds = time.perf_counter() - start
    if errors:
        raise errors[0]
    return seconds, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8, help="MT-Bench questions (every 10th)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default="benchmarks/threads_hydra_cpu/threads_hydra_cpu.json")
    parser.add_argument("--plot", default="benchmarks/threads_hydra_cpu/threads_hydra_cpu.png")
    args = parser.parse_args()

    call = {"max_new_tokens": args.max_new_tokens, "do_sample": False}
    cells, alone = {}, {}
    tokenizer = None
    for dtype in ("float32", "bfloat16"):
        base, tokenizer = load_named_model("smollm2-135m-instruct", getattr(torch, dtype))
        model = CerberusForCausalLM.from_pretrained(HEADS, base_model=base)
        methods = {"plain generate()": lambda ids, base=base: base.generate(ids, **call),
                   "hydra": lambda ids, model=model: model.generate(ids, **call)}
        prompts = encode_prompts(tokenizer, load_bench_prompts(str(DEFAULT_PROMPTS), args.prompts, 10))
        alone[dtype] = [base.generate(ids, **call)[0].tolist() for ids in prompts]
        for name, generate in methods.items():
            for threads in args.threads:
                cells[(dtype, name, threads)] = {"generate": generate, "prompts": prompts, "seconds": [],
                                                 "tokens": 0, "identical": 0}
    for _ in range(args.rounds):
        for key, cell in cells.items():
            dtype, _, threads = key
            seconds, outputs = decode_in_threads(cell["generate"], cell["prompts"], threads)
            cell["seconds"].append(seconds)
            cell["tokens"] = sum(len(outputs[i]) - cell["prompts"][i].shape[1] for i in outputs)
            cell["identical"] = sum(outputs[i] == alone[dtype][i] for i in outputs)

    rows = []
    for (dtype, name, threads), cell in cells.items():
        seconds = min(cell["seconds"])
        plain_one = min(cells[(dtype, "plain generate()", args.threads[0])]["seconds"])
        plain_same = min(cells[(dtype, "plain generate()", threads)]["seconds"])
        rows.append({"dtype": dtype, "method": name, "threads": threads, "tokens_per_s": cell["tokens"] / seconds,
                     "vs_plain_same_threads": plain_same / seconds, "vs_plain_one_thread": plain_one / seconds,
                     "identical": f"{cell['identical']}/{len(cell['prompts'])}"})
    print(f"device: {describe_device('cpu')}; torch threads {torch.get_num_threads()}; {args.prompts} MT-Bench "
          f"prompts x {args.max_new_tokens} new tokens; best of {args.rounds} interleaved rounds")
    print("| dtype | method | threads | tokens/s | vs plain, same threads | vs plain, 1 thread | identical |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['dtype']} | {row['method']} | {row['threads']} | {row['tokens_per_s']:.1f} | "
              f"{row['vs_plain_same_threads']:.2f}x | {row['vs_plain_one_thread']:.2f}x | {row['identical']} |")
    Path(args.json).write_text(json.dumps({"device": describe_device("cpu"), "python": platform.python_version(),
                                           "torch": torch.__version__, "args": vars(args), "rows": rows}, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=False)
    for ax, dtype in zip(axes, ("float32", "bfloat16")):
        for name in ("plain generate()", "hydra"):
            points = [(r["threads"], r["tokens_per_s"]) for r in rows if r["dtype"] == dtype and r["method"] == name]
            ax.plot(*zip(*points), marker="o", label=name)
        ax.set_title(dtype)
        ax.set_xlabel("threads calling generate() on one model")
        ax.set_ylabel("tokens/s, all threads")
        ax.set_xticks(args.threads)
        ax.legend()
    figure.suptitle(describe_device("cpu"), fontsize=8)
    figure.tight_layout()
    figure.savefig(args.plot, dpi=120)
    print(f"wrote {args.json} and {args.plot}")


if __name__ == "__main__":
    main()
