"""How head accuracy grows with training data: train on nested fractions of a full-data run's training set
(its recipe and data files, read from its training metrics; same held-out split) and fit held-out top-1
against log(data).

    python scripts/data_scaling.py OUT_DIR [--fractions 0.125 0.25 0.5] [--full model_cards/cerberus-...]

Trains each missing fraction with `cerberus-hf train --train-fraction F` into OUT_DIR/cerberus-fF (runs
resume), reads `training_metrics.json`, and prints a Markdown table plus, per head, the slope of top-1
per doubling of the data and the data a straight-line extrapolation would need for a target top-1.
`--data` overrides the files (for a full run whose data files have moved).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
from pathlib import Path

def recipe(metrics: dict) -> list[str]:
    """`cerberus-hf train` arguments that repeat the run behind ``metrics`` (its ``training_metrics.json``)."""
    run = metrics["config"]
    flags = {"head-type": run["head_type"], "num-heads": run["num_heads"], "num-layers": run["num_layers"],
             "epochs": metrics["epochs"], "batch-size": run["batch_size"], "lr": run["lr"],
             "warmup-ratio": run["warmup_ratio"], "head-weight-decay": run["head_weight_decay"],
             "distill-weight": run["distill_weight"], "teacher-topk": run["teacher_topk"],
             "projection-dtype": run["projection_dtype"], "eval-fraction": run["eval_fraction"], "seed": run["seed"]}
    if run.get("train_vocab"):
        flags["train-vocab"] = run["train_vocab"]
    return [item for name, value in flags.items() for item in (f"--{name}", str(value))] + ["--eval-every", "0"]


def train(data: list[str], fraction: float, out: Path, arguments: list[str]) -> Path:
    folder = out / f"cerberus-f{fraction}"
    if not (folder / "training_metrics.json").exists():
        files = [item for path in data for item in ("--data", path)]
        subprocess.run(["cerberus-hf", "train", *files, "--output", str(folder), "--train-fraction", str(fraction),
                        *arguments], check=True)
    return folder


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line y = a + b x."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--data", action="append", help="data files (default: the full run's own)")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.125, 0.25, 0.5])
    parser.add_argument("--full", type=Path, default=Path("model_cards/cerberus-smollm2-135m-instruct"),
                        help="heads trained on all the data (fraction 1): their recipe is repeated on the fractions")
    parser.add_argument("--targets", type=float, nargs="+", default=[0.5, 0.7])
    args = parser.parse_args()

    full = json.loads((args.full / "training_metrics.json").read_text())
    paths = full["data"]["path"]
    data = args.data or ([paths] if isinstance(paths, str) else paths)
    folders = {f: train(data, f, args.out, recipe(full)) for f in args.fractions}
    folders[1.0] = args.full
    rows = []
    for fraction, folder in sorted(folders.items()):
        metrics = json.loads((folder / "training_metrics.json").read_text())
        rows.append((fraction, metrics["data"]["train_positions"], metrics["top1"], metrics["train_eval"]["top1"]))
    heads = len(rows[0][2])
    print("| train fraction | train positions | " + " | ".join(f"head {k} top-1 (train)" for k in range(heads)) + " |")
    print("|---|---|" + "---|" * heads)
    for fraction, positions, top1, train_top1 in rows:
        print(f"| {fraction:g} | {positions:,} | " + " | ".join(f"{a:.3f} ({b:.3f})" for a, b in zip(top1, train_top1))
              + " |")
    print()
    xs = [math.log2(positions) for _, positions, _, _ in rows]
    for k in range(heads):
        a, b = fit(xs, [top1[k] for _, _, top1, _ in rows])
        needs = ", ".join(
            f"top-1 {t:g} at ~{2 ** ((t - a) / b):.2g} positions ({2 ** ((t - a) / b) / rows[-1][1]:.2g}x)"
            if b > 0 else f"top-1 {t:g}: never (no gain)" for t in args.targets)
        print(f"head {k}: +{b:.3f} top-1 per doubling of the data; straight-line extrapolation: {needs}")


if __name__ == "__main__":
    main()
