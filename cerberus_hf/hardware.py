"""What a calibration is keyed by: the device type, the dtype and the processor, together.

The trees and the gate are fitted to the cost of verifying n tokens in one forward, and that cost curve
belongs to all three at once: a CPU that multiplies bf16 matrices in tiles verifies many bf16 tokens for about the
cost of one and fp32 tokens at a higher cost; one with bf16 dot products only makes bf16 cheaper than fp32 but
still rising with the tokens; on one with neither bf16 is no cheaper than fp32; a GPU's curve stays flat far
further (the curves measured so far: docs/calibration.md, "What the cost curves look like"). So `calibrate`
stores its settings under ``"<device>/<dtype>/<processor>"`` (the processor as `processor_name` gives it: the
CPU model or the GPU's name) and `generate()` takes the closest stored entry
(`select_calibration`), saying which when it is not an exact match. Folders calibrated before this keying
hold a bare device type (``"cpu"``): it is read as that device with an unknown dtype and processor.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.utils import logging

logger = logging.get_logger(__name__)


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    """(model name, flags) of the first processor in ``/proc/cpuinfo``; elsewhere what `platform` knows."""
    name, flags = None, frozenset()
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        field, _, value = line.partition(":")
        if field.strip() == "model name" and name is None:
            name = value.strip()
        elif field.strip() == "flags" and not flags:
            flags = frozenset(value.split())
    return name or platform.processor() or platform.machine(), flags


def processor_name(device: torch.device | str) -> str | None:
    """The CPU model (``/proc/cpuinfo``) or the GPU's name: what a cost curve was measured on (None for a
    CUDA device this machine does not have, or a device type without names)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device) if torch.cuda.is_available() else None
    return _cpuinfo()[0] if device.type == "cpu" else None


def bf16_matmul(device: torch.device | str) -> str | None:
    """The CPU's bf16 matrix instructions, which decide the shape of a bf16 cost curve more than its model
    name does: ``"AMX"`` (tiles), ``"AVX512-BF16"`` (dot products, faster than fp32's matrix products;
    docs/precision.md), or None (bf16 computed through fp32); None for other devices. Virtual machines may
    show one model name over processors of either kind, so the flags decide, not the name."""
    if torch.device(device).type != "cpu":
        return None
    flags = _cpuinfo()[1]
    return "AMX" if "amx_tile" in flags else "AVX512-BF16" if "avx512_bf16" in flags else None


def describe_device(device: torch.device | str) -> str:
    """The processor in words for a record of a timing: CPU model, its bf16 instructions, cores and threads."""
    device = torch.device(device)
    if device.type != "cpu":
        return f"{device.type}: {processor_name(device)}"
    bf16 = bf16_matmul(device)
    instructions = "no AMX" if bf16 is None else "with AMX" if bf16 == "AMX" else f"no AMX, with {bf16}"
    return (f"cpu: {processor_name(device)} ({instructions}), {os.cpu_count()} cores, "
            f"{torch.get_num_threads()} torch threads")


def reduced_precision_note(device: torch.device | str, dtype: torch.dtype) -> str | None:
    """What someone decoding in ``dtype`` on ``device`` should know about this processor (None: nothing). Only
    a CPU with AMX makes a verification of dozens of bf16 tokens cost about one token; elsewhere float32, the
    default of every command, stays the dtype to use unless a measured run says otherwise."""
    if torch.device(device).type != "cpu" or dtype == torch.float32:
        return None
    name = str(dtype).removeprefix("torch.")
    bf16 = bf16_matmul(device)
    if bf16 == "AMX":
        return None
    if bf16 is None:
        return (f"this CPU has neither AMX nor AVX512-BF16: {name} matrix products run through float32 here and are no "
                "faster; float32 (the default) is the dtype to use")
    return (f"this CPU has no AMX, only {bf16}: {name} verification is cheaper than float32's but its cost still "
            "grows with the tokens verified; float32 stays the default")


def stored_bf16_matmul(settings: dict) -> str | None:
    """The bf16 instructions a stored CPU entry was measured with; entries written before this was stored
    say only whether the CPU had AMX (without AMX is read as neither kind)."""
    if "bf16_matmul" in settings:
        return settings["bf16_matmul"]
    return "AMX" if settings.get("amx") else None


@dataclass(frozen=True)
class HardwareKey:
    """Device type, dtype name and processor name; ``str()`` is the key in ``cerberus_calibration``."""

    device: str
    dtype: str | None = None
    processor: str | None = None

    @classmethod
    def of(cls, device: torch.device | str, dtype: torch.dtype) -> "HardwareKey":
        """The key of a model on ``device`` computing in ``dtype``, on this machine."""
        return cls(torch.device(device).type, str(dtype).removeprefix("torch."), processor_name(device))

    @classmethod
    def parse(cls, key: str) -> "HardwareKey":
        """A stored key; a bare device type (the keying before this one) has no dtype and processor."""
        device, _, rest = key.partition("/")
        dtype, _, processor = rest.partition("/")
        return cls(device, dtype or None, processor or None)

    def __str__(self) -> str:
        return "/".join(part for part in (self.device, self.dtype, self.processor) if part)


def select_calibration(calibrated: dict | None, wanted: HardwareKey,
                       bf16: str | None = None) -> tuple[str | None, dict]:
    """(stored key, settings) of the entry of ``calibrated`` closest to ``wanted``, or ``(None, {})``.

    Only entries of the same device type qualify. Closest means, in this order: the same dtype, the same
    bf16 instructions (``bf16``, as `bf16_matmul` names them; stored in CPU entries, see
    `stored_bf16_matmul`), the same processor, then float32 (the curve every device has). A choice other
    than an exact match is logged once, with the key used, so that a user knows to calibrate on this machine.
    """
    candidates = [key for key in (calibrated or {}) if HardwareKey.parse(key).device == wanted.device]
    if not candidates:
        if calibrated:
            logger.warning_once(
                f"cerberus-hf: no calibration stored for {wanted.device} (stored: {', '.join(calibrated)}); "
                f"using the config's settings. Run `cerberus-hf calibrate --device {wanted.device}` to fit one."
            )
        return None, {}

    def closeness(key: str) -> tuple:
        stored = HardwareKey.parse(key)
        return (stored.dtype == wanted.dtype, stored_bf16_matmul(calibrated[key]) == bf16,
                stored.processor == wanted.processor, stored.dtype == "float32", key)

    key = max(candidates, key=closeness)
    if HardwareKey.parse(key) != wanted:
        logger.warning_once(
            f"cerberus-hf: no calibration stored for {wanted}; using the one for {key}. Run `cerberus-hf "
            f"calibrate --dtype {wanted.dtype}` on this machine to fit the trees and the gate to its cost curve."
        )
    return key, calibrated[key]
