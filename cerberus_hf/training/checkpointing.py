"""Resumable, pickle-free training checkpoints, shared by the heads' trainer and the chain trainer.

Every ``save_every`` steps `save_checkpoint` writes the trained module, AdamW's moments and every process's RNG state
in safetensors, and the run's settings, history, AdamW's hyper-parameters, the schedule and Python's and NumPy's RNG
states in JSON, atomically under ``output_dir/checkpoints/step-N``; `resume_checkpoint` continues from the last one.
No checkpoint file is a pickle and none is ever unpickled: a pickle in the folder makes the resume refuse it."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_model
from torch import nn

from ..checkpoint import PICKLE_SUFFIXES
from ..errors import UserError
from ..files import give_user_mode, save_safetensors

logger = logging.getLogger(__name__)

METRICS_NAME = "training_metrics.json"  # a run's results, beside the heads it writes
CHECKPOINTS_DIR = "checkpoints"
STATE_NAME = "trainer_state.json"


# What a checkpoint folder holds. Tensors go in safetensors and everything else in JSON, and resuming reads
# nothing else: a pickle (what torch.save and accelerate's save_state write) runs code when it is loaded, and a run
# folder is easily copied from elsewhere, so a planted one must never be opened.
WEIGHTS_NAME = "weights.safetensors"  # the trained module's state_dict


OPTIMIZER_NAME = "optimizer_state.safetensors"  # the optimizer's per-parameter tensors, as "<param index>.<name>"


RNG_TENSORS_NAME = "rng_state_{}.safetensors"  # per process: torch's CPU generator, and CUDA's when there is CUDA


RNG_JSON_NAME = "rng_state_{}.json"  # per process: Python's and NumPy's generators


def earlier_run(folder: str | os.PathLike | None) -> dict | None:
    """What the run that saved ``folder`` did (steps, epochs, its own ``continued_from``, training seconds over all its
    processes), read from its metrics file; None when there is none. A run that starts from saved heads
    (``init_from``) records it, so that its card can state the training behind the heads, not only its own part."""
    path = Path(folder) / METRICS_NAME if folder is not None else None
    if path is None or not path.is_file():
        return None
    saved = json.loads(path.read_text())
    cost = saved.get("cost", {})
    return {"folder": str(folder), "steps": saved.get("steps"), "epochs": saved.get("epochs"),
            "train_time_s": cost.get("train_time_s_total", cost.get("train_time_s")), "device": cost.get("device"),
            "continued_from": saved.get("continued_from")}


def _checkpoint_dirs(output_dir: Path) -> list[tuple[int, Path]]:
    folder = output_dir / CHECKPOINTS_DIR
    found = []
    if folder.is_dir():
        for path in folder.iterdir():
            if path.name.startswith("step-") and (path / STATE_NAME).is_file():
                try:
                    found.append((int(path.name[5:]), path))
                except ValueError:
                    continue
    return sorted(found)


def is_pickle_file(path: Path) -> bool:
    """Whether ``path`` is, or is named as, a pickle: a pickle-format suffix, a pickle protocol 2-5 header
    (``\\x80`` and the protocol number), or a zip archive (``torch.save``'s format, a pickle inside).

    A safetensors file starts with its header's length (8 bytes, little-endian) and then ``{``: a header of 640
    bytes (0x0280) also begins ``\\x80\\x02``, so a file laid out that way is not taken for a pickle.
    """
    if path.suffix.lower() in PICKLE_SUFFIXES:
        return True
    with path.open("rb") as handle:
        head = handle.read(9)
    if head[:4] == b"PK\x03\x04":
        return True
    if len(head) < 2 or head[0] != 0x80 or not 2 <= head[1] <= 5:
        return False
    safetensors_header = len(head) == 9 and head[8:9] == b"{" and \
        int.from_bytes(head[:8], "little") + 8 <= path.stat().st_size
    return not safetensors_header


def refuse_pickles(folder: Path) -> None:
    """Raise if anything in ``folder`` is a pickle (`is_pickle_file`), before any of it is read."""
    for path in sorted(folder.rglob("*")):
        if path.is_file() and is_pickle_file(path):
            raise UserError(
                f"{path} is a pickle; cerberus-hf never unpickles files (they can run code), so checkpoints written "
                "by cerberus-hf before it kept its own safetensors and JSON files (through accelerate's save_state) "
                "cannot be resumed safely. Delete it or start a fresh run (resume=False, --no-resume).")


def _rng_state() -> tuple[dict[str, torch.Tensor], dict]:
    """This process's generators: torch's as tensors, Python's and NumPy's as JSON-able lists."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        tensors.update({f"cuda.{i}": state for i, state in enumerate(torch.cuda.get_rng_state_all())})
    version, key, gauss = random.getstate()
    kind, np_key, position, has_gauss, cached_gauss = np.random.get_state()
    return tensors, {"python": [version, list(key), gauss],
                     "numpy": [kind, np_key.tolist(), int(position), int(has_gauss), float(cached_gauss)]}


def _set_rng_state(tensors: dict[str, torch.Tensor], saved: dict) -> None:
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[f"cuda.{i}"] for i in range(len(tensors)) if f"cuda.{i}" in tensors]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])
    version, key, gauss = saved["python"]
    random.setstate((version, tuple(key), gauss))
    kind, np_key, position, has_gauss, cached_gauss = saved["numpy"]
    np.random.set_state((kind, np.array(np_key, dtype=np.uint32), position, has_gauss, cached_gauss))


