"""What a calibration is keyed by: the device type, the dtype, the instruction class and the processor, together.

The trees and the gate are fitted to the cost of verifying n tokens in one forward, and that cost curve
belongs to all of them at once: a CPU that multiplies bf16 matrices in tiles (AMX) verifies many bf16 tokens for
about the cost of one; one with bf16 dot products (AVX512-BF16) makes bf16 cheaper than fp32 but still rising with
the tokens; an AVX2-only one pays more for every extra token than an AVX-512 one; a GPU's curve stays flat far further
(the curves measured so far: docs/calibration.md, "What the cost curves look like"). The processor's name does not
tell these apart (virtual machines show "AMD EPYC" over AVX2-only and AVX-512 parts alike): its flags and what torch's
kernels use do. So `calibrate` stores its settings under ``"<device>/<dtype>/<class>/<processor>"`` (`HardwareKey`:
the class as `instruction_class` names it, the processor as `processor_name` gives it) and `generate()` takes the
closest stored entry of the same class (`select_calibration`); an entry of another class is never applied.
Keys written before the class was part of them (``"cpu/float32/AMD EPYC"``, a bare ``"cpu"``) are read with the class
their entry recorded (``bf16_matmul``), where it did.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.utils import logging

logger = logging.get_logger(__name__)

# CPU instruction classes, from the one whose cost curve is flattest: AMX tiles, AVX-512 with bf16 dot products,
# AVX-512, AVX2, Arm's SVE and NEON, and anything older. A GPU's class is its compute capability (``sm_90``).
CPU_CLASSES = ("AMX", "AVX512-BF16", "AVX512", "AVX2", "SVE", "NEON", "baseline")
_GPU_CLASS = re.compile(r"sm_\d+$")
_AVX512 = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})


@dataclass(frozen=True)
class CpuInfo:
    """The first processor of ``/proc/cpuinfo``: model name, vendor, family, model and flags (Arm: its features)."""

    name: str
    vendor: str | None = None
    family: str | None = None
    model: str | None = None
    flags: frozenset[str] = frozenset()


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> CpuInfo:
    """This machine's `CpuInfo`; elsewhere than Linux, what `platform` knows."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    fields: dict[str, str] = {}
    for line in lines:
        field, _, value = line.partition(":")
        fields.setdefault(field.strip(), value.strip())
    return CpuInfo(fields.get("model name") or platform.processor() or platform.machine(), fields.get("vendor_id"),
                   fields.get("cpu family"), fields.get("model"),
                   frozenset((fields.get("flags") or fields.get("Features") or "").split()))


def bf16_kernels() -> bool:
    """Whether oneDNN has bf16 kernels here (AVX-512 BW/VL/DQ, AVX-NE-CONVERT or Arm's bf16): what packed bf16
    weights need. It follows ``ONEDNN_MAX_CPU_ISA``, so a lower class can be forced for a test."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def instruction_class(device: torch.device | str) -> str | None:
    """The instruction class that decides ``device``'s cost curve: one of `CPU_CLASSES` on a CPU, ``sm_<major><minor>``
    on a CUDA GPU this machine has, None elsewhere. On a CPU the flags say what the processor has and torch says what
    its kernels use (``ATEN_CPU_CAPABILITY`` and ``ONEDNN_MAX_CPU_ISA`` lower it), the lower of the two counting."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm_{major}{minor}"
    if device.type != "cpu":
        return None
    flags = _cpuinfo().flags
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "SVE" if "sve" in flags else "NEON"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability == "AVX512" and _AVX512 <= flags:
        if "amx_tile" in flags and bf16_kernels():
            return "AMX"
        return "AVX512-BF16" if "avx512_bf16" in flags and bf16_kernels() else "AVX512"
    return "AVX2" if capability in ("AVX2", "AVX512") and "avx2" in flags else "baseline"


