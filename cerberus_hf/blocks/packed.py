"""Linear layers through weights packed once for oneDNN, on a CPU.

On a CPU, `torch.nn.functional.linear` hands a float32 weight to MKL, which re-packs it into its blocked layout on
every call with more than one row, and a bfloat16 weight to oneDNN, which re-orders it on every call. A verification
forward over a few drafted tokens therefore reads each weight about twice where one token's forward reads it once,
and costs much more than one token's forward; with the weights packed once it costs little more (forward times
before and after packing: docs/decoding.md, "Packed weights on a CPU"). Drafting pays because a few more rows cost
almost nothing in a memory-bound forward; packing makes that true on a CPU.

`PackedWeights` packs every linear weight of a base and its drafter once (oneDNN's `_reorder_linear_weight`, kept
beside the model: about the weights' size again in memory). A weight is packed once per process: every
`PackedWeights` holding it (the wrappers of one base with different drafters, a benchmark's packed peer) shares one
packed copy, dropped when the last of them lets go of it. `packed_views` are views of them (`module_views`) whose
linear layers compute with `_linear_pointwise` over the packed weights. A decoding call runs the views, so another
thread calling the same base meanwhile computes as before. A weight changed in place, moved or converted since it was
packed is packed again on the next call and computed through `linear` until then. Gradients are never taken through
it. (A `TorchFunctionMode` would do the same per thread without a view, but it runs Python for every operation of
the forward, a sizeable share of a small model's forward on a CPU.)

The numbers: in bfloat16 the packed product was bit-identical to `linear`'s at every row count tried; in float32 it
sums in another order (logits differ from `linear`'s in their last bits; docs/decoding.md), as a verification
forward over several rows already does against a one-token forward.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from ..hardware import bf16_kernels
from ..module_views import replace_modules, with_forward

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
_ROWS_HINT = 8  # the row count oneDNN lays the weight out for (SmolLM2 on an AVX-512 EPYC: 1-64 rows ran alike)
# `packed_weights` of a view (and of a calibration entry) whose products of several rows use the packed weights and
# whose one-row products (a step that verifies no draft) run oneDNN on the weight as it is: on an AVX2-only EPYC a
# 1.5B base's one-token forward was 9-13% faster that way, SmolLM2's 3% slower (docs/decoding.md), so calibration
# measures it (`calibration.machine.measure_and_fit`)
ONE_ROW_AS_IS = "multi-row"


def _packable(dtype: torch.dtype) -> bool:
    """Whether oneDNN packs weights of ``dtype`` on this processor: float32 anywhere, bfloat16 only with its bf16
    kernels (`hardware.bf16_kernels`: an AVX2-only processor has none, and its reorder raises)."""
    return dtype in PACKABLE_DTYPES and (dtype != torch.bfloat16 or bf16_kernels())


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `packed_view` computes anything here: a CPU, oneDNN built in, and a dtype it packs (`_packable`)."""
    return (torch.device(device).type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and _packable(dtype))


