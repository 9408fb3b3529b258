"""Calibration on first use: where no stored entry serves this machine, measure its half of a calibration and fit the
settings to it and to the checkpoint's positions, once, and keep the result in the user's cache.

A checkpoint that carries its calibration positions (`statistics.POSITIONS_NAME`) decodes with settings fitted to
the machine it runs on even where nobody calibrated that machine: the first `generate()` for which
`hardware.select_calibration` finds no entry measures this machine's costs (`machine.measure_and_fit` with
`FIRST_USE_PLAN`, about `FIRST_USE_SECONDS` in all on a 2-core CPU), fits the trees and the gate, and stores the entry
in ``<HF_HOME>/cerberus_hf/calibration/<checkpoint hash>.json`` under the hardware key and torch's version
(`CalibrationCache`); later calls and later processes read it back (an entry of an older fit, `machine.FIT_VERSION`,
is measured again). `cerberus-hf calibrate --machine` does the same ahead of time, with every repeat.
``generate(calibrate=False)``, or ``CERBERUS_HF_CALIBRATE=0`` in the environment, keeps the stored entries and the
config's settings.

The cache file is written whole to a temporary file and moved into place (`files.write_atomically`, with the mode
any file of the user gets), under a lock per file in this process and a file lock (`filelock`) across processes, held
while measuring too: two processes starting at once measure once, and neither reads a half-written file.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import weakref
from datetime import datetime, timezone
from pathlib import Path

import torch
from filelock import FileLock, Timeout
from huggingface_hub import constants
from transformers.utils import logging

from ..blocks.settings import check_entry
from ..files import write_atomically
from ..hardware import HardwareKey, describe_device
from .machine import FIT_VERSION, Fitted, MeasurePlan, measure_and_fit

logger = logging.get_logger(__name__)

ENVIRONMENT_SWITCH = "CERBERUS_HF_CALIBRATE"  # "0", "false", "no" or "off": never calibrate on first use
FIRST_USE_SECONDS = 30.0
# the measurements' share of the bound: packing the weights and the fits take the rest
FIRST_USE_PLAN = MeasurePlan(repeats=5, draft_repeats=10, seconds=0.75 * FIRST_USE_SECONDS)
MEASURED = " (measured here)"  # how a calibration key that first use fitted here ends
LOCK_SECONDS = 10 * FIRST_USE_SECONDS  # how long a process waits for another one calibrating the same checkpoint
_FORMAT = 1


def first_use_enabled(calibrate: bool | None) -> bool:
    """Whether a call may calibrate on first use: the call's ``calibrate`` where given, else the environment's
    `ENVIRONMENT_SWITCH` (on unless it says 0, false, no or off)."""
    if calibrate is not None:
        return bool(calibrate)
    return os.environ.get(ENVIRONMENT_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def cache_folder() -> Path:
    """Where first-use calibrations are kept: ``cerberus_hf/calibration`` under the Hugging Face home."""
    return Path(constants.HF_HOME) / "cerberus_hf" / "calibration"


_hashes: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model: (what it was computed from, hash)


def checkpoint_hash(model) -> str:
    """sha256 of what a first-use fit depends on besides the machine: the heads' tensors, the calibration positions,
    the base named and which rescorers the model has. Kept per model while its heads and positions stay the same
    tensors, unchanged."""
    state = model.heads.state_dict()
    fingerprint = (model.calibration_statistics, model.ngram is not None, model.rescorer is not None,
                   tuple((name, t.data_ptr(), t._version, t.dtype, t.device) for name, t in state.items()))
    known = _hashes.get(model)
    if known is not None and known[0] == fingerprint:
        return known[1]
    digest = hashlib.sha256(f"{model.config.base_model_name_or_path}|{fingerprint[1:3]}".encode())
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        digest.update(f"|{name}|{tensor.dtype}|{list(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    digest.update(model.calibration_statistics.to_bytes())
    _hashes[model] = (fingerprint, digest.hexdigest())
    return _hashes[model][1]


class CalibrationCache:
    """One checkpoint's first-use entries: a JSON file, ``{"entries": {"<hardware key> | torch <version>": {"settings":
    ..., "seconds": ..., ...}}}``. Entries read or written are remembered for the process."""

    _remembered: dict[tuple[str, str], dict | None] = {}  # (file, label): settings (None: measuring failed here)
    _locks: dict[str, threading.Lock] = {}
    _guard = threading.Lock()

    def __init__(self, checkpoint: str):
        self.checkpoint = checkpoint
        self.path = cache_folder() / f"{checkpoint}.json"

    @staticmethod
    def label(key: HardwareKey) -> str:
        """An entry's name: the hardware key and torch's version (another version may compute at another cost)."""
        return f"{key} | torch {torch.__version__}"

    def remembered(self, key: HardwareKey) -> tuple[bool, dict | None]:
        """(whether this process knows the entry, its settings)."""
        name = (str(self.path), self.label(key))
        return name in self._remembered, self._remembered.get(name)

    def read(self, key: HardwareKey, config) -> dict | None:
        """The entry's settings from the file (None: none, or one a call could not use, which is said once)."""
        try:
            entry = json.loads(self.path.read_text())["entries"].get(self.label(key))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            logger.warning_once(f"cerberus-hf: {self.path} cannot be read ({error}); calibrating again.")
            return None
        if entry is None:
            return None
        if entry.get("fit", 1) < FIT_VERSION:
            logger.warning_once(f"cerberus-hf: {self.path}: entry {self.label(key)!r} predates this version's fit "
                                f"({FIT_VERSION}); calibrating again.")
            return None
        try:
            check_entry(entry["settings"], config)
        except (ValueError, TypeError, KeyError) as error:
            logger.warning_once(f"cerberus-hf: {self.path}: entry {self.label(key)!r} cannot be used ({error}); "
                                "calibrating again.")
            return None
        self.remember(key, entry["settings"])
        return entry["settings"]

    def write(self, key: HardwareKey, settings: dict, record: dict) -> None:
        """Add the entry to the file: the whole file written anew beside it, then moved into place."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(self.path.read_text())
            data["entries"] = dict(data["entries"])
        except (OSError, ValueError, KeyError, TypeError):
            data = {"format": _FORMAT, "checkpoint": self.checkpoint, "entries": {}}
        data["entries"][self.label(key)] = {"settings": settings, **record}
        write_atomically(self.path, json.dumps(data, indent=1, sort_keys=True))
        self.remember(key, settings)

    def lock(self) -> threading.Lock:
        """This process's lock of the file (one per file, shared by every model of the checkpoint)."""
        with self._guard:
            return self._locks.setdefault(str(self.path), threading.Lock())

    def remember(self, key: HardwareKey, settings: dict | None) -> None:
        """Remember ``settings`` (None: that measuring failed here) for the process."""
        self._remembered[(str(self.path), self.label(key))] = settings


