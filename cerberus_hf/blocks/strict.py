"""Strict verification: each verified position computed with the kernels of a one-token forward.

Verifying n drafted tokens in one forward makes every matrix product n rows tall, and a position's numbers can
then depend on n: a kernel may split or order its sums differently for a taller matrix. In float32 the
logits differ in their last bits (the output stays token-identical: no argmax has flipped in any test or
bench run); in bf16 and fp16 the argmax flips at near ties, so drafted output departs from plain `generate()`
(`cerberus-hf divergence`). Measured on SmolLM2-135M (`benchmarks/shape_invariance_cpu/shape_invariance.py`),
the linear layers are not what differs in bf16: up to some height each row of a batched product is bit-for-bit
the row computed alone. Attention is what differs, since n queries over the cache are one kernel call with a mask where
plain decoding makes one mask-free call per token.

Strict verification therefore keeps the batched forward for everything but attention, and computes attention
one query row at a time, calling the base's own sdpa with exactly the keys and values (the cached ones, then
the row's ancestors and itself, in order) and no mask, as a one-token forward would. Two conditions make the
whole forward match one-token forwards bit for bit, and both are checked here rather than assumed:

* every linear layer of the base gives each row the same bits in a batch as alone, for as many rows as a
  verification feeds. `row_invariant_rows` measures the tallest such batch for this base, dtype and device
  (a kernel's choice depends on shapes, not values, so random inputs reveal it); drafts are cut to fit it.
  Where even two rows differ (float32 on the CPUs seen: a one-row product takes another kernel) nothing can
  be verified strictly and decoding is plain.
* one-token decoding attends over the whole cache without a mask: sdpa attention, no sliding window.
  `check_strict_support` refuses other bases.

The rest of a decoder layer (norms, rotary embeddings, activations, residual sums) is computed row by row
already. What strict mode costs is one attention call per verified row and layer instead of one per layer.
"""

from __future__ import annotations

import threading
import weakref
from typing import Iterator

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.pytorch_utils import Conv1D

from ..compat import attn_implementation
from ..module_views import attention_view, model_configs

STRICT_ATTENTION = "cerberus_strict_sdpa"
MAX_STRICT_ROWS = 64  # the tallest verification whose row invariance is measured
INVARIANCE_TRIALS = 16  # random batches each layer's row invariance is measured on

_invariant_rows: "weakref.WeakKeyDictionary[nn.Module, dict[tuple, int]]" = weakref.WeakKeyDictionary()


# per thread, the plan of the mask of the forward it is running (threads verify concurrently)
_last_plan = threading.local()


def _tree_plan(attention_mask: torch.Tensor, queries: int) -> list[tuple[int, int]]:
    """``(row, path length)`` for each query row of a tree block, in depth-first order. ``attention_mask`` is the
    tree mask `verification.verify` passes (additive float, 0 where visible, or bool), of which only the fed columns are read
    (the cache before them is visible to every row). A row sees the root, its ancestors and itself, which come
    in that order among the fed positions (a tree lists parents before children), so its parent is the last
    position it sees before itself. One plan serves every layer of a forward: it is kept for its mask."""
    last = getattr(_last_plan, "value", None)
    if last is not None and last[0]() is attention_mask:
        return last[1]
    fed = attention_mask[0, 0, :, -queries:]
    visible = [row.nonzero()[:, 0].tolist() for row in (fed if fed.dtype == torch.bool else fed == 0)]
    children: list[list[int]] = [[] for _ in visible]
    for row, seen in enumerate(visible):
        if len(seen) > 1:
            children[seen[-2]].append(row)
    plan, stack = [], [row for row, seen in enumerate(visible) if len(seen) == 1][::-1]
    while stack:
        row = stack.pop()
        plan.append((row, len(visible[row])))
        stack.extend(reversed(children[row]))
    _last_plan.value = (weakref.ref(attention_mask), plan)
    return plan


