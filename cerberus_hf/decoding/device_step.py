"""The draft-verify-accept step as tensors on the device, batch-first, with no host read inside it.

Greedy decoding with a static tree (Medusa, Cerberus, Hydra, Clover, EAGLE-3; a chain is a tree with one path) runs
each step as one function of persistent device buffers, the shape of which never changes within a call
(`DeviceStep.step`):

1. **draft**: the drafter guesses the tree's tokens for every row from the state that predicted the row's newest
   token (`draft_static_rows`);
2. **verify**: the base reads every row's newest token and tree in one forward over a KV cache whose slots are
   allocated once (`RowSlotCache`): each row writes its fed positions right after its own length, and a 4D mask shows
   a row its own past and its tree's ancestry;
3. **accept**: the base's argmax at every fed position is compared with the drafted children; a node is kept when its
   token is its parent's choice, it is the first such child, and so are its ancestors (`greedy_accept`); generate()'s
   end-of-sequence and length stops cut the row's emitted tokens there;
4. **commit**: the accepted branch's keys and values move to the front of the row's fed slots, the row's length,
   position, newest token and state advance by what it emitted.

The host reads one small tensor a step (each row's emitted tokens and their count). Every shape depends only on the
batch, the tree and the cache's room, so the step compiles once with ``torch.compile(fullgraph=True)`` and, on CUDA,
replays as CUDA graphs (``mode="reduce-overhead"``); prompts of any length up to the room reuse it.

The drafter's state comes out of the base's forward as an output (the last hidden state, the ``lm_head``'s input), not
through a hook, so nothing breaks the base's graph. What this step does not do is decided once, before a call uses it
(`paths.device_step_refusal`): sampling, logits processors, stop criteria other than length and end of sequence, grown
trees, Kangaroo (it drafts through the base's own cache), strict verification, sliding windows and flash attention. It
drafts every step without prompt lookup (which would change the tree's shape from step to step) and without the
entropy gate (a graph verifies its whole tree, so skipping the draft saves nothing); both change only the speed, never
the tokens.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from transformers import GenerationConfig
from transformers.generation.logits_process import LogitsProcessorList
from transformers.generation.stopping_criteria import StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.utils import logging

from ..blocks.batching import pad_batch
from ..blocks.row_cache import RowSlotCache
from ..blocks.stats import GenerationStats
from ..blocks.tree import TreeSpec
from ..compat import cache_argument
from ..drafters.base import Drafter
from .loop import host_stopping

logger = logging.get_logger(__name__)


@dataclass(frozen=True)
class TreeIndex:
    """A static tree's index tensors on one device, as the step reads them."""

    tree: TreeSpec
    size: int  # N nodes
    depth: int
    top_k: int
    parent_positions: torch.Tensor  # [N]
    earlier_siblings: torch.Tensor  # [N, N]
    node_ancestors: torch.Tensor  # [N, N]
    ancestor_mask: torch.Tensor  # [T, T], T = N + 1 fed positions
    offsets: torch.Tensor  # [T] depth of each fed position
    depth_of: torch.Tensor  # [N] depth of each node (1-based)
    # per depth (its nodes follow the shallower ones'): each node's parent row, its rank, the parents' paths
    # ([P, depth]; None at the root) and the rows of the next depth's parents among this depth's nodes
    levels: tuple

    @classmethod
    def build(cls, tree: TreeSpec, device: torch.device) -> "TreeIndex":
        on = tree.on(device)
        levels = []
        for depth, ((members, parents, rows), (members_on, rows_on, ranks_on)) in enumerate(
                zip(tree.levels, on.levels)):
            if members != list(range(members[0], members[0] + len(members))):
                raise ValueError("a tree must list its nodes depth by depth")  # `TreeSpec` sorts them so
            # each parent's path from the root's child (the previous depth's `level_paths`)
            paths = [tree.level_paths[depth - 1][tree.levels[depth - 1][0].index(p)] for p in parents] \
                if parents[0] >= 0 else None
            # the next depth's parents are members of this one: the rows of their own parents' expansion
            following = tree.levels[depth + 1][1] if depth + 1 < len(tree.levels) else []
            levels.append((rows_on, ranks_on,
                           torch.tensor(paths, dtype=torch.long, device=device) if paths else None,
                           torch.tensor([rows[members.index(p)] for p in following], dtype=torch.long,
                                        device=device)))
        return cls(tree, len(tree), tree.depth, tree.top_k, on.parent_positions, on.earlier_siblings,
                   on.node_ancestors, on.ancestor_mask, on.position_offsets, on.position_offsets[1:], tuple(levels))


