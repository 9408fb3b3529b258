"""A base's own multi-token-prediction layers as a drafter (``head_type="mtp"``): DeepSeek-V3, GLM-4.5 and others ship
them beside the base's weights, and transformers' ``generate(use_mtp=True)`` drafts a chain with them.

What an MTP layer is. Layer ``j`` (0-based) of the ``L`` the base ships is a decoder layer of the base's own kind
(``mtp_block``) behind a fusion: at sequence slot ``i`` its input is ``eh_proj([enorm(e(x_{i+j+1})); hnorm(s_i)])``,
where ``e`` is the base's input embedding, ``x_{i+j+1}`` the token ``j + 1`` places after slot ``i`` and ``s_i`` the
previous layer's output at slot ``i`` (for layer 0: the base's last hidden state ``h_i``, the lm_head's input). The
block attends, with rotary position ``i + j + 1``, to its own keys over the slots before; a norm (``post_norm``) and the
base's ``lm_head`` turn its output into a guess of ``x_{i+j+2}``. Layer ``j`` reads tokens up to ``x_{i+j+1}``, so at
the newest verified slot ``t`` (whose state predicted the verifier's newest token ``x_{t+1}``) the slots up to ``t - j``
read verified tokens only, and the slots after read the draft: what transformers' `MTPCandidateGenerator` computes,
keeping each layer's cache over the slots the verifier confirmed and recomputing the rest.

How it drafts here (`MtpState`, `MtpDrafter.draft_level`). Each layer ``j < num_heads`` keeps a KV cache over its
verified slots ``0 .. t - j`` and its output at the newest of them, extended once per step over what was verified since
(`MtpState.heads_input`). Depth 0 is layer 0's output at ``t``. A node at depth ``k >= 1`` runs layer ``k`` over its
draft slots ``t - k + 1 .. t`` with the path's drafted tokens and its parent's outputs of layer ``k - 1`` there,
attending to layer ``k``'s cache and to its own earlier slots; its state is layer ``k``'s outputs at slots
``t - k .. t`` (the first from the cache), which its children read. A chain drafts what transformers' generator drafts; a tree
drafts each depth's top-k the same way, each node over its own path, in one forward of the layer per depth. The device
step keeps the same caches for every row in fixed-shape buffers (`MtpRows`), each layer run over the accepted path once a
step.

The weights are the base's: they load from the base's own checkpoint (transformers' `MtpModel.from_pretrained`, which
the base's loading skips) when the drafter is attached, and are held outside the drafter's module tree, so a saved
folder holds none of them (its heads file is empty) and loading it reads them from the base again. The
embedding, ``lm_head`` and rotary embedding are the base's own modules. There is nothing to train.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn
from transformers import Cache, DynamicCache

from ..blocks.row_cache import RowSlotCache
from ..blocks.transfer import positions_index
from ..configuration_cerberus import CerberusConfig
from ..errors import UserError
from .base import Drafter, SequenceState, capture_states, in_this_thread


def mtp_layer_count(base: nn.Module) -> int:
    """How many MTP layers ``base`` ships (its text config's ``num_mtp_layers``); refused in one line when none."""
    count = getattr(base.config.get_text_config(), "num_mtp_layers", None) or 0
    if count < 1:
        raise UserError(f"{type(base).__name__} ships no multi-token-prediction layers (its config has no "
                        "num_mtp_layers): head_type='mtp' drafts with a base's own MTP layers; pick another family.")
    return count


def load_mtp_layers(base: nn.Module, num_heads: int) -> nn.Module:
    """The base's first MTP layers as transformers loads them for ``generate(use_mtp=True)`` (`MtpModel`, read from the
    base's own checkpoint and tied to its embedding, ``lm_head`` and rotary embedding), on the device of its last layer;
    what this drafter cannot run is refused in one line."""
    from transformers.modeling_layers import MtpModel  # transformers 5.24 and later

    count = mtp_layer_count(base)
    if num_heads > count:
        raise UserError(f"num_heads={num_heads} asks for more depths than the {count} MTP layers "
                        f"{type(base).__name__} ships: set num_heads to at most {count}.")
    config = base.config.get_mtp_config()
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"]) - {"full_attention"}
    if kinds:
        raise UserError(f"{type(base).__name__}'s MTP layers are {', '.join(sorted(kinds))} layers; head_type='mtp' "
                        "runs full-attention MTP layers only.")
    if not base.config.name_or_path:
        raise UserError(f"{type(base).__name__} was not loaded from a folder or Hub id: head_type='mtp' reads the "
                        "base's MTP layers from the checkpoint it was loaded from (from_pretrained).")
    device = base.get_output_embeddings().weight.device
    try:
        layers = MtpModel.from_pretrained(base, device_map={"": device})
    except (OSError, ValueError, RuntimeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        first = first if len(first) <= 240 else first[:240] + "..."
        raise UserError(f"the MTP layers of {type(base).__name__} could not be read from its checkpoint "
                        f"({base.config.name_or_path or 'no folder'}): {first}") from error
    for module in own_modules(layers):
        module.to(base.get_output_embeddings().weight.dtype)
    return layers.eval()


def own_modules(layers: nn.Module) -> list[nn.Module]:
    """The modules an `MtpModel` holds of its own: its layers and, where it has one, its shared post-norm (its
    embedding, ``lm_head`` and rotary embedding are the base's)."""
    return [layers.layers] + ([layers.shared_post_norm] if layers.use_shared_post_norm else [])


@contextmanager
def capture_normed_states(model: nn.Module, source: str = "lm_head_input") -> Iterator[dict]:
    """`capture_states`, plus ``captured["normed"]``: the final norm's output at every position of every forward (the
    lm_head's input, which the base computes at the newest position only when it predicts one token, as after a
    prefill): what MTP layer 0 reads, as transformers' ``hidden_states[-1]``."""
    norm = getattr(model.get_decoder(), "norm", None)
    if not isinstance(norm, nn.Module):
        raise UserError(f"{type(model).__name__}: no final norm (decoder.norm) found, whose output MTP layers read.")

    with capture_states(model, source) as captured:
        @in_this_thread
        def store(module, args, output) -> None:
            captured["normed"] = output

        handle = norm.register_forward_hook(store)
        try:
            yield captured
        finally:
            handle.remove()


def own_slots(nodes: int, slots: int, device: torch.device) -> torch.Tensor:
    """``[nodes * slots, nodes * slots]``: which of the nodes' draft slots each one sees (its own node's, up to its
    own)."""
    return torch.block_diag(*[torch.ones(slots, slots, dtype=torch.bool, device=device).tril()] * nodes)


def own_slots_mask(cached: int, nodes: int, slots: int, device: torch.device) -> torch.Tensor:
    """4D mask ``[1, 1, nodes * slots, cached + nodes * slots]``: every query sees the ``cached`` keys, and the keys of
    its own node's slots up to its own."""
    own = own_slots(nodes, slots, device)
    return torch.cat([torch.ones(nodes * slots, cached, dtype=torch.bool, device=device), own], dim=1)[None, None]


class MtpState(SequenceState):
    """Each MTP layer's KV cache over one sequence's verified slots, its output at the newest of them, and the inputs
    of the slots it has not run yet (for layer 0 the base's states; for layer ``j`` layer ``j - 1``'s outputs), which
    wait for the token ``j + 1`` places after them."""

    def __init__(self, drafter: "MtpDrafter"):
        self.drafter = drafter
        self.cache: DynamicCache | None = None
        self.cached = [0] * drafter.num_heads  # verified slots each layer has cached
        self.pending: list[torch.Tensor | None] = [None] * drafter.num_heads  # [1, m, hidden] per layer
        self.newest: list[torch.Tensor | None] = [None] * drafter.num_heads  # [1, hidden]: output at its newest slot

    def observe(self, captured: dict, keep: list[int] | None) -> None:
        hidden = captured["normed"]
        if keep is None:  # the prefill: a new sequence
            count = self.drafter.num_heads
            self.cache = DynamicCache(config=self.drafter.mtp_layers.config)
            self.cached, self.pending, self.newest = [0] * count, [hidden] + [None] * (count - 1), [None] * count
            return
        if self.cache is None:
            raise RuntimeError("the decoding loop must call observe() with the prefill first.")
        self.pending[0] = torch.cat([self.pending[0], hidden[:, positions_index(keep, hidden.device)]], dim=1)

    def heads_input(self, input_ids: torch.LongTensor, hidden: torch.Tensor) -> torch.Tensor:
        if self.cache is None:
            raise RuntimeError("the decoding loop must call observe() with the prefill before drafting.")
        verified = input_ids.shape[1] - 1  # slots 0 .. t, t + 1 tokens known after slot 0
        if self.cached[0] + self.pending[0].shape[1] != verified:
            raise RuntimeError(f"the drafter holds {self.cached[0] + self.pending[0].shape[1]} verified states but the "
                               f"sequence has {verified}; observe() must follow every forward.")
        for j in range(self.drafter.num_heads):
            waiting = 0 if self.pending[j] is None else self.pending[j].shape[1]  # None: no input has reached layer j
            count = min(verified - j, self.cached[j] + waiting) - self.cached[j]
            if count <= 0:
                continue
            start = self.cached[j]
            tokens = input_ids[:, start + j + 1: start + j + 1 + count]
            out = self.drafter.run_layer(j, self.pending[j][:, :count], tokens, start + j + 1, self.cache)
            self.cached[j] += count
            self.pending[j] = self.pending[j][:, count:]
            self.newest[j] = out[:, -1]
            if j + 1 < self.drafter.num_heads:
                following = self.pending[j + 1]
                self.pending[j + 1] = out if following is None else torch.cat([following, out], dim=1)
        return self.newest[0]

    def context(self) -> "MtpState":
        return self

    def __copy__(self) -> "MtpState":
        """A state that goes on from here on its own: the same tensors, each layer's cache and the lists its own (a
        step extends them in place; calibration times one step from the same state again and again)."""
        copied = MtpState(self.drafter)
        copied.cached, copied.pending, copied.newest = list(self.cached), list(self.pending), list(self.newest)
        if self.cache is not None:
            copied.cache = self.drafter.cache_of(self.cache, self.cached)
        return copied

    @classmethod
    def at(cls, drafter: "MtpDrafter", cache: DynamicCache, outputs: list[torch.Tensor], t: int) -> "MtpState":
        """The state drafting after slot ``t`` reads, from each layer's keys and values over a whole sequence
        (``cache``) and its outputs there (``outputs[j]`` ``[n, hidden]``): layer ``j``'s slots ``0 .. t - j``."""
        state = cls(drafter)
        state.cached = [max(t - j + 1, 0) for j in range(drafter.num_heads)]
        state.newest = [outputs[j][kept - 1][None] if kept else None for j, kept in enumerate(state.cached)]
        state.cache = drafter.cache_of(cache, state.cached)
        return state


class DraftView(Cache):
    """A cache's layers as drafting reads them: each layer's update returns its keys and values over every slot followed
    by the draft's own, and writes nothing (a draft's keys never enter the cache)."""

    def __init__(self, cache: Cache):
        super().__init__(layers=cache.layers)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.layers[layer_idx]
        return torch.cat([layer.keys, key_states], dim=2), torch.cat([layer.values, value_states], dim=2)


class MtpRows:
    """Each MTP layer's keys and values over every row's verified slots, for the device step (`decoding.device_step`),
    in fixed-shape device buffers (`blocks.row_cache.RowSlotCache`, the device step's cache, one layer per MTP layer):
    every layer writes a step's new columns right after the row's own (``length``; the column of verified state ``s``
    holds layer ``j``'s slot ``s - j``), ``visible[j]`` shows layer ``j`` its slots (not the left padding, nor the
    columns of the first ``j`` states, which are no slot of layer ``j``), ``seen`` counts the row's verified states and
    ``newest[j]`` is layer ``j``'s output at its newest slot. What `MtpState` keeps for one sequence, kept for a
    batch."""

    def __init__(self, drafter: MtpDrafter, batch: int, room: int, device: torch.device):
        count = drafter.num_heads
        self.drafter = drafter
        self.cache = RowSlotCache(count, room)
        self.view = DraftView(self.cache)
        self.visible = torch.zeros(count, batch, room, dtype=torch.bool, device=device)
        self.length = torch.zeros(batch, dtype=torch.long, device=device)
        self.seen = torch.zeros_like(self.length)
        self.newest = torch.zeros(count, batch, drafter.hidden_size, dtype=drafter.dtype, device=device)
        self.slot_range = torch.arange(room, device=device)

    def start(self, states: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> None:
        """Every layer over a prefill's states ``[B, W, hidden]`` followed by ``tokens`` ``[B, W]`` (``valid``: not
        left padding)."""
        for buffer in (self.visible, self.length, self.seen, self.newest):
            buffer.zero_()
        self._extend(states, tokens, valid, valid.shape[1])

    def extend(self, states: torch.Tensor, tokens: torch.Tensor, count: torch.Tensor) -> None:
        """Every layer over each row's first ``count`` of ``states`` ``[B, n, hidden]`` (the accepted path), with the
        ``tokens`` after them."""
        self._extend(states, tokens, torch.arange(tokens.shape[1], device=count.device)[None] < count[:, None], count)

    def _extend(self, states: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor, advance) -> None:
        """Column ``w`` (verified state ``s``, followed by ``tokens[:, w]``) is slot ``s - j`` of layer ``j``, which
        reads that token at rotary position ``s + 1`` and layer ``j - 1``'s output a column earlier (before the first,
        its newest); a slot below 0 does not exist."""
        index = self.seen[:, None] + valid.long().cumsum(-1) - 1  # [B, n]: each valid column's verified state
        positions = (index + 1).clamp(min=0)
        slots = self.length[:, None] + torch.arange(tokens.shape[1], device=tokens.device)[None]
        self.cache.slots = slots
        earlier = self.slot_range[None, None, :] <= slots[:, :, None]  # [B, n, room]
        itself = self.slot_range[None, None, :] == slots[:, :, None]
        for j in range(self.drafter.num_heads):
            kept = valid & (index >= j)
            self.visible[j].scatter_(1, slots, kept)
            out = self.drafter.apply_layer(j, states, tokens, positions, self.cache,
                                           ((self.visible[j][:, None, :] & earlier) | itself)[:, None])
            states = torch.cat([self.newest[j][:, None], out[:, :-1]], dim=1)  # the next layer's inputs
            last = (kept.long().cumsum(-1) * kept).argmax(dim=-1)  # each row's newest kept column
            newest = out.gather(1, last[:, None, None].expand(-1, 1, out.shape[-1]))[:, 0]
            self.newest[j].copy_(torch.where(kept.any(dim=-1)[:, None], newest, self.newest[j]))
        self.length.add_(advance)
        self.seen.add_(valid.long().sum(dim=-1))

    def read(self, hidden: torch.Tensor) -> torch.Tensor:
        """What depth 0 reads (``[B, hidden]``): layer 0's output at the newest verified slot."""
        return self.newest[0]

    def context(self) -> MtpRows:
        """What deeper depths attend to: every row's layers (`MtpDrafter.draft_level`)."""
        return self


class MtpDrafter(Drafter):
    """Drafts with the base's own MTP layers (see the module docstring); holds no weights of its own."""

    drafter_type = "mtp"
    reads_tokens = True
    trains_on_sequences = True  # its state at a position depends on the positions before it (each layer's cache)
    needs_base_layers = True  # the base's MTP layers

    def __init__(self, config: CerberusConfig):
        super().__init__(config)
        self._dtype = torch.float32  # until attached: then the MTP layers'

    def build_blocks(self, config: CerberusConfig) -> nn.ModuleList:
        return nn.ModuleList()  # the base's MTP layers serve every depth

    def build_projections(self, config: CerberusConfig) -> nn.ModuleList | None:
        if config.head_projection != "shared":
            raise ValueError("MTP layers project through the base's own lm_head: head_projection must be 'shared'.")
        return None

    @classmethod
    def config_defaults(cls, base: nn.Module) -> dict:
        """One depth per MTP layer the base ships (refused in one line where it ships none)."""
        return {"num_heads": mtp_layer_count(base)}

    def attach(self, base: nn.Module) -> None:
        """Read the base's MTP layers from its checkpoint (`load_mtp_layers`), kept outside this module's tree so that
        they are never saved with it; the base's embedding, ``lm_head`` and rotary embedding are shared."""
        self.__dict__["mtp_layers"] = load_mtp_layers(base, self.num_heads)
        self._dtype = base.get_output_embeddings().weight.dtype
        super().attach(base)

    def _apply(self, fn, recurse: bool = True):
        """Moves and casts of the drafter apply to the MTP layers it drafts with too (not to the base's modules they
        share, which the base's own moves reach)."""
        layers = self.__dict__.get("mtp_layers")
        if layers is not None:
            for module in own_modules(layers):
                module._apply(fn)
            self._dtype = next(layers.layers.parameters()).dtype
        return super()._apply(fn, recurse)

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def capture(self, model: nn.Module):
        return capture_normed_states(model, self.state_source)

    def start(self, model: nn.Module, cache) -> MtpState:
        return MtpState(self)

    def device_rows(self, batch: int, room: int, device: torch.device) -> MtpRows:
        return MtpRows(self, batch, room, device)

    def cache_of(self, cache: DynamicCache, lengths: list[int]) -> DynamicCache:
        """A cache of its own holding the first ``lengths[j]`` slots of each layer ``j`` of ``cache``."""
        kept = DynamicCache(config=self.mtp_layers.config)
        for j, length in enumerate(lengths):
            if length:
                layer = cache.layers[j]
                kept.update(layer.keys[:, :, :length], layer.values[:, :, :length], j)
        return kept

    def run_layer(self, j: int, states: torch.Tensor, tokens: torch.LongTensor, position: int, cache: DynamicCache,
                  nodes: int = 0) -> torch.Tensor:
        """MTP layer ``j``'s outputs ``[1, n * m, hidden]`` over ``states`` and ``tokens`` ``[1, n * m, ...]``: with
        ``nodes`` 0, ``m`` new verified slots (from rotary ``position`` on), which stay in the layer's cache; else
        ``nodes`` runs of ``m`` draft slots each (every run from ``position`` on), each attending to the cache and
        causally to itself, whose keys leave the cache again."""
        runs = max(nodes, 1)
        slots = tokens.shape[1] // runs
        cached = cache.layers[j].get_seq_length()
        positions = (position + torch.arange(slots, device=tokens.device)).repeat(runs)[None]
        out = self.apply_layer(j, states, tokens, positions, cache, own_slots_mask(cached, runs, slots, tokens.device))
        if nodes:
            cache.layers[j].crop(-nodes * slots)
        return out

    def apply_layer(self, j: int, states: torch.Tensor, tokens: torch.LongTensor, positions: torch.Tensor,
                    cache: Cache, seen: torch.Tensor) -> torch.Tensor:
        """MTP layer ``j``'s outputs ``[B, n, hidden]`` over ``states`` ``[B, n, hidden]`` and ``tokens`` ``[B, n]`` at
        rotary ``positions`` ``[B or 1, n]``, through ``cache`` (which its attention updates and reads), each query
        attending to the keys ``seen`` (``[B or 1, 1, n, keys]``, True where seen)."""
        layers = self.mtp_layers
        embeds = layers.embed_tokens(tokens).to(self.dtype)
        rotary = {}
        if layers.has_per_layer_rope:
            rotary["layer_type"] = layers.config.layer_types[j]
        position_embeddings = layers.rotary_emb(embeds, position_ids=positions, **rotary) \
            if layers.rotary_emb is not None else None
        mask = torch.zeros(seen.shape, dtype=self.dtype, device=seen.device).masked_fill_(
            ~seen, torch.finfo(self.dtype).min)
        out = layers.layers[j](embeds, states.to(self.dtype), position_embeddings=position_embeddings,
                               attention_mask=mask, position_ids=positions, cache=cache)
        return layers.shared_post_norm(out) if layers.use_shared_post_norm else out

    def draft_level(self, k: int, hidden: torch.Tensor, tokens: torch.LongTensor, previous: torch.Tensor | None,
                    context: MtpState | MtpRows | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Depth 0: ``hidden`` is layer 0's output at the newest verified slot ``t`` (`MtpState.heads_input`). Depth
        ``k >= 1``: layer ``k`` over each node's draft slots (the slots of its parent's state ``previous``, layer
        ``k - 1``'s outputs ``[n, m, hidden]``) with the last ``m`` tokens of its path, attending to the layer's cache
        (``context``; every row's in the device step, `MtpRows`, whose nodes come row by row). A node's state is layer
        ``k``'s outputs at its slots, after the newest cached one."""
        if k == 0:
            state = hidden[:, None]
            return state, self.project(hidden, k)
        if context is None:
            raise RuntimeError("MTP layers draft after the sequence's state (MtpState): decoding passes it as context.")
        if isinstance(context, MtpRows):
            out, newest = self._draft_on_rows(k, previous, tokens, context), context.newest[k]
            newest = newest.repeat_interleave(out.shape[0] // newest.shape[0], dim=0)
        else:
            count, slots = previous.shape[:2]
            verified = context.cached[k]  # layer k's slots 0 .. verified - 1 are cached; its draft slots follow
            out = self.run_layer(k, previous.reshape(1, count * slots, -1), tokens[:, -slots:].reshape(1, -1),
                                 verified + k + 1, context.cache, count).reshape(count, slots, -1)
            newest = context.newest[k]
        state = out if newest is None else torch.cat([newest.expand(out.shape[0], -1)[:, None].to(out.dtype), out], 1)
        return state, self.project(out[:, -1], k)

    def _draft_on_rows(self, k: int, previous: torch.Tensor, tokens: torch.LongTensor, rows: MtpRows) -> torch.Tensor:
        """Layer ``k``'s outputs ``[n, k, hidden]`` at each node's draft slots ``t - k + 1 .. t`` in the device step:
        always ``k`` of them (``previous`` ``[n, k, hidden]``, zeros before the newest cached output of a layer that has
        none), those below slot 0 hidden from the others, as the loop's drafting leaves them out."""
        batch = rows.seen.shape[0]
        per = previous.shape[0] // batch  # nodes of each row
        device = tokens.device
        offsets = torch.arange(k, device=device).repeat(per)[None]  # [1, per * k]: each slot's place in its node's run
        exists = rows.seen[:, None] - k + offsets >= 0  # slot t - k + 1 + m, with t + 1 = seen
        itself = torch.eye(per * k, dtype=torch.bool, device=device)
        own = own_slots(per, k, device)[None] & (exists[:, None, :] | itself)
        seen = torch.cat([rows.visible[k][:, None, :].expand(-1, per * k, -1), own], dim=-1)[:, None]
        out = self.apply_layer(k, previous.reshape(batch, per * k, -1), tokens[:, -k:].reshape(batch, per * k),
                               rows.seen[:, None] + 1 + offsets, rows.view, seen)
        return out.reshape(batch * per, k, -1)

    def teacher_forced(self, captured: dict, ids: torch.LongTensor, first: int):
        """`Drafter.teacher_forced`: every layer over the whole sequence with the true tokens (layer ``j``'s slot ``t``
        reads the token at ``t + j + 1``), which is what drafting after ``t`` computes on the true path; drafting after
        ``t`` attends to each layer's keys over its verified slots ``0 .. t - j`` (`MtpState.at`)."""
        count = ids.shape[1]
        tokens = torch.cat([ids, ids[:, -1:].expand(1, self.num_heads + 1)], dim=1)  # past the end: never a target
        cache, states, outputs = DynamicCache(config=self.mtp_layers.config), captured["normed"], []
        for j in range(self.num_heads):
            states = self.run_layer(j, states, tokens[:, j + 1: j + 1 + count], j + 1, cache)
            outputs.append(states[0])
        logits = torch.stack([self.project(out, j) for j, out in enumerate(outputs)], dim=1)
        return outputs[0], logits, lambda t: MtpState.at(self, cache, outputs, t)

    def forced_states(self, hidden: torch.Tensor, tokens: torch.LongTensor) -> torch.Tensor:
        raise NotImplementedError("MTP layers are the base's own and trained with it: there is nothing to train here.")