def machine_entry(model, wanted: HardwareKey, measure: bool) -> dict | None:
    """The settings fitted to this machine for ``wanted`` from ``model``'s calibration positions: the cached entry,
    else, with ``measure`` (the model computes on ``wanted``'s device in its dtype), measured now, once for every
    thread and process (None: neither; the caller keeps the stored entries and the config's settings)."""
    cache = CalibrationCache(checkpoint_hash(model))
    known, settings = cache.remembered(wanted)
    if known:
        return settings
    settings = cache.read(wanted, model.config)
    if settings is not None or not measure:
        return settings
    with cache.lock():
        try:
            with FileLock(f"{cache.path}.lock", timeout=LOCK_SECONDS):
                known, settings = cache.remembered(wanted)  # another thread's, or another process's meanwhile
                settings = settings if known else cache.read(wanted, model.config)
                if settings is None and not known:
                    settings = calibrate_machine(model, FIRST_USE_PLAN, cache, wanted)[0].settings
        except Timeout:
            logger.warning_once(f"cerberus-hf: waited {LOCK_SECONDS:.0f} s for another process calibrating "
                                f"{wanted} ({cache.path}.lock); using the stored entries and the config's settings.")
        except Exception as error:  # measuring failed here: said, remembered, and decoding goes on as configured
            logger.warning(f"cerberus-hf: calibration on first use failed on {wanted} ({type(error).__name__}: "
                           f"{error}); using the stored entries and the config's settings.")
            cache.remember(wanted, None)
    return settings


def calibrate_machine(model, plan: MeasurePlan, cache: CalibrationCache | None = None,
                      wanted: HardwareKey | None = None) -> tuple[Fitted, Path, float]:
    """Measure this machine for ``model`` (on its device, in its dtype) with ``plan``, fit the settings to its
    calibration positions (`machine.measure_and_fit`) and store them in ``cache`` (the model's by default) under
    ``wanted`` (the model's key by default); returns the fit, where it was stored and the seconds it took. Says so
    in one line."""
    wanted = wanted or HardwareKey.of(model.device, model.base.dtype)
    cache = cache or CalibrationCache(checkpoint_hash(model))
    started = time.perf_counter()
    fitted = measure_and_fit(model, model.calibration_statistics, plan)
    seconds = time.perf_counter() - started
    cache.write(wanted, fitted.settings, {"fit": FIT_VERSION, "seconds": round(seconds, 2),
                                          "machine": describe_device(model.device),
                                          "tokens_per_s": fitted.tokens_per_s,
                                          "plain_tokens_per_s": fitted.plain_tokens_per_s,
                                          "measured": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    threshold = fitted.settings["gate_threshold"]
    logger.warning(f"cerberus-hf: calibrated this machine ({wanted}) for these heads in {seconds:.1f} s: "
                   f"{fitted.settings['tree_kind']} tree, gate {fitted.settings['gate_signal']} < "
                   f"{threshold if threshold is None else round(threshold, 3)}; stored in {cache.path} for later calls (generate(calibrate="
                   f"False) or {ENVIRONMENT_SWITCH}=0 keeps the config's settings).")
    return fitted, cache.path, seconds