def packing_unavailable_reason(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why a model that would be packed on another CPU is not packed here (None: it is, or no CPU packs it): said
    once, so that a user comparing machines knows their linear layers run through `linear` here."""
    if torch.device(device).type != "cpu" or dtype not in PACKABLE_DTYPES or packing_available(device, dtype):
        return None
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return "this torch is built without oneDNN"
    return "oneDNN has no bfloat16 kernels on this processor (they need AVX-512 BW/VL/DQ or AVX-NE-CONVERT)"


@dataclass
class _Packed:
    weight: weakref.ref  # to the weight packed (a module's parameter, or a tensor no module holds)
    version: int
    data_ptr: int  # `Module.to` swaps a parameter's data without a version bump
    packed: torch.Tensor

    @classmethod
    def of(cls, weight: torch.Tensor) -> "_Packed":
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _ROWS_HINT)
        return cls(weakref.ref(weight), weight._version, weight.data_ptr(), packed)

    def fresh(self, weight: torch.Tensor) -> bool:
        """Whether this is ``weight`` packed as it is now (not changed in place, moved or converted since)."""
        return self.weight() is weight and self.version == weight._version and self.data_ptr == weight.data_ptr()


# every weight packed in this process, by id while some `PackedWeights` holds its packed copy: one copy however many
# models (wrappers of one base, a benchmark's peer) compute through it; `_Packed.fresh` tells a reused id apart
_SHARED: "weakref.WeakValueDictionary[int, _Packed]" = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def _shared(weight: torch.Tensor) -> _Packed:
    """``weight`` packed as it is now: the process's copy where one is fresh, else packed anew (call under `_LOCK`)."""
    entry = _SHARED.get(id(weight))
    if entry is None or not entry.fresh(weight):
        entry = _SHARED[id(weight)] = _Packed.of(weight)
    return entry


class PackedWeights:
    """The packed copies of one model's linear weights, made on first use and kept (thread-safe); shared with every
    other `PackedWeights` of the process that holds the same weights."""

    def __init__(self):
        self._table: dict[int, _Packed] = {}
        self._loose: dict[int, _Packed] = {}  # weights no module holds, by id while they live (`linear`)

    def update(self, modules: Iterable[nn.Module]) -> dict[int, _Packed]:
        """The table to compute ``modules``' linear layers with: each weight packed where it was not yet, or was
        changed in place since; weights no longer among them are dropped (a base moved to another dtype)."""
        with _LOCK:
            self._table = {id(linear.weight): _shared(linear.weight)
                           for module in modules for linear in module.modules()
                           if isinstance(linear, nn.Linear) and linear.weight is not None
                           and _packable(linear.weight.dtype)}
            return self._table

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``linear(x, weight, bias)`` through ``weight`` packed on first use, for a weight no module holds: a drafter's
        draft-vocabulary rows of the lm_head, which a drafter projects onto at every drafted token, so packing them
        shortens drafting (measured in docs/decoding.md). Kept while that tensor lives unchanged."""
        if torch.is_grad_enabled() or x.dtype != weight.dtype or x.dim() < 2 or not _packable(weight.dtype):
            return nn.functional.linear(x, weight, bias)
        with _LOCK:
            entry = self._loose.get(id(weight))
            if entry is None or not entry.fresh(weight):
                entry = self._loose[id(weight)] = _shared(weight)
                weakref.finalize(weight, self._loose.pop, id(weight), None)
        return torch.ops.mkldnn._linear_pointwise(x, entry.packed, bias, "none", [], "")

    def __deepcopy__(self, memo: dict) -> "PackedWeights":
        return PackedWeights()  # a copied model packs its own copied weights


def packed_view(root: nn.Module, weights: PackedWeights, one_row_as_is: bool = False) -> nn.Module:
    """A view of ``root`` (`module_views`: the base itself is untouched, so other threads compute as before) whose
    linear layers compute with their packed weights (packed into ``weights`` first where needed); ``one_row_as_is``:
    a one-row product through oneDNN on the weight as it is (`ONE_ROW_AS_IS`)."""
    return packed_views(weights, root, one_row_as_is=one_row_as_is)[0]


def packed_model(model: nn.Module) -> nn.Module:
    """A view of ``model`` through packed weights where `packing_available` (else ``model``), for work that runs one
    model over many rows without gradients (distilling answers, caching states): at those row counts oneDNN's
    product over packed weights outran MKL's over the weights as they are on every CPU measured (docs/data.md). The
    packed copy (the weights' size again in memory) lives as long as the view."""
    weight = next(model.parameters(), None)
    if weight is None or not packing_available(weight.device, weight.dtype):
        return model
    return packed_view(model, PackedWeights())


def packed_views(weights: PackedWeights, *roots: nn.Module, one_row_as_is: bool = False) -> tuple[nn.Module, ...]:
    """`packed_view` of each of ``roots`` (a base and its drafter), packed together: ``weights`` keeps the packed
    weights of exactly these modules, one copy of a weight they share."""
    table = weights.update(roots)
    return tuple(replace_modules(root, {
        linear: with_forward(linear, functools.partial(_packed_linear, linear, table[id(linear.weight)],
                                                       one_row_as_is=one_row_as_is))
        for linear in root.modules() if isinstance(linear, nn.Linear) and id(linear.weight) in table})
        for root in roots)


def _packed_linear(linear: nn.Linear, entry: _Packed, x: torch.Tensor, one_row_as_is: bool = False) -> torch.Tensor:
    """``linear(x)`` through the packed weight (one row through the weight as it is where ``one_row_as_is``);
    through `linear` itself where that cannot serve (gradients, another dtype, a weight changed in place, moved or
    converted since, a 1-D input)."""
    weight = linear.weight
    if torch.is_grad_enabled() or x.dtype != weight.dtype or x.dim() < 2 or not entry.fresh(weight):
        return nn.functional.linear(x, weight, linear.bias)
    layout = weight if one_row_as_is and x.numel() == x.shape[-1] else entry.packed
    return torch.ops.mkldnn._linear_pointwise(x, layout, linear.bias, "none", [], "")