def draft_static_rows(drafter: Drafter, index: TreeIndex, hidden: torch.Tensor, last: torch.Tensor,
                      context: object | None = None) -> torch.Tensor:
    """Every row's draft of the static tree (``[B, N]`` token ids) from what the heads read for each row (``hidden``
    ``[B, hidden]``: by default the state that predicted the row's newest token) and those tokens (``last`` ``[B]``):
    depth by depth, one drafter call per depth over every row (and, for a drafter that reads the tokens above a node,
    every parent of that depth, rows first). ``context``: what drafting attends to per row (EAGLE-3's cache)."""
    rows = hidden.shape[0]
    top_k = index.top_k
    picked: list[torch.Tensor] = []  # each depth's nodes' tokens [B, members]: the tree lists nodes depth by depth
    previous: torch.Tensor | None = None  # the drafter's state at the parents of the depth being drafted
    for depth, (parent_rows, ranks, paths, following) in enumerate(index.levels):
        if not drafter.reads_tokens:  # one guess per depth serves every node of it
            tokens = last[:, None].expand(rows, depth + 1)
            previous, logits = drafter.draft_level(depth, hidden, tokens, previous, context)
            picked.append(drafter.token_ids(logits.topk(top_k, dim=-1).indices)[:, ranks])  # [B, members]
            continue
        parents = 1 if paths is None else paths.shape[0]
        above = last[:, None, None].expand(rows, parents, 1)
        if paths is not None:
            above = torch.cat([above, torch.cat(picked, dim=1)[:, paths]], dim=-1)  # [B, P, depth + 1]
        state, logits = drafter.draft_level(
            depth, hidden.repeat_interleave(parents, dim=0), above.reshape(rows * parents, depth + 1),
            None if previous is None else previous.reshape(rows * parents, *previous.shape[2:]), context)
        top = drafter.token_ids(logits.topk(top_k, dim=-1).indices).view(rows, parents, top_k)
        picked.append(top[:, parent_rows, ranks])
        previous = state.view(rows, parents, *state.shape[1:])[:, following]  # the next depth's parents' states
    return torch.cat(picked, dim=1)


@dataclass
class Accepted:
    """What greedy acceptance decided for every row: the fed positions of the accepted path (``path`` ``[B, D + 1]``,
    the root first, zero past the row's count), the tokens the row emits (``tokens`` ``[B, D + 1]``), how many
    (``count`` ``[B]``), and whether a stop fired (``stopped`` ``[B]``)."""

    path: torch.Tensor
    tokens: torch.Tensor
    count: torch.Tensor
    stopped: torch.Tensor


def greedy_accept(logits: torch.Tensor, nodes: torch.Tensor, index: TreeIndex, eos: torch.Tensor,
                  remaining: torch.Tensor) -> Accepted:
    """Greedy acceptance of every row's tree (``logits`` ``[B, T, V]`` at the fed positions, ``nodes`` ``[B, N]``), cut
    at the first end-of-sequence token (``eos``: ids) and at ``remaining`` tokens a row may still emit; exactly what
    walking each row's tree token by token emits."""
    choices = logits.float().argmax(dim=-1)  # [B, T]: the root's choice, then each node's
    match = nodes == choices[:, index.parent_positions]
    match &= ~(index.earlier_siblings[None] & match[:, None, :]).any(dim=-1)
    accepted = ~(index.node_ancestors[None] & ~match[:, None, :]).any(dim=-1)  # [B, N]: one path from the root
    depth = index.depth
    at_depth = accepted[:, None, :] & (index.depth_of[None, None, :] == torch.arange(
        1, depth + 1, device=logits.device)[None, :, None])  # [B, D, N]
    node_at = at_depth.long().argmax(dim=-1) + 1  # the accepted node's position at each depth
    count = 1 + accepted.sum(dim=-1)
    path = torch.cat([torch.zeros_like(count)[:, None], torch.where(at_depth.any(dim=-1), node_at, 0)], dim=1)
    tokens = choices.gather(1, path)
    steps = torch.arange(depth + 1, device=logits.device)[None, :]
    ended = torch.isin(tokens, eos) & (steps < count[:, None])
    first_end = torch.where(ended, steps, depth + 1).amin(dim=-1)
    count = torch.minimum(torch.where(ended.any(dim=-1), first_end + 1, count), remaining)
    return Accepted(path, tokens, count, ended.any(dim=-1) | (count >= remaining))


