"""The verification forward's inputs and the KV cache's roll-back after it, shared by the single-sequence loop
(`loop`) and the batched one (`batched`).

A verification step feeds the base the newest token and a draft (a chain, or a tree under a 4D mask) in one forward,
at depth-based positions; afterwards only the accepted branch may stay in the cache, moved in place to the front of
the positions fed, and the rest is cut off.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Cache, DynamicCache

from ..compat import cache_argument, tree_attention_ok
from .proposer import Draft
from ..blocks.transfer import to_device


def verify(model: nn.Module, cache: DynamicCache, input_ids: torch.LongTensor, draft: Draft | None):
    """One base forward over the last token and the draft, at depth-based positions, under tree attention
    (a chain needs only the model's own causal mask)."""
    past = input_ids.shape[1] - 1
    if draft is None:
        step_input, mask = input_ids[:, -1:], None
        position_ids = torch.full((1, 1), past, device=input_ids.device)
    else:
        step_input = torch.cat([input_ids[:, -1:], draft.tokens[None]], dim=-1)
        mask = None if draft.tree.is_chain else draft.tree.attention_mask(past, model.dtype, input_ids.device)
        position_ids = (past + draft.tree.on(input_ids.device).position_offsets)[None]
    return model(
        input_ids=step_input, position_ids=position_ids, attention_mask=mask, use_cache=True, **cache_argument(cache)
    )


def keep_cache_positions(cache: Cache, fed: int, keep: list[list[int]], end: int | None = None) -> int:
    """Keep, of the last ``fed`` cached positions of each batch row, those at indices ``keep[row]`` (ascending), moved
    to the front of them; cut the cache after the longest row's. Returns the positions kept (in a batch, a row that
    kept fewer has empty slots after its own, which the batched loop's mask hides).

    Only the ``fed`` newest positions are copied, in place, and the index goes to each device once, not once per layer
    (on CUDA each copy of it is a host sync); then the cache's own ``crop`` drops the tail, so each layer type keeps its
    bookkeeping (e.g. sliding-window lengths) right. ``end``: the cache's length, given for a static cache, whose
    tensors are longer than what it holds (a dynamic cache's length is its tensors')."""
    width = max(len(k) for k in keep)
    if any(k != list(range(len(k))) for k in keep):
        orders = [k + [i for i in range(fed) if i not in set(k)] for k in keep]
        index_on: dict[torch.device, torch.Tensor] = {}
        for layer in cache.layers:
            if not getattr(layer, "is_initialized", True) or layer.keys is None or layer.keys.numel() == 0:
                continue
            device = layer.keys.device
            if device not in index_on:
                index_on[device] = to_device(orders, device)[:, None, :, None]
            stop = layer.keys.shape[-2] if end is None else end
            for tensor in (layer.keys, layer.values):
                index = index_on[device].expand(-1, tensor.shape[1], -1, tensor.shape[-1])
                tensor[..., stop - fed: stop, :] = tensor[..., stop - fed: stop, :].gather(-2, index)
    if width < fed:
        cache.crop(-(fed - width))
    return width


def step_inputs(rows: list[torch.LongTensor], drafts: list[Draft | None], lengths: list[int], valid: torch.Tensor,
                 dtype: torch.dtype, pad: int, width: int = 0
                ) -> tuple[torch.LongTensor, torch.LongTensor, torch.Tensor]:
    """(tokens ``[L, F]``, positions ``[L, F]``, additive mask ``[L, 1, F, slots + F]``) of one verification forward:
    each row's newest token and draft, padded to the widest; a row sees its valid slots (``valid`` ``[L, slots]``) and
    its own tree, a padding position only itself. ``lengths``: each row's token count (its newest token included);
    ``width``: feed at least that many positions (a compiled forward's fixed size)."""
    device = valid.device
    fed = max(width, 1 + max((len(d.tokens) for d in drafts if d is not None), default=0))
    count = len(rows)
    tokens = torch.full((count, fed), pad, dtype=torch.long, device=device)
    offsets = torch.zeros(count, fed, dtype=torch.long)
    tree = torch.eye(fed, dtype=torch.bool).repeat(count, 1, 1)
    for i, (row, draft) in enumerate(zip(rows, drafts)):
        tokens[i, :1] = row[0, -1:]
        if draft is not None:
            n = len(draft.tokens) + 1
            tokens[i, 1:n] = draft.tokens
            offsets[i, :n] = draft.tree.position_offsets
            tree[i, :n, :n] = draft.tree.ancestor_mask
    positions = torch.tensor(lengths)[:, None] - 1 + offsets
    allowed = torch.cat([valid[:, None, :].expand(-1, fed, -1), to_device(tree, device)], dim=-1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return tokens, to_device(positions, device), mask[:, None]


class Verification:
    """The verification forward of one sequence over generate()'s dynamic cache, and the roll-back after it; the
    loop's only way to the cache, so that a static one (`static_cache.StaticVerification`) can stand in."""

    def __init__(self, cache: Cache):
        self.cache = cache
        self.fed = 0  # positions fed by the last forward

    def forward(self, model: nn.Module, input_ids: torch.LongTensor, draft: Draft | None, captured: dict):
        """`verify` of ``draft`` after ``input_ids``; ``captured`` (the drafter's record of the forward) is left as the
        forward's hooks wrote it."""
        self.fed = 1 + (len(draft.tokens) if draft is not None else 0)
        return verify(model, self.cache, input_ids, draft)

    def keep(self, kept: list[int]) -> None:
        """Keep of the last forward's positions those at ``kept`` (the root and the accepted branch)."""
        keep_cache_positions(self.cache, self.fed, [kept])

    def max_draft(self, past: int) -> int | None:
        """The most draft nodes a forward after ``past`` cached positions can take (None: no limit)."""
        return None

    def fit(self, model: nn.Module, proposer, draft: Draft | None, past: int, strict_rows: int | None
            ) -> Draft | None:
        """``draft`` cut to what this step can verify after ``past`` verified positions: its top chain where the base's
        attention takes no tree at this length, at most ``strict_rows - 1`` nodes under strict verification, and no
        more than the room left (``proposer`` records the cut, `Proposer.cut_to`)."""
        if draft is None:
            return None
        if not draft.tree.is_chain and not tree_attention_ok(model, past + 1 + len(draft.tokens)):
            draft = proposer.fall_back_to_chain(draft)
        if draft is not None and strict_rows is not None and len(draft.tokens) >= strict_rows:
            draft = proposer.cut_to(draft, strict_rows - 1)
        room = self.max_draft(past)
        if draft is not None and room is not None and len(draft.tokens) > room:
            draft = proposer.cut_to(draft, room)
        return draft


class RowsVerification:
    """The verification forward of a batch's live rows over one dynamic cache, the roll-back after it, and the rows
    that leave: ``valid`` (``[rows, slots]``) marks each row's slots, so that its left padding and the empty slots a
    shorter accepted branch leaves stay hidden (`batched`)."""

    def __init__(self, cache: Cache, valid: torch.Tensor):
        self.cache, self.valid = cache, valid
        self.fed = 0  # positions fed by the last forward (the widest row's)

    def forward(self, model: nn.Module, rows: list[torch.LongTensor], drafts: list[Draft | None], lengths: list[int],
                pad: int):
        """One forward over every row's newest token and draft (`step_inputs`); ``lengths``: each row's token count
        without its padding."""
        tokens, positions, attention = step_inputs(rows, drafts, lengths, self.valid, model.dtype, pad)
        self.fed = tokens.shape[1]
        return model(input_ids=tokens, position_ids=positions, attention_mask=attention, use_cache=True,
                     **cache_argument(self.cache))

    def keep(self, kept: list[list[int]]) -> None:
        """Keep of each row's fed positions those at ``kept[row]``; a row that kept fewer leaves hidden slots."""
        slots = keep_cache_positions(self.cache, self.fed, kept)
        new = torch.arange(slots)[None, :] < torch.tensor([len(k) for k in kept])[:, None]
        self.valid = torch.cat([self.valid, new.to(self.valid.device)], dim=-1)

    def drop(self, staying: list[int]) -> None:
        """Keep only the rows at ``staying`` (in the cache's order)."""
        self.cache.batch_select_indices(to_device(staying, self.valid.device, torch.long))
        self.valid = self.valid[staying]

