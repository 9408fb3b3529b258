"""How a one-token forward's linear layers compute fastest on a CPU: through the base's own `linear` (MKL), through
weights packed for 8 rows (`cerberus_hf.blocks.packed`, what decoding uses), or through oneDNN on the weight as it is
(`torch.ops.mkldnn._linear_pointwise` on the unpacked weight; several-token forwards stay packed).

    python benchmarks/one_row_kernels_avx2_epyc_2026_12_07/one_row_forward_times.py --base qwen2.5-coder-1.5b-instruct \
        [--repeats 12] [--json out.json]

Part 1: one cached forward over n new tokens after 300 cached ones (the cache cut back after each), the three ways
interleaved, medians of --repeats; the largest difference of a one-token forward's logits from the base's own.
Part 2: one row through every linear weight of the base in turn (a forward's weights, without the rest of it), packed
and as it is, interleaved, summed by weight shape. The committed JSON was made by this script's first version
(commit 53ebeb3), which patched the third way in and used calibration's timer; it now runs the library's
`packed_view(..., one_row_as_is=True)`, which computes the same, and a timer of its own.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from typing import Callable

import torch
from torch import nn
from transformers import DynamicCache

from cerberus_hf.blocks.packed import PackedWeights, packed_view
from cerberus_hf.hardware import describe_device
from cerberus_hf.real_models import PACKAGED_MODELS, load_packaged_model

SIZES = (1, 2, 5, 8)
ROWS = 8  # the row count `cerberus_hf.blocks.packed` packs for


def forward_timer(model, context: int = 300) -> Callable[[int], float]:
    """Seconds of one forward of ``model`` over n new random tokens after a ``context``-token random prefix."""
    generator = torch.Generator().manual_seed(0)
    cache = DynamicCache(config=model.config)
    model(torch.randint(100, 40000, (1, context), generator=generator), cache=cache, use_cache=True)

    def forward(n: int) -> float:
        tokens = torch.randint(100, 40000, (1, n), generator=generator)
        start = time.perf_counter()
        model(tokens, cache=cache, position_ids=torch.arange(context, context + n)[None], use_cache=True)
        seconds = time.perf_counter() - start
        cache.crop(-n)
        return seconds

    return forward


def forward_times(base, repeats: int) -> dict:
    weights = PackedWeights()
    views = {"own linear": base, "packed": packed_view(base, weights),
             "packed, one row as it is": packed_view(base, weights, one_row_as_is=True)}
    timers = {name: forward_timer(view) for name, view in views.items()}
    for timer in timers.values():
        timer(1), timer(1)
    seconds = {(name, n): [] for name in timers for n in SIZES}
    for _ in range(repeats):
        for n in SIZES:
            for name, timer in timers.items():
                if not (name.endswith("as it is") and n > 1):  # several rows: the packed way, already timed
                    seconds[name, n].append(timer(n))
    ids = torch.randint(100, 1000, (1, 20), generator=torch.Generator().manual_seed(0))
    logits = {name: view(ids).logits[0, -1] for name, view in views.items()}  # the prompt's forward: several rows
    one = {}
    for name, view in views.items():  # the last token's forward after the others': one row
        cache = DynamicCache(config=base.config)
        view(ids[:, :-1], cache=cache, use_cache=True)
        one[name] = view(ids[:, -1:], cache=cache, use_cache=True).logits[0, -1]
    return {
        "ms": {name: {n: 1000 * statistics.median(seconds[name, n]) for n in SIZES if seconds[name, n]}
               for name in timers},
        "max_logit_difference_one_row": {name: float((one[name] - one["own linear"]).abs().max()) for name in one},
        "same_argmax_one_row": len({int(v.argmax()) for v in one.values()}) == 1,
        "max_logit_difference_prompt": {name: float((logits[name] - logits["own linear"]).abs().max()) for name in logits},
    }


def weight_pass(base, repeats: int) -> dict:
    linears = [m for m in base.modules() if isinstance(m, nn.Linear)]
    layouts = [torch.ops.mkldnn._reorder_linear_weight(m.weight, ROWS) for m in linears]
    rows = {m.in_features: torch.randn(1, m.in_features, dtype=m.weight.dtype) for m in linears}

    def one_pass(use_packed: bool) -> dict:
        spent = collections.defaultdict(float)
        for linear, layout in zip(linears, layouts):
            start = time.perf_counter()
            torch.ops.mkldnn._linear_pointwise(rows[linear.in_features], layout if use_packed else linear.weight,
                                               None, "none", [], "")
            spent[tuple(linear.weight.shape)] += time.perf_counter() - start
        return spent

    one_pass(True), one_pass(False)
    spent = {True: collections.defaultdict(list), False: collections.defaultdict(list)}
    for _ in range(repeats):
        for way in (True, False):
            for shape, seconds in one_pass(way).items():
                spent[way][shape].append(seconds)
    count = collections.Counter(tuple(m.weight.shape) for m in linears)
    return {f"{o}x{i}": {"weights": count[(o, i)], "packed_ms": 1000 * statistics.median(spent[True][(o, i)]),
                         "as_it_is_ms": 1000 * statistics.median(spent[False][(o, i)])} for o, i in count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="qwen2.5-coder-1.5b-instruct", choices=sorted(PACKAGED_MODELS))
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    base, _ = load_packaged_model(PACKAGED_MODELS[args.base], dtype=torch.float32)
    result = {"base": args.base, "dtype": "float32", "machine": describe_device(base.device),
              "threads": torch.get_num_threads(), "forward": forward_times(base, args.repeats),
              "weight_pass": weight_pass(base, args.repeats)}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(result, file, indent=1)


if __name__ == "__main__":
    main()