def _fixed_addresses(holder: object | None) -> None:
    """Tell the compiler that ``holder``'s tensors keep their memory from step to step (they are updated in place): a
    CUDA graph then reads and writes them where they are, instead of skipping the graph for mutated inputs or copying
    each into a graph-owned buffer before every replay."""
    values = list(vars(holder).values()) if holder is not None else []
    while values:
        value = values.pop()
        if isinstance(value, torch.Tensor):
            torch._dynamo.mark_static_address(value)
        elif isinstance(value, (tuple, list)):  # a tree's levels
            values.extend(value)


class DeviceStep:
    """Greedy draft-verify decoding of ``rows`` rows with a static ``tree``, every step on the device (module
    docstring). Built once per base, drafter, rows, tree and room (`runner`), its buffers serve every call; a call
    fills them (`start`) and steps (`step`) until every row has stopped."""

    def __init__(self, base: nn.Module, drafter: Drafter, tree: TreeSpec, rows: int, room: int,
                 compile_mode: str | None = None):
        self.base, self.drafter, self.rows, self.room = base, drafter, rows, room
        device = base.device
        self.index = TreeIndex.build(tree, device)
        self.fed = len(tree) + 1
        self.cache = RowSlotCache(base.config.get_text_config().num_hidden_layers, room)
        self.tree_moves = not tree.is_chain  # a chain's accepted path is always the front of what it fed
        self.dtype = base.dtype
        self.lock = threading.Lock()
        self.warm = False  # its first call has run (and compiled)
        long = dict(dtype=torch.long, device=device)
        self.last = torch.zeros(rows, **long)  # each row's newest token (not in the cache yet)
        self.position = torch.zeros(rows, **long)  # its position id
        self.length = torch.zeros(rows, **long)  # the row's slots in use (its left padding included)
        self.remaining = torch.zeros(rows, **long)  # tokens it may still emit
        self.stopped = torch.zeros(rows, dtype=torch.bool, device=device)
        self.visible = torch.zeros(rows, room, dtype=torch.bool, device=device)  # False at left-padding slots
        self.hidden = torch.zeros(rows, base.config.get_text_config().hidden_size, dtype=drafter.dtype, device=device)
        self.eos = torch.zeros(0, **long)
        self.kept = drafter.device_rows(rows, room, device)  # what the drafter keeps per row across steps, if anything
        self.slot_range = torch.arange(room, device=device)
        self.fed_range = torch.arange(self.fed, device=device)
        self.path_range = torch.arange(tree.depth + 1, device=device)
        for holder in (self, self.index, self.kept):
            _fixed_addresses(holder)
        self.step = self._step if compile_mode is None else torch.compile(
            self._step, fullgraph=True, mode=None if compile_mode == "default" else compile_mode)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, slots: torch.Tensor):
        """(the hidden states: the embeddings, each decoder layer's output and the lm_head's input ``[B, n, hidden]``
        last; logits ``[B, n, V]``) of the base over ``tokens`` at ``slots``."""
        self.cache.slots = slots
        additive = torch.zeros(mask.shape, dtype=self.dtype, device=mask.device).masked_fill_(
            ~mask, torch.finfo(self.dtype).min)
        out = self.base(input_ids=tokens, position_ids=positions, attention_mask=additive[:, None], use_cache=True,
                        output_hidden_states=True, **cache_argument(self.cache))
        return out.hidden_states, out.logits

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
              eos: torch.Tensor) -> list[list[int]]:
        """Prefill the left-padded prompts (``[B, width]``) and pick each row's first token; returns those tokens
        (a row that stopped there has them only)."""
        width = input_ids.shape[1]
        valid = attention_mask.bool()
        self.visible.fill_(True)
        self.visible[:, :width] = valid
        causal = torch.ones(width, width, dtype=torch.bool, device=valid.device).tril()
        mask = torch.zeros(self.rows, width, self.room, dtype=torch.bool, device=valid.device)
        mask[:, :, :width] = causal[None] & valid[:, None, :]
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        states, logits = self.forward(input_ids, positions, mask, self.slot_range[:width].expand(self.rows, -1))
        first = logits[:, -1].float().argmax(dim=-1)
        self.eos = eos
        self.last.copy_(first)
        self.hidden.copy_(states[-1][:, -1].to(self.hidden.dtype))
        self.position.copy_(positions[:, -1] + 1)
        self.length.fill_(width)
        self.remaining.fill_(max_new_tokens - 1)
        self.stopped.copy_(torch.isin(first, eos) | (self.remaining <= 0))
        if self.kept is not None:  # each prompt state with the token after it
            self.kept.start(self.drafter.device_states(states), torch.cat([input_ids[:, 1:], first[:, None]], 1), valid)
        return [[token] for token in first.tolist()]

    def _mask(self) -> torch.Tensor:
        """``[B, fed, room]``: each fed position sees its row's past and its own ancestors."""
        relative = self.slot_range[None, :] - self.length[:, None]  # [B, room]: slot index within the fed window
        in_window = (relative >= 0) & (relative < self.fed)
        ancestry = self.index.ancestor_mask[:, relative.clamp(0, self.fed - 1)].permute(1, 0, 2)  # [B, fed, room]
        past = (relative < 0) & self.visible
        return (past[:, None, :] | (in_window[:, None, :] & ancestry))

    def _step(self) -> torch.Tensor:
        """One draft-verify-accept-commit step; returns ``[B, D + 3]``: each row's emitted tokens (-1 past them), their
        count, and whether the row has stopped."""
        heads_read = self.hidden if self.kept is None else self.kept.read(self.hidden)
        context = None if self.kept is None else self.kept.context()
        nodes = draft_static_rows(self.drafter, self.index, heads_read, self.last, context)
        tokens = torch.cat([self.last[:, None], nodes], dim=1)
        positions = self.position[:, None] + self.index.offsets[None]
        slots = self.length[:, None] + self.fed_range[None]
        states, logits = self.forward(tokens, positions, self._mask(), slots)
        accepted = greedy_accept(logits, nodes, self.index, self.eos, self.remaining)
        live = ~self.stopped
        count = torch.where(live, accepted.count, 0)
        if self.tree_moves:
            source = self.length[:, None] + accepted.path
            for layer in self.cache.layers:
                layer.move(source, self.length[:, None] + self.path_range[None])
        newest = (count - 1).clamp(min=0)[:, None]  # the newest emitted token's index on the accepted path
        if self.kept is not None:  # the accepted path's states, each with the token after it
            kept = self.drafter.device_states(states)
            self.kept.extend(kept.gather(1, accepted.path[..., None].expand(-1, -1, kept.shape[-1])), accepted.tokens,
                             count)
        hidden = states[-1]
        last_position = accepted.path.gather(1, newest)  # the fed position that predicted the newest token
        state = hidden.gather(1, last_position[..., None].expand(-1, -1, hidden.shape[-1]))[:, 0]
        self.hidden.copy_(torch.where(live[:, None], state.to(self.hidden.dtype), self.hidden))
        self.last.copy_(torch.where(live, accepted.tokens.gather(1, newest)[:, 0], self.last))
        self.length.add_(count)
        self.position.add_(count)
        self.remaining.sub_(count)
        self.stopped.logical_or_(live & accepted.stopped)
        emitted = torch.where(self.path_range[None] < count[:, None], accepted.tokens, -1)
        return torch.cat([emitted, count[:, None], self.stopped[:, None].long()], dim=1)

    def decode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
               eos: torch.Tensor, drafter: Drafter | None = None) -> tuple[list[list[int]], list[list[int]]]:
        """Every row's new tokens (each cut at its stop) and the tokens each of its steps emitted, one host read a
        step."""
        with self.lock:  # one call at a time on these buffers; ``drafter``: the call's view of the heads
            if drafter is not None:
                self.drafter = drafter
            new = self.start(input_ids, attention_mask, max_new_tokens, eos)
            done = self.stopped.tolist()
            counts: list[list[int]] = [[] for _ in new]
            while not all(done):
                packed = self.step().tolist()  # the step's one read
                for row, values in enumerate(packed):
                    if not done[row]:
                        new[row].extend(values[: values[-2]])
                        counts[row].append(values[-2])
                    done[row] = bool(values[-1])
        return new, counts


