"""Grouped-query attention on the CPU without copying the cache for every query head.

A verification forward attends several queries under a mask (a tree's, or the causal one past the cache). For a
base with grouped-query attention (fewer key/value heads than query heads, as SmolLM2, Llama 3 and Qwen have),
transformers' sdpa then repeats each key and value head for every query head it serves (`repeat_kv`): a copy of
the layer's whole cache, every layer, every step, growing with the context. It asks the kernel to group the heads
itself (``enable_gqa``) only where no mask is given, since CUDA's fused kernels take no mask with it; torch's CPU
attention kernel takes both (torch 2.13 does; 2.6 falls back to its math kernel, and the view then leaves sdpa as
it is), and computes the same bits either way (`tests/test_grouped_attention.py`).

`grouped_attention_view` is the view of a base (`module_views.attention_view`) whose attention calls
`grouped_attention_forward` instead: that one call with ``enable_gqa`` where a CPU forward attends several queries
under a mask with grouped heads, transformers' sdpa for everything else. `CerberusForCausalLM.decoding_view` takes
it for every CPU decoding call but strict verification's (which has its own attention). What it saves is measured
in benchmarks/avx2_verify_cost_emulated_epyc_cpu.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..compat import attn_implementation
from ..module_views import attention_view

GROUPED_ATTENTION = "cerberus_grouped_sdpa"


def grouped_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                              **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, except that several masked queries over grouped key/value heads on the CPU
    attend through one kernel call that groups the heads itself, with no copy of the keys and values."""
    grouped = (getattr(module, "num_key_value_groups", 1) > 1 and attention_mask is not None and query.shape[2] > 1
               and query.device.type == "cpu" and key.shape[-1] == value.shape[-1]
               and kwargs.get("position_bias") is None and kwargs.get("softcap") is None
               and _kernel_groups_heads(query.dtype, query.shape[-1], attention_mask.dtype))
    if not grouped:
        return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, dropout=dropout,
                                               scaling=scaling, **kwargs)
    output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                              dropout_p=dropout, scale=scaling, enable_gqa=True)
    return output.transpose(1, 2).contiguous(), None


@functools.lru_cache(maxsize=None)
def _kernel_groups_heads(dtype: torch.dtype, head_dim: int, mask_dtype: torch.dtype) -> bool:
    """Whether torch's CPU attention picks the same kernel for grouped heads under a mask as for repeated ones: its
    fused kernel groups heads in torch 2.13; in torch 2.6 ``enable_gqa`` with a mask falls back to the math kernel,
    which is slower and sums in another order. Asked of torch's own dispatcher (`torch._fused_sdp_choice`)."""
    query = torch.zeros(1, 2, 2, head_dim, dtype=dtype)
    grouped, repeated = torch.zeros(1, 1, 4, head_dim, dtype=dtype), torch.zeros(1, 2, 4, head_dim, dtype=dtype)
    mask = torch.zeros(1, 1, 2, 4, dtype=mask_dtype)
    choice = functools.partial(torch._fused_sdp_choice, attn_mask=mask, dropout_p=0.0, is_causal=False, scale=None)
    return choice(query, grouped, grouped, enable_gqa=True) == choice(query, repeated, repeated, enable_gqa=False)


AttentionInterface.register(GROUPED_ATTENTION, grouped_attention_forward)
# the masks sdpa gets (None where sdpa's causal flag serves): an implementation without one is handed no mask at all
AttentionMaskInterface.register(GROUPED_ATTENTION, sdpa_mask)


def grouped_attention_view(base: nn.Module) -> nn.Module:
    """``base`` computing its attention through `grouped_attention_forward` where that can save a copy (an sdpa base
    on the CPU); else ``base`` itself."""
    if base.device.type != "cpu" or attn_implementation(base.config) != "sdpa":
        return base
    return attention_view(base, GROUPED_ATTENTION)