def _optimizer_to_files(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """The optimizer's state_dict as flat tensors (``"<param index>.<name>"``: AdamW's ``exp_avg``, ``exp_avg_sq``
    and ``step``) and JSON (the param groups' hyper-parameters, and any state that is not a tensor)."""
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, values in state["state"].items():
        for name, value in values.items():
            if torch.is_tensor(value):
                tensors[f"{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{index}.{name}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _optimizer_from_files(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], saved: dict) -> None:
    state: dict[int, dict] = {}
    for key, value in [*tensors.items(), *saved["scalars"].items()]:
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    # JSON has no tuples: the hyper-parameters given as pairs (AdamW's betas) come back as lists
    groups = [{k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in group.items()}
              for group in saved["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def _scheduler_state(scheduler) -> dict:
    """The schedule's state_dict without ``lr_lambdas``: the functions come from the code and the run's arguments
    (checked equal on resume), never from the file."""
    state = scheduler.state_dict()
    state.pop("lr_lambdas", None)
    return state


def _load_scheduler_state(scheduler, state: dict) -> None:
    if hasattr(scheduler, "lr_lambdas"):  # LambdaLR's load_state_dict takes one entry per function; None: left as is
        state = dict(state, lr_lambdas=[None] * len(scheduler.lr_lambdas))
    scheduler.load_state_dict(state)


def save_checkpoint(accelerator, output_dir: Path, step: int, state: dict, keep: int, module: nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler) -> Path:
    """``checkpoints/step-N``: ``module``'s weights and ``optimizer``'s tensors in safetensors (`WEIGHTS_NAME`,
    `OPTIMIZER_NAME`), every process's RNG state (`RNG_TENSORS_NAME`, `RNG_JSON_NAME`), and ``state`` with the
    optimizer's hyper-parameters and ``scheduler``'s state in JSON (`STATE_NAME`): no pickle, so resuming never
    runs code from the folder. Written under a temporary name and renamed, so a run killed while saving leaves the
    previous checkpoints complete; only the newest ``keep`` are kept."""
    folder = output_dir / CHECKPOINTS_DIR
    final, tmp = folder / f"step-{step:08d}", folder / f".tmp-step-{step:08d}"
    if accelerator.is_main_process:
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob(".tmp-step-*"):  # left by a run killed while saving
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    accelerator.wait_for_everyone()
    rng_tensors, rng_json = _rng_state()
    save_safetensors(rng_tensors, tmp / RNG_TENSORS_NAME.format(accelerator.process_index))
    (tmp / RNG_JSON_NAME.format(accelerator.process_index)).write_text(json.dumps(rng_json) + "\n")
    if accelerator.is_main_process:
        save_model(module, str(tmp / WEIGHTS_NAME), force_contiguous=True)
        give_user_mode(tmp / WEIGHTS_NAME)
        optimizer_tensors, optimizer_json = _optimizer_to_files(optimizer)
        save_safetensors(optimizer_tensors, tmp / OPTIMIZER_NAME)
        payload = dict(state, step=step, optimizer=optimizer_json, scheduler=_scheduler_state(scheduler))
        (tmp / STATE_NAME).write_text(json.dumps(payload, indent=1) + "\n")
    accelerator.wait_for_everyone()  # every process's RNG files are in before the folder is renamed
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for _, old in _checkpoint_dirs(output_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def resume_checkpoint(accelerator, output_dir: Path, run_config: dict, resume: bool, module: nn.Module,
                      optimizer: torch.optim.Optimizer, scheduler) -> dict | None:
    """The ``state`` of the newest complete checkpoint in ``output_dir`` (`save_checkpoint`), after loading its
    weights into ``module``, its state into ``optimizer`` and ``scheduler`` and this process's RNG state; None if
    there is none (or ``resume`` is False: the checkpoints are removed unread).

    Refused: a folder holding a pickle (`refuse_pickles`, first: accelerate's checkpoints, those of cerberus-hf
    before this format, are such folders), a checkpoint written with other ``run_config`` settings (not silently
    continued), and one without this format's files."""
    checkpoints = _checkpoint_dirs(output_dir)
    if checkpoints and not resume:
        if accelerator.is_main_process:
            shutil.rmtree(output_dir / CHECKPOINTS_DIR, ignore_errors=True)
        accelerator.wait_for_everyone()
        return None
    if not checkpoints:
        return None
    path = checkpoints[-1][1]
    refuse_pickles(path)
    saved = json.loads((path / STATE_NAME).read_text())
    differences = {k: (saved["run_config"].get(k), v) for k, v in run_config.items() if saved["run_config"].get(k) != v}
    if differences:
        raise UserError(
            f"{path} was written by a run with other settings or data "
            f"({', '.join(f'{k}: {a!r} there, {b!r} now' for k, (a, b) in differences.items())}). "
            "Resume with the same arguments, pass resume=False (--no-resume) to start over, or use another "
            "output directory."
        )
    if not (path / OPTIMIZER_NAME).is_file():
        raise UserError(f"{path} has no {OPTIMIZER_NAME}: it was written by an older cerberus-hf, whose checkpoints "
                        "this one cannot resume; pass resume=False (--no-resume) to start over, or use another "
                        "output directory.")
    load_model(module, str(path / WEIGHTS_NAME))
    _optimizer_from_files(optimizer, load_file(str(path / OPTIMIZER_NAME)), saved["optimizer"])
    _load_scheduler_state(scheduler, saved["scheduler"])
    rng = path / RNG_TENSORS_NAME.format(accelerator.process_index)
    if rng.is_file():
        rng_json = path / RNG_JSON_NAME.format(accelerator.process_index)
        _set_rng_state(load_file(str(rng)), json.loads(rng_json.read_text()))
    else:  # saved by fewer processes: this one keeps the seed's generators (the run was not exact anyway)
        logger.warning("%s has no RNG state for process %d", path, accelerator.process_index)
    logger.info("resuming from %s (step %d of %d)", path, saved["step"], run_config["total_steps"])
    return saved


def cosine_with_warmup(optimizer, warmup_steps: int, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    from transformers import get_cosine_schedule_with_warmup

    return get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps)


def on_step_end(step: int) -> None:
    """Called after every optimizer step (and its checkpoint); a hook for tests that simulate a kill."""