class DeviceDecoding:
    """`generate()`'s decoding callable for the device step: the rows of a left-padded batch decoded by a `DeviceStep`
    kept on ``owner`` per batch size and tree (built, and on CUDA compiled, once), or by ``fallback`` (the draft-verify
    loop) where generate() prepared logits processors or stopping criteria the step does not apply, said in one
    line."""

    def __init__(self, owner: nn.Module, drafter: Drafter, tree: TreeSpec, stats: GenerationStats,
                 fallback: Callable, compile_mode: str | None):
        self.owner, self.drafter, self.tree, self.stats = owner, drafter, tree, stats
        self.fallback, self.compile_mode = fallback, compile_mode

    def __call__(self, model: nn.Module, input_ids: torch.LongTensor, logits_processor: LogitsProcessorList,
                 stopping_criteria: StoppingCriteriaList, generation_config: GenerationConfig, synced_gpus=False,
                 **model_kwargs):
        stops = host_stopping(stopping_criteria)
        if len(logits_processor) or stops is None:
            logger.warning_once("cerberus-hf: the device step is not used here (generate() prepared logits "
                                "processors or stopping criteria it does not apply); decoding with the loop.")
            return self.fallback(model, input_ids, logits_processor, stopping_criteria, generation_config,
                                 synced_gpus=synced_gpus, **model_kwargs)
        max_length, eos_ids = stops
        rows, width = input_ids.shape
        new_tokens = (max_length if max_length is not None else generation_config.max_length) - width
        mask = model_kwargs.get("attention_mask")
        mask = torch.ones_like(input_ids) if mask is None else mask
        step = self.runner(rows, width + new_tokens)
        eos = torch.tensor(sorted(eos_ids), dtype=torch.long).to(input_ids.device)
        started = time.perf_counter()
        with torch.no_grad():
            new, counts = step.decode(input_ids, mask, new_tokens, eos, self.drafter)
        if self.compile_mode is not None and not step.warm:
            step.warm = True
            logger.warning(f"cerberus-hf: compiled the device step for {rows} row(s) and a tree of {len(self.tree)} "
                           f"nodes in {time.perf_counter() - started:.1f} s, once for this model, batch and tree.")
        for row_counts in counts:
            self.stats.record_step(1, 0, 0)  # the prefill
            for count in row_counts:
                self.stats.record_step(count, self.tree.depth, len(self.tree))
        # padded as batched generate() pads: the prompts as given, each row's new tokens, the pad id after a row's end
        prompts = [input_ids[b: b + 1] for b in range(rows)]
        out = pad_batch(input_ids, prompts, [torch.cat([prompt, prompt.new_tensor([tokens])], dim=1)
                                             for prompt, tokens in zip(prompts, new)], generation_config)
        return GenerateDecoderOnlyOutput(sequences=out) if generation_config.return_dict_in_generate else out

    def runner(self, rows: int, length: int) -> DeviceStep:
        """The owner's `DeviceStep` for this batch size and tree with room for ``length`` tokens and a step, built on
        first use (and rebuilt, larger, for a longer call: the rooms are powers of two, so a few sizes serve every
        call)."""
        room = max(SMALLEST_ROOM, 1 << (length + len(self.tree)).bit_length())  # a power of two: few sizes compile
        key = (rows, self.tree.paths, self.compile_mode)
        with _RUNNERS_LOCK:
            runners = self.owner.__dict__.setdefault("_cerberus_device_steps", {})
            step = runners.get(key)
            if step is None or step.room < room:
                step = runners[key] = DeviceStep(self.owner.base, self.drafter, self.tree, rows, room,
                                                 self.compile_mode)
        return step


SMALLEST_ROOM = 512
_RUNNERS_LOCK = threading.Lock()
