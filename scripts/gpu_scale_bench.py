# Reproduces: the README's H200 numbers (benchmarks/cuda_h200_fp32_scale_2026_11_27/): on an 8B-shaped random base in
#   fp32, oracle drafts 4.82x plain generate() (tau 4.74), drafts matched to the shipped Hydra 2.08x (tau 2.34), 0.95x
#   the compiled static-cache peer; the 1B shape with oracle drafts 5.26x through the loop's compiled static cache.
# Run (on a GPU): python scripts/gpu_scale_bench.py --shape llama-3.1-8b --device cuda --dtype float32 --prompts 4 \
#        --batch-sizes 1 --acceptance benchmarks/mt_bench_bf16_amx_cpu/mt_bench_bf16_amx_cpu.json
#      python scripts/gpu_scale_bench.py --shape llama-3.2-1b --device cuda --dtype float32 --prompts 4 \
#        --batch-sizes 1 --drafts oracle          (step 2 of scripts/gpu_run.sh runs it in bf16)
"""The decoding machinery at the scale users run, with nothing to download: bases built from the configs of real 1B-8B
models with random weights, drafts from an oracle that knows the base's greedy continuation, optionally corrupted per
depth to match the acceptance real heads reach (issue 38, part 3; batch sizes for issue 39).

    python scripts/gpu_scale_bench.py --shape llama-3.1-8b --device cuda --batch-sizes 1 4 16
    python scripts/gpu_scale_bench.py --shape llama-3.2-1b --layers 2 --device cpu --prompts 2 --new 16   # a dry run

The drafter is a real Hydra drafter of the base's width (untrained: its drafting costs what a real one's does); only
its logits are replaced, on the device, by the oracle's (no host read per node), so the loop, the trees, the
verification forward and the cache are the real ones. ``--acceptance FILE`` corrupts depth k's guess wherever a
seeded draw exceeds the per-depth acceptance a bench JSON recorded for a shipped checkpoint (its best row's
``head_acceptance``), so tau is about what those heads reach; the run first drafts with every draft right (tau about
the depth + 1), then, given ``--acceptance``, again with the corrupted drafts, in the same process. Prints, per kind of
drafts and batch size: plain `generate()`, the static-cache peer (which generate() compiles on CUDA), the oracle
drafter's chain, and at batch 1 the same through the loop's own static cache (`decoding.static_cache`, compiled as the
peer is): tokens/s, speedup, tau, identical share, host reads per step and, on CUDA, the host-device
synchronisations per step that `torch.cuda.set_sync_debug_mode` reports (`scripts/count_host_syncs.py`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.blocks.profiling import HostReads, synchronize

from count_host_syncs import count_syncs  # scripts/ is on the path when run as a script

SHAPES = {  # the published configs' shapes (no weights are read)
    "llama-3.2-1b": dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
                         tie_word_embeddings=True),
    "llama-3.1-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0),
    "qwen2.5-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, rope_theta=1000000.0),
}


def build_base(shape: str, layers: int | None, device: str, dtype: torch.dtype, seed: int = 0, robust: bool = False):
    """A base of ``shape`` with random weights. ``robust``: weights chosen so that greedy choices survive bf16 rounding
    (see `make_robust`); the same shapes and kernels, so a step costs what it costs."""
    values = dict(SHAPES[shape], max_position_embeddings=4096, bos_token_id=1, eos_token_id=None, pad_token_id=0)
    if layers:
        values["num_hidden_layers"] = layers
    if robust:
        values["tie_word_embeddings"] = False
    config = AutoConfig.for_model(**values)
    torch.manual_seed(seed)
    with torch.device(device):
        base = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        if robust:
            make_robust(base, seed)
        else:  # sharper than the initialisation's near-uniform logits, so greedy choices are clear
            base.get_output_embeddings().weight.mul_(8.0)
    return base.eval()


def make_robust(base, seed: int) -> None:
    """Make a random base's greedy path independent of rounding: the token embedding dominates the residual stream
    (embeddings x100, each layer's output projections x0.01), and the output rows are the embeddings permuted (/100),
    so the next token is a fixed permutation of the current one, by a margin no bf16 rounding closes. A random base's
    greedy path otherwise splits between shapes of the same forward in bf16, and an oracle that follows plain
    `generate()` loses track (2026-11-27)."""
    embedding = base.get_input_embeddings().weight
    embedding.mul_(100.0)
    for name, module in base.named_modules():
        if name.rsplit(".", 1)[-1] in ("o_proj", "down_proj"):
            module.weight.mul_(0.01)
    order = torch.randperm(embedding.shape[0], generator=torch.Generator().manual_seed(seed)).to(embedding.device)
    base.get_output_embeddings().weight.copy_(embedding[order] / 100.0)


def install_device_oracle(model: CerberusForCausalLM, references: torch.Tensor, acceptance: list[float] | None,
                          seed: int = 0) -> None:
    """Replace the heads' logits by the oracle's: the state the heads read is matched (nearest, on the device) to the
    references' states; depth k ranks the token k + 2 ahead first, or a wrong one where a seeded draw exceeds
    ``acceptance[k]`` (the conditional acceptance of depth k)."""
    heads = model.heads
    with torch.no_grad(), heads.capture(model.base) as captured:
        model.base(references)
    table = captured["hidden"].reshape(-1, captured["hidden"].shape[-1]).float()
    # the nearest row by ||h - t||^2 = |h|^2 - 2 h.t + |t|^2: one product and an argmax a depth (torch.cdist launched
    # several kernels, 1.4 ms of host time a step of the bf16 profile on 2026-11-28: the bench's cost, not the loop's)
    half_norms = table.square().sum(dim=-1) / 2
    batch, length = references.shape
    ahead = torch.arange(length, device=references.device)[:, None] + 2 + torch.arange(heads.num_heads,
                                                                                      device=references.device)
    targets = references[:, ahead.clamp(max=length - 1)].reshape(-1, heads.num_heads)  # [batch * length, heads]
    generator = torch.Generator(device="cpu").manual_seed(seed)
    draws = torch.rand(table.shape[0], heads.num_heads, generator=generator).to(references.device)
    if acceptance is not None:
        keep = torch.tensor((acceptance + [acceptance[-1]] * heads.num_heads)[: heads.num_heads],
                            device=references.device)
        wrong = draws > keep  # per position and depth
        targets = torch.where(wrong, (targets + 1) % model.config.vocab_size, targets)
    real_class = getattr(heads, "_real_class", type(heads))  # installed again: the drafter's own class beneath

    class DeviceOracle(real_class):
        def draft_level(self, k, hidden, tokens, previous, context=None):
            state, logits = real_class.draft_level(self, k, hidden, tokens, previous, context)
            row = torch.addmm(half_norms, hidden.float(), table.T, alpha=-1).argmin(dim=-1)
            logits = torch.full_like(logits, -10.0)
            return state, logits.scatter(1, targets[row, k][:, None], 0.0)

    heads.__class__ = DeviceOracle
    heads._real_class = real_class


def timed(run, device) -> tuple[torch.Tensor, float]:
    synchronize(device)
    start = time.perf_counter()
    out = run()
    synchronize(device)
    return out, time.perf_counter() - start


_START = time.perf_counter()


def progress(message: str) -> None:
    """One line on stderr with the seconds since start: a run cut by its time limit still shows where the time went."""
    print(f"[{time.perf_counter() - _START:7.1f} s] {message}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than the shape (a dry run)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="float32 by default: in bf16 a random base's greedy path splits early between shapes of "
                             "the same forward (on an H200 no row, not even the compiled plain peer, matched plain "
                             "generate() over 128 tokens), so the oracle loses track and tau falls to about 1")
    parser.add_argument("--robust", action="store_true",
                        help="a base whose greedy choices survive bf16 rounding (`make_robust`): for bf16 and fp16")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8, help="random prompts of --prompt-length tokens")
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    parser.add_argument("--acceptance", default=None, metavar="BENCH_JSON",
                        help="match the per-depth acceptance of the first heads row of this bench JSON")
    parser.add_argument("--drafts", nargs="+", choices=("oracle", "matched"), default=["oracle", "matched"],
                        help="which kinds of drafts to run (matched needs --acceptance)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    base = build_base(args.shape, args.layers, args.device, dtype, robust=args.robust)
    progress(f"built the {args.shape}-shaped base on {args.device}")
    vocab = base.config.vocab_size
    generator = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, vocab, (args.prompts, args.prompt_length), generator=generator).to(args.device)
    acceptance = None
    if args.acceptance:
        rows = [r for r in json.load(open(args.acceptance))["methods"] if r.get("head_acceptance")]
        acceptance = rows[0]["head_acceptance"]
    call = dict(max_new_tokens=args.new, do_sample=False)
    # one prompt at a time, as plain generate() is timed: a batched forward's rounding can pick other tokens
    references = torch.cat([base.generate(prompts[i: i + 1], max_new_tokens=args.new + args.heads + 2, do_sample=False)
                            for i in range(args.prompts)])
    progress("greedy references generated")
    model = CerberusForCausalLM.from_base(base, head_type="hydra", num_heads=args.heads, gate_threshold=None)
    progress("drafter built")
    result = {"shape": args.shape, "layers": base.config.num_hidden_layers, "device": str(args.device),
              "dtype": args.dtype, "robust": args.robust, "acceptance": acceptance, "rows": []}
    on_cuda = str(args.device).startswith("cuda")
    if on_cuda:
        result["gpu"] = torch.cuda.get_device_name()
    # oracle drafts first, then (with --acceptance) the same drafter corrupted to the shipped heads' acceptance, in the
    # same process: the base, the references and the compiled graphs are built once
    kinds = ([None] if "oracle" in args.drafts else []) + ([acceptance] if acceptance and "matched" in args.drafts else [])
    for drafts in kinds:
        install_device_oracle(model, references, drafts)
        kind = "accuracy-matched" if drafts else "oracle"
        progress(f"{kind} drafts installed")
        print(f"\n{args.shape} ({base.config.num_hidden_layers} layers, random weights), {args.dtype} on {args.device}"
              + (f" ({result['gpu']})" if "gpu" in result else "") + f"; drafts: {kind}")
        print("| batch | method | tokens/s | speedup | tau | identical rows | host reads per step | syncs per step |")
        print("|---|---|---|---|---|---|---|---|")
        for size in args.batch_sizes:
            result["rows"] += bench_batch_size(args, base, model, prompts, size, call, kind, on_cuda)
            if args.json:  # after every batch size: a run cut by its time limit keeps what it finished
                with open(args.json, "w") as handle:
                    json.dump(result, handle, indent=1)
    return 0


def bench_batch_size(args, base, model, prompts, size: int, call: dict, kind: str, on_cuda: bool) -> list[dict]:
    """One interleaved run at one batch size: each method warmed up on the first batch at full length (so that the
    compiled forwards meet their timed shapes before the clock runs), then timed over every batch in rotating order."""
    batches = [prompts[i: i + size] for i in range(0, args.prompts, size)]
    methods = {"plain generate()": lambda ids: base.generate(ids, **call)}
    # generate() compiles the forward of a static-cache call itself on CUDA (not on a CPU)
    peer = "plain, static cache" + (", compiled" if on_cuda else "")
    methods[peer] = lambda ids: base.generate(ids, cache_implementation="static", **call)
    drafted = f"{kind} hydra chain of {args.heads}"
    methods[drafted] = lambda ids: model.generate(ids, device_step=False, **call)
    if size == 1:  # the draft-verify loop's static cache, compiled as the peer is (batches use the dynamic one)
        methods[f"{drafted}, {peer[len('plain, '):]}"] = lambda ids: model.generate(
            ids, cache_implementation="static", device_step=False, **call)
    # the whole step as one function of device buffers, in CUDA graphs on CUDA (decoding.device_step)
    stepped = f"{drafted}, device step"
    methods[stepped] = lambda ids: model.generate(ids, device_step=True, **call)
    totals = {name: [0, 0.0, 0, 0] for name in methods}  # tokens, seconds, identical rows, steps
    broken = {}
    for name, run in methods.items():  # warm-up (and the compiled forwards' compilation)
        start = time.perf_counter()
        try:
            run(batches[0])
        except Exception as error:  # noqa: BLE001 - a peer this transformers or device cannot run is reported
            broken[name] = f"{type(error).__name__}: {error}"[:160]
        progress(f"batch {size}: warmed up {name} in {time.perf_counter() - start:.1f} s"
                 + (f" (failed: {broken[name]})" if name in broken else ""))
    for index, ids in enumerate(batches):
        names = [n for n in methods if n not in broken]
        names = names[index % len(names):] + names[: index % len(names)]
        outputs = {}
        for name in names:
            out, seconds = timed(lambda: methods[name](ids), torch.device(args.device))
            outputs[name] = out
            totals[name][0] += (out.shape[1] - ids.shape[1]) * ids.shape[0]
            totals[name][1] += seconds
            if name.startswith(kind):
                totals[name][3] += model.generation_stats.steps
            progress(f"batch {size}, prompts {index * size}-{index * size + ids.shape[0] - 1}: {name} {seconds:.2f} s")
        reference = outputs["plain generate()"]
        for name, out in outputs.items():
            totals[name][2] += int((out == reference).all(dim=1).sum()) if out.shape == reference.shape else 0
    # counted on the uncompiled loop only: a torch function mode or the sync flag would recompile a compiled forward
    reads, syncs = {}, {}
    if drafted not in broken:
        with HostReads() as counter:
            model.generate(batches[0], device_step=False, **call)
        reads[drafted] = counter.total / model.generation_stats.steps
        if on_cuda:  # the GPU's own count of the host waits (torch.cuda.set_sync_debug_mode)
            syncs[drafted] = count_syncs(model, batches[0], device_step=False, **call)
            if stepped not in broken:
                syncs[stepped] = count_syncs(model, batches[0], device_step=True, **call)
    plain_rate = totals["plain generate()"][0] / totals["plain generate()"][1]
    rows = []
    for name, (tokens, seconds, same, steps) in totals.items():
        if name in broken:
            print(f"| {size} | {name} | not run: {broken[name]} | | | | | |")
            continue
        tau = tokens / steps if steps else 1.0
        sync = syncs.get(name)
        row = {"batch": size, "method": name, "drafts": kind, "tokens_per_s": tokens / seconds,
               "speedup": tokens / seconds / plain_rate, "tau": tau, "identical_rows": same / args.prompts,
               "host_reads_per_step": reads.get(name), "syncs_per_step": sync and sync["syncs_per_step"],
               "syncs_by_line": sync and sync["by_line"]}
        rows.append(row)
        read_text = "" if row["host_reads_per_step"] is None else f"{row['host_reads_per_step']:.1f}"
        sync_text = "" if row["syncs_per_step"] is None else f"{row['syncs_per_step']:.1f}"
        print(f"| {size} | {name} | {row['tokens_per_s']:.1f} | {row['speedup']:.2f}x | {tau:.2f} | "
              f"{same}/{args.prompts} | {read_text} | {sync_text} |", flush=True)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