def _row_keys(key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
              queries: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """``(row, keys, values)`` per query row: what a one-token forward at that position attends to, the cache
    before the fed block, then the fed positions the row sees, in order. A causal block's rows (no mask) are
    prefixes of the cache (views). A tree's rows come depth first and share one buffer holding the cache once:
    each row's path is its parent's, laid out already, plus itself, so a row writes one position."""
    past = key.shape[2] - queries
    if attention_mask is None:
        for row in range(queries):
            yield row, key[:, :, : past + row + 1], value[:, :, : past + row + 1]
        return
    plan = _tree_plan(attention_mask, queries)
    longest = past + max(length for _, length in plan)
    keys = key.new_empty(*key.shape[:2], longest, key.shape[3])
    values = value.new_empty(*value.shape[:2], longest, value.shape[3])
    keys[:, :, :past], values[:, :, :past] = key[:, :, :past], value[:, :, :past]
    for row, length in plan:
        keys[:, :, past + length - 1], values[:, :, past + length - 1] = key[:, :, past + row], value[:, :, past + row]
        yield row, keys[:, :, : past + length], values[:, :, : past + length]


def strict_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention of ``query`` ([batch 1, heads, q, head_dim]) one row at a time: row i calls the base's sdpa
    with no mask over the keys a one-token forward at its position reads (`_row_keys`), which is the call such
    a forward makes (transformers' sdpa packs grouped query heads for one query the same way either way)."""
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    queries = query.shape[2]
    if queries == 1:
        return sdpa(module, query, key, value, None, **kwargs)
    rows: list[torch.Tensor | None] = [None] * queries
    for row, keys, values in _row_keys(key, value, attention_mask, queries):
        rows[row], _ = sdpa(module, query[:, :, row : row + 1], keys, values, None, **kwargs)
    return torch.cat(rows, dim=1), None


AttentionInterface.register(STRICT_ATTENTION, strict_attention_forward)


def check_strict_support(model: nn.Module) -> None:
    """Refuse a base whose one-token forward is not what `strict_attention_forward` reproduces."""
    implementation = attn_implementation(model.config)
    if implementation != "sdpa":
        raise ValueError(
            f"strict=True needs the base's attention to be 'sdpa' (it is {implementation!r}): strict verification "
            "recomputes each verified position's attention with the call a one-token sdpa forward makes. Load the "
            "base with attn_implementation='sdpa'."
        )
    for config in model_configs(model):
        layer_types = getattr(config, "layer_types", None) or []
        if getattr(config, "sliding_window", None) is not None or "sliding_attention" in layer_types:
            raise ValueError(
                "strict=True does not support bases with sliding-window attention: a one-token forward past the "
                "window attends under a mask, which strict verification does not reproduce."
            )


def _linear_layers(model: nn.Module) -> dict[tuple, nn.Module]:
    """One module per distinct matrix-product kernel the base runs: by class, weight shape, dtype, device, bias."""
    layers = {}
    for module in model.modules():
        if isinstance(module, (nn.Linear, Conv1D)):
            weight = module.weight
            layers.setdefault((type(module), tuple(weight.shape), weight.dtype, weight.device,
                               module.bias is not None), module)
    return layers


@torch.no_grad()
def _module_invariant_rows(module: nn.Module, limit: int, trials: int = INVARIANCE_TRIALS) -> int:
    """The largest m <= ``limit`` such that for every height 2..m, each row of ``module`` applied to m rows
    equals, bit for bit, the row applied alone, over ``trials`` batches of random rows.

    One batch is not enough: where a kernel sums in another order for more rows, the result often rounds to the same
    bf16 value anyway, and a layer that one batch calls invariant for many rows can differ from 2 rows on, which
    lets strict decoding depart from plain `generate()` (the case that showed it: docs/precision.md)."""
    weight = module.weight
    fan_in = weight.shape[1] if isinstance(module, nn.Linear) else weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    invariant = limit
    for _ in range(trials):
        x = torch.randn(invariant, fan_in, generator=generator).to(device=weight.device, dtype=weight.dtype)
        alone = torch.cat([module(x[i : i + 1]) for i in range(invariant)])
        for rows in range(2, invariant + 1):
            if not torch.equal(module(x[:rows]), alone[:rows]):
                invariant = rows - 1
                break
        if invariant == 1:
            break
    return invariant


def row_invariant_rows(model: nn.Module, limit: int = MAX_STRICT_ROWS) -> int:
    """How many positions, at most ``limit``, one forward of ``model`` may compute with each row's linear layers
    bit-identical to a one-row forward's, on its current dtype and device (1: none beside the root). Measured once per
    base, dtype and device and remembered; a taller ``limit`` than any measured, where no height had differed,
    measures again. Its cost grows with the square of ``limit``: a few seconds for a 135M model to 64 rows where bf16
    has fast kernels, minutes where it has none (an AVX2-only CPU), so a call measures only as tall as it verifies."""
    first = next(model.parameters())
    known = _invariant_rows.setdefault(model, {})
    for (dtype, device, measured_to), rows in known.items():
        if (dtype, device) == (first.dtype, first.device) and (rows < measured_to or measured_to >= limit):
            return min(rows, limit)
    rows = min((_module_invariant_rows(module, limit) for module in _linear_layers(model).values()), default=limit)
    known[(first.dtype, first.device, limit)] = rows
    return rows


def strict_view(model: nn.Module) -> nn.Module:
    """A view of ``model`` (`module_views`) whose attention layers run `strict_attention_forward`; the base
    itself, which other threads may be running, is left as it is. The view builds no mask of its own (a tree's
    4D mask passes through; a chain arrives as None, read as causal)."""
    return attention_view(model, STRICT_ATTENTION)