def processor_name(device: torch.device | str) -> str | None:
    """What a cost curve was measured on: the CPU's model name with its vendor, family and model (one name covers
    several processors), or the GPU's name; None for a CUDA device this machine does not have, or other devices."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device) if torch.cuda.is_available() else None
    if device.type != "cpu":
        return None
    info = _cpuinfo()
    if info.vendor is None:
        return info.name
    return f"{info.name} ({info.vendor} family {info.family} model {info.model})"


def bf16_matmul(device: torch.device | str) -> str | None:
    """The CPU's bf16 matrix instructions: ``"AMX"`` (tiles), ``"AVX512-BF16"`` (dot products, faster than fp32's
    matrix products; docs/precision.md), or None (bf16 computed through fp32); None for other devices."""
    isa = instruction_class(device) if torch.device(device).type == "cpu" else None
    return isa if isa in ("AMX", "AVX512-BF16") else None


def describe_device(device: torch.device | str) -> str:
    """The processor in words for a record of a timing: model, instruction class, cores and threads."""
    device = torch.device(device)
    if device.type != "cpu":
        return f"{device.type}: {processor_name(device)} ({instruction_class(device)})"
    isa = instruction_class(device)
    words = {"AMX": "with AMX", "AVX512-BF16": "AVX512-BF16, no AMX", "AVX512": "AVX-512, no AMX or AVX512-BF16",
             "AVX2": "AVX2 only, no AVX-512"}.get(isa, isa)
    return (f"cpu: {processor_name(device)} ({words}), {os.cpu_count()} cores, "
            f"{torch.get_num_threads()} torch threads")


def reduced_precision_note(device: torch.device | str, dtype: torch.dtype) -> str | None:
    """What someone decoding in ``dtype`` on ``device`` should know about this processor (None: nothing). With
    AMX, strict bf16 verification is both fast and identical; with AVX512-BF16 alone bf16 is faster than float32
    but a batched check may round a near-tie differently, and strict verification there usually decodes plain
    (docs/precision.md); without either, bf16 buys nothing."""
    if torch.device(device).type != "cpu" or dtype == torch.float32:
        return None
    name = str(dtype).removeprefix("torch.")
    bf16 = bf16_matmul(device)
    if bf16 == "AMX":
        return None
    if bf16 is None:
        return (f"this CPU has neither AMX nor AVX512-BF16: {name} matrix products run through float32 here and are no "
                "faster; float32 (the default) is the dtype to use")
    return (f"this CPU has no AMX, only {bf16}: {name} decodes faster than float32 here, but checking several "
            f"tokens at once may round a near-tie differently from plain {name} decoding; float32 keeps the output "
            "identical")


@dataclass(frozen=True)
class HardwareKey:
    """Device type, dtype name, instruction class and processor name; ``str()`` is the key in
    ``cerberus_calibration``."""

    device: str
    dtype: str | None = None
    isa: str | None = None
    processor: str | None = None

    @classmethod
    def of(cls, device: torch.device | str, dtype: torch.dtype) -> "HardwareKey":
        """The key of a model on ``device`` computing in ``dtype``, on this machine."""
        return cls(torch.device(device).type, str(dtype).removeprefix("torch."), instruction_class(device),
                   processor_name(device))

    @classmethod
    def parse(cls, key: str) -> "HardwareKey":
        """A stored key; keys from before the class was keyed have none, a bare device type no dtype either."""
        device, _, rest = key.partition("/")
        dtype, _, rest = rest.partition("/")
        first, _, after = rest.partition("/")
        if first in CPU_CLASSES or _GPU_CLASS.match(first):
            return cls(device, dtype or None, first, after or None)
        return cls(device, dtype or None, None, rest or None)

    def __str__(self) -> str:
        return "/".join(part for part in (self.device, self.dtype, self.isa, self.processor) if part)


def stored_class(key: str, settings: dict) -> str | None:
    """The instruction class a stored entry was measured on: its key's; for a CPU key from before classes were keyed,
    the bf16 instructions its entry recorded (``bf16_matmul``, or the older ``amx``), the only class such an entry
    can be known to have; None where nothing tells."""
    parsed = HardwareKey.parse(key)
    if parsed.isa is not None or parsed.device != "cpu":
        return parsed.isa
    return settings.get("bf16_matmul", "AMX" if settings.get("amx") else None)


def _serves(key: str, settings: dict, wanted: HardwareKey) -> bool:
    """Whether a stored entry may serve ``wanted``: the same device type and instruction class (a GPU entry from
    before classes were keyed: the same GPU by name)."""
    stored = HardwareKey.parse(key)
    if stored.device != wanted.device:
        return False
    isa = stored_class(key, settings)
    if isa is None and stored.device != "cpu":
        return stored.processor == wanted.processor
    return isa == wanted.isa


def calibrate_command(wanted: HardwareKey, folder: str | None = None, positions: bool = False) -> str:
    """The ``cerberus-hf calibrate`` command that stores an entry for ``wanted``, as the messages below print it, whole
    (it runs as printed once FOLDER is filled in): for the heads in ``folder`` (FOLDER where unknown), fitted to this
    machine from the folder's calibration positions (``--machine``) where it has them, else measured on the base's
    answers to the packaged prompts and written into the folder."""
    source = ["--machine"] if positions else ["--write"]
    device = ["--device", wanted.device] if wanted.device != "cpu" else []
    dtype = ["--dtype", wanted.dtype] if wanted.dtype else []
    return shlex.join(["cerberus-hf", "calibrate", "--heads", folder or "FOLDER", *source, *dtype, *device])


def select_calibration(calibrated: dict | None, wanted: HardwareKey) -> tuple[str | None, dict]:
    """(stored key, settings) of the entry of ``calibrated`` closest to ``wanted``, or ``(None, {})``.

    Only entries of the same device type and instruction class qualify (`stored_class`): a curve fitted where an
    extra token costs less would make trees that do not pay here. Closest means, in this order: the same dtype, the
    same processor, float32 (the curve every device has), then a key that names its class. The caller says what it
    decodes with once it knows (`note_borrowed`, `note_no_entry`): calibration on first use may measure instead.
    """
    candidates = [key for key, settings in (calibrated or {}).items() if _serves(key, settings, wanted)]
    if not candidates:
        return None, {}

    def closeness(key: str) -> tuple:
        stored = HardwareKey.parse(key)
        return (stored.dtype == wanted.dtype, stored.processor == wanted.processor, stored.dtype == "float32",
                stored.isa is not None, key)

    key = max(candidates, key=closeness)
    return key, calibrated[key]


def note_borrowed(key: str, wanted: HardwareKey, command: str) -> None:
    """Say once that the entry fitted on ``key`` (another processor or dtype of this class) decodes on ``wanted``.
    Another processor's entry of the same dtype decoded within 2.5% of one measured here on every shipped family
    (docs/calibration.md), so only an entry of another dtype, whose cost curve was not measured in this one, comes
    with the command that fits one."""
    stored = HardwareKey.parse(key)
    act = (f" `{command}` fits one for {wanted.dtype}." if stored.dtype != wanted.dtype
           else " (Fitted on another processor of this class: within 2.5% of an entry measured here on the processors "
                "compared, docs/calibration.md.)")
    logger.warning_once(f"cerberus-hf: decoding with the calibration fitted on {key} for {wanted}.{act}")


def note_no_entry(calibrated: dict | None, wanted: HardwareKey, command: str | None = None) -> None:
    """Say once that no stored entry serves ``wanted`` and the config's settings decode (nothing where none is stored),
    suggesting ``command`` (as `select_calibration` does)."""
    if calibrated:
        logger.warning_once(
            f"cerberus-hf: no calibration stored for {wanted.device} with {wanted.isa} (stored: {', '.join(calibrated)}"
            f"); using the config's settings. Run `{command or calibrate_command(wanted)}` on this machine to fit the "
            "trees and the gate to its cost curve."
        )
