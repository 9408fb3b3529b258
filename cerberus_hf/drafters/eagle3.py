"""An EAGLE-3-class drafter (Li et al., 2025): fused multi-layer states, one decoder layer, training-time test.

What it reads. The base's states entering a low, a middle and a high decoder layer (``feature_layers``: EAGLE-3's
``hidden_states`` indices ``2``, ``L // 2`` and ``L - 3`` by default), concatenated and fused by one linear map
``fc`` (``3 d -> d``, no bias) into ``g_t``. The last state alone (what every other family reads) says what the
base is about to write; the lower layers still hold what the context was, which helps the drafter look further.

How it drafts. One decoder layer, autoregressive over its own outputs:

* its input at sequence position ``p`` is ``[norm(e(x_{p+1})); norm(s_p)]`` (width ``2 d``), where ``e`` is the base's
  input embedding of the token that followed ``p`` and ``s_p`` is ``g_p`` at a verified position or the layer's own
  previous output on a draft path; its attention (rotary positions, grouped-query, ``adapter_heads`` heads of
  ``adapter_head_dim``, ``adapter_kv_heads`` key/value heads) reads that input, then a residual onto ``s_p`` and a
  SwiGLU MLP; the output ``o_p`` is normed and projected through the frozen base ``lm_head`` (over the draft
  vocabulary where one is set) to guess ``x_{p+2}``;
* its KV cache covers every verified position (`Eagle3State`): after each verification the kept positions'
  fused states wait until the token after them is known, and the next drafting step runs the layer over them once,
  which extends the cache and gives ``o_t`` at the newest verified position: depth 0's guess;
* depth ``k >= 1`` runs the layer at position ``t + k`` on ``[e(guess of depth k - 1); o]`` of its parent node; it
  attends to the cache, its ancestors on the tree path and itself. A node's keys and values travel in its
  drafting state (``[n, k + 1, d + 2 * kv width]``: each path node's output, keys and values), so drafting writes
  nothing into the cache and acceptance or rollback need no undo: the cache only ever grows by verified positions.

How it trains (`training.sequence_trainer`): "training-time test". The layer runs over whole sequences with the true
fused states (step 0), then ``num_heads - 1`` more times, each time on its own previous outputs shifted one position
on, with the true tokens; step ``j`` at row ``i`` sits at position ``i + j`` and attends to step 0's keys up to ``i``
and to row ``i``'s own keys of steps ``1 .. j``: exactly what drafting depth ``j`` after a verified position ``i``
reads. `unrolled_outputs` computes that; the loss is cross-entropy (optionally against the base's own top-k
distribution) at every step.

Where this differs from EAGLE-3's public code: the projection is the frozen base ``lm_head`` restricted to the draft
vocabulary (EAGLE-3 trains its own head over a reduced vocabulary; an export copies those rows; a drafter trained by
EAGLE's code or by speculators loads with its own, ``head_projection="own"``, see `importing`), and a fresh drafter
is not the identity (its layer starts from a fixed seed), so untrained drafts are wrong, as verification allows.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from ..configuration_cerberus import CerberusConfig
from ..blocks.transfer import positions_index
from ..errors import UserError
from .base import Drafter, SequenceState, capture_states, decoder_layers, in_this_thread
from .layers import GatedMLP, init_from_fixed_seed, llama_mlp_width, rotary, rotate


def default_feature_layers(num_layers: int) -> list[int]:
    """EAGLE-3's choice of ``hidden_states`` indices for a base of ``num_layers`` decoder layers: the states entering
    layers 2, ``L // 2`` and ``L - 3``, each kept between 1 and ``L - 1`` (a two-layer test base reads layer 1 thrice)."""
    return [min(max(i, 1), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3)]


def check_feature_layers(feature_layers: list[int], count: int) -> None:
    """Refuse layers a base of ``count`` decoder layers cannot give: each state read enters layer 1 to ``count - 1``."""
    if not 1 <= min(feature_layers) <= max(feature_layers) < count:
        raise UserError(f"feature_layers must lie between 1 and {count - 1} for this base ({count} layers), got "
                        f"{feature_layers}.")


@contextmanager
def capture_features(model: nn.Module, feature_layers: list[int], source: str = "lm_head_input") -> Iterator[dict]:
    """`capture_states`, plus ``captured["features"]``: the states entering each of ``feature_layers``, concatenated
    (``[batch, positions, len(feature_layers) * hidden]``), on every forward that runs those layers."""
    _, _, layers = decoder_layers(model)
    check_feature_layers(feature_layers, len(layers))
    outputs: dict[int, torch.Tensor] = {}

    def hook_for(index: int):
        @in_this_thread
        def hook(module, args, output):
            outputs[index] = output[0] if isinstance(output, tuple) else output
            if index == last:
                captured["features"] = torch.cat([outputs[i] for i in feature_layers], dim=-1)
        return hook

    last = max(feature_layers)
    with capture_states(model, source) as captured:
        handles = [layers[i - 1].register_forward_hook(hook_for(i)) for i in sorted(set(feature_layers))]
        try:
            yield captured
        finally:
            for handle in handles:
                handle.remove()


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None = None,
           own_keys: torch.Tensor | None = None, own_values: torch.Tensor | None = None) -> torch.Tensor:
    """Attention ``[B, H, N, D]`` of queries ``q`` ``[B, H, N, D]`` over keys shared by every query (``keys``, ``values``
    ``[B, KVH, T, D]``, grouped-query: ``H`` a multiple of ``KVH``; ``mask`` ``[N, T]`` bool, True where a query may look)
    and, per query, keys of its own (``own_keys``, ``own_values`` ``[B, KVH, N, S, D]``: a draft node's ancestors and
    itself, or a training row's earlier unrolled steps). Decoding and training both go through here, so what
    training fits is what drafting computes."""
    batch, heads, count, dim = q.shape
    kv_heads = keys.shape[1]
    grouped = q.reshape(batch, kv_heads, heads // kv_heads, count, dim) / math.sqrt(dim)
    scores = [torch.einsum("bkgnd,bktd->bkgnt", grouped, keys)]
    if mask is not None:
        scores[0] = scores[0].masked_fill(~mask, float("-inf"))
    if own_keys is not None:
        scores.append(torch.einsum("bkgnd,bknsd->bkgns", grouped, own_keys))
    probs = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(q.dtype)
    shared = keys.shape[2]
    out = torch.einsum("bkgnt,bktd->bkgnd", probs[..., :shared], values)
    if own_keys is not None:
        out = out + torch.einsum("bkgns,bknsd->bkgnd", probs[..., shared:], own_values)
    return out.reshape(batch, heads, count, dim)


class FeatureLayer(nn.Module):
    """EAGLE-3's decoder layer: attention over ``[norm(embedding); norm(state)]`` (``2 d`` wide), a residual onto the
    state, then a SwiGLU MLP with its own norm and residual. Split in two (`keys_values_queries`, `finish`) so that
    the attention between them may read keys from a cache, from draft paths or from unrolled training steps."""

    def __init__(self, hidden_size: int, num_heads: int, kv_heads: int, head_dim: int, eps: float = 1e-6,
                 width: int | None = None, rope_theta: float = 10000.0, norm_before_residual: bool = False):
        super().__init__()
        if head_dim % 2:
            raise UserError(f"adapter_head_dim must be even (rotary embeddings), got {head_dim}.")
        self.num_heads, self.kv_heads, self.head_dim = num_heads, kv_heads, head_dim
        self.rope_theta, self.norm_before_residual = rope_theta, norm_before_residual
        self.embed_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.hidden_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.q_proj = nn.Linear(2 * hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(2 * hidden_size, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden_size, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.post_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.mlp = GatedMLP(hidden_size, width or llama_mlp_width(hidden_size))
        init_from_fixed_seed(self.q_proj, self.k_proj, self.v_proj, self.o_proj)

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def _heads(self, x: torch.Tensor, count: int) -> torch.Tensor:
        return x.view(*x.shape[:-1], count, self.head_dim).transpose(-3, -2)  # [B, heads, N, D]

    def keys_values_queries(self, embeds: torch.Tensor, states: torch.Tensor, positions: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(keys, values ``[B, KVH, N, D]``, queries ``[B, H, N, D]``) for inputs ``[B, N, hidden]`` at ``positions``
        ``[N]`` (or ``[B, N]``: each row's own)."""
        x = torch.cat([self.embed_norm(embeds), self.hidden_norm(states)], dim=-1)
        rotation = rotary(positions, self.head_dim, x.dtype, self.rope_theta)
        if positions.dim() == 2:  # [B, N, D] -> [B, 1, N, D]: the same rotation for every head
            rotation = tuple(part[:, None] for part in rotation)
        keys = rotate(self._heads(self.k_proj(x), self.kv_heads), rotation)
        values = self._heads(self.v_proj(x), self.kv_heads)
        queries = rotate(self._heads(self.q_proj(x), self.num_heads), rotation)
        return keys, values, queries

    def finish(self, states: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The layer's output ``[B, N, hidden]`` from its input states and the attention's output ``[B, H, N, D]``: the
        residual adds the raw states, or with ``norm_before_residual`` the normed ones."""
        residual = self.hidden_norm(states) if self.norm_before_residual else states
        mixed = residual + self.o_proj(attended.transpose(-3, -2).reshape(*states.shape[:-1], -1))
        return mixed + self.mlp(self.post_norm(mixed))


class PendingFeaturesState(SequenceState):
    """What the sequence states of drafters fed by the base's fused layers (EAGLE-3, DFlash) share: a cache over the
    verified positions (``cached`` of them; `forget` drops it), and the fused states of the newest verified positions
    (``pending``), which wait for the next drafting step to enter it."""

    pending: torch.Tensor | None  # [1, k, features]: verified, not in the cache yet

    @property
    def cached(self) -> int:
        raise NotImplementedError

    def forget(self) -> None:
        """Drop the cache: a new sequence begins."""
        raise NotImplementedError

    def observe(self, captured: dict, keep: list[int] | None) -> None:
        features = captured["features"]
        if keep is None:  # the prefill: a new sequence
            self.forget()
            self.pending = features
            return
        if self.pending is None:
            raise RuntimeError("the decoding loop must call observe() with the prefill first.")
        self.pending = torch.cat([self.pending, features[:, positions_index(keep, features.device)]], dim=1)

    def pending_positions(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """The positions ``[k]`` of the pending states, once they are known to be the sequence's verified ones."""
        if self.pending is None:
            raise RuntimeError("the decoding loop must call observe() with the prefill before drafting.")
        count = self.pending.shape[1]
        if self.cached + count != input_ids.shape[1] - 1:
            raise RuntimeError(f"the drafter holds {self.cached + count} verified states but the sequence has "
                               f"{input_ids.shape[1] - 1}; observe() must follow every forward.")
        return torch.arange(self.cached, self.cached + count, device=input_ids.device)


class Eagle3State(PendingFeaturesState):
    """The decoder layer's KV cache over one sequence's verified positions, and the fused states of the newest ones,
    which wait for the token after them (known once the next step starts)."""

    def __init__(self, drafter: "Eagle3Drafter"):
        self.drafter = drafter
        self.keys: torch.Tensor | None = None  # [1, KVH, T, D]
        self.values: torch.Tensor | None = None
        self.pending: torch.Tensor | None = None  # [1, k, features]: verified, not in the cache yet
        self.newest: torch.Tensor | None = None  # [1, hidden]: the layer's output at the newest cached position

    @property
    def cached(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def forget(self) -> None:
        self.keys = self.values = self.newest = None

    def heads_input(self, input_ids: torch.LongTensor, hidden: torch.Tensor) -> torch.Tensor:
        positions = self.pending_positions(input_ids)
        if positions.numel():  # the tokens after the pending states, the sequence's newest, are known now
            outputs, self.keys, self.values = self.drafter.extend(self.pending, input_ids[:, -positions.numel():],
                                                                  positions, self.keys, self.values)
            self.newest, self.pending = outputs[:, -1], self.pending[:, :0]
        return self.newest

    def context(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys, self.values


class Eagle3Rows:
    """The decoder layer's KV cache over every row's verified positions, for the device step (`decoding.device_step`),
    in fixed-shape device buffers: a row writes its new positions right after its own (``length``), ``visible`` hides
    its left padding and what lies past it, ``position`` counts its verified positions (rotary); ``newest`` is the
    layer's output at the newest, depth 0's input. What `Eagle3State` keeps for one sequence, kept for a batch."""

    def __init__(self, drafter: "Eagle3Drafter", batch: int, room: int, device: torch.device):
        layer = drafter.layer
        self.drafter = drafter
        self.keys = torch.zeros(batch, layer.kv_heads, room, layer.head_dim, dtype=drafter.dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        self.visible = torch.zeros(batch, room, dtype=torch.bool, device=device)
        self.length = torch.zeros(batch, dtype=torch.long, device=device)
        self.position = torch.zeros_like(self.length)
        self.newest = torch.zeros(batch, drafter.hidden_size, dtype=drafter.dtype, device=device)
        self.slot_range = torch.arange(room, device=device)

    def start(self, features: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> None:
        """The cache over a prefill's fused states ``[B, W, F]`` followed by ``tokens`` ``[B, W]`` (``valid``: not left
        padding)."""
        self.visible.zero_()
        self.length.zero_()
        self.position.zero_()
        self._extend(features, tokens, valid, valid.shape[1])

    def extend(self, features: torch.Tensor, tokens: torch.Tensor, count: torch.Tensor) -> None:
        """Each row's first ``count`` of ``features`` ``[B, n, F]`` (the accepted path), with the ``tokens`` after
        them."""
        self._extend(features, tokens, torch.arange(tokens.shape[1], device=count.device)[None] < count[:, None], count)

    def _extend(self, features: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor, advance) -> None:
        drafter, layer = self.drafter, self.drafter.layer
        states = drafter.fc(features.to(drafter.dtype))
        positions = self.position[:, None] + (valid.long().cumsum(-1) - 1).clamp(min=0)
        keys, values, queries = layer.keys_values_queries(drafter.embed(tokens), states, positions)
        slots = self.length[:, None] + torch.arange(tokens.shape[1], device=tokens.device)[None]  # [B, n]
        index = slots[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[-1])
        self.keys.scatter_(2, index, keys)
        self.values.scatter_(2, index, values)
        self.visible.scatter_(1, slots, valid)
        earlier = self.slot_range[None, None, :] <= slots[:, :, None]  # [B, n, room]
        sees = (self.visible[:, None, :] & earlier) | (self.slot_range[None, None, :] == slots[:, :, None])
        out = layer.finish(states, attend(queries, self.keys, self.values, sees[:, None, None]))
        last = (valid.long().cumsum(-1) * valid).argmax(dim=-1)  # each row's newest valid position
        newest = out.gather(1, last[:, None, None].expand(-1, 1, out.shape[-1]))[:, 0]
        self.newest.copy_(torch.where(valid.any(dim=-1)[:, None], newest, self.newest))
        self.length.add_(advance)
        self.position.add_(valid.long().sum(dim=-1))

    def read(self, hidden: torch.Tensor) -> torch.Tensor:
        """What depth 0 reads (``[B, hidden]``), the base's newest states being ``hidden``: the layer's output at the
        newest verified position."""
        return self.newest

    def context(self) -> "Eagle3Rows":
        """What deeper depths attend to: every row's cache (`Eagle3Drafter.draft_level`)."""
        return self


def _draft_context(context, previous: torch.Tensor, layer: FeatureLayer):
    """(keys, values ``[rows, KVH, T, D]``, which keys each row sees (``[rows, T]``; None: all), how many verified
    positions each row has cached (an int, or ``[rows]``)) of what drafting attends to."""
    if isinstance(context, Eagle3Rows):
        return context.keys, context.values, context.visible, context.position
    keys, values = context if context is not None else (None, None)
    if keys is None:  # no verified position cached: the path alone (a draft from ``hidden`` with no history)
        keys = values = previous.new_zeros(1, layer.kv_heads, 0, layer.head_dim)
    return keys, values, None, keys.shape[2]


class FeatureLayersDrafter(Drafter):
    """What a drafter fed by several of the base's layers (EAGLE-3, DFlash) shares: the layers, chosen for the base's
    depth where the config names none and checked on attaching; their states captured during verification and gathered
    for the device step; its state over the sequence (``state_class``) and its fixed-shape rows (``rows_class``)."""

    state_class: type[SequenceState]
    rows_class: type

    def unrolled_outputs(self, features: torch.Tensor, tokens: torch.LongTensor, steps: int) -> list[torch.Tensor]:
        """The normed outputs ``[B, L, hidden]`` of depths ``0 .. steps - 1`` after every position of whole sequences,
        what training fits: fused-layer inputs ``features`` ``[B, L, F]`` and ``tokens`` ``[B, >= L + steps]``
        (``tokens[:, p + 1]`` follows position ``p``; right padding is harmless). Depth ``j``'s row ``i`` is drafting
        depth ``j`` after verified position ``i`` on the true path: it guesses the token at ``i + j + 2``."""
        raise NotImplementedError

    def unrolled_at(self, features: torch.Tensor, tokens: torch.LongTensor,
                    picks: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """`unrolled_outputs` of depth ``j`` at the (rows, columns) ``picks[j]`` only (``[n_j, hidden]``): the positions a
        training batch scores. Every position's, then picked, unless a family can compute fewer."""
        return [out[rows, cols] for out, (rows, cols) in zip(self.unrolled_outputs(features, tokens, len(picks)), picks)]

    def default_layers(self, count: int) -> list[int]:
        """The layers read on a base of ``count`` decoder layers where the config names none."""
        raise NotImplementedError

    def check_layers(self) -> None:
        """What else the chosen layers must fit (the fusing layer's width); checked on attaching."""

    def attach(self, base: nn.Module) -> None:
        count = len(decoder_layers(base)[2])
        if self.feature_layers is None:
            self.feature_layers = self.default_layers(count)
        check_feature_layers(self.feature_layers, count)  # on attaching, before any forward runs
        self.check_layers()
        super().attach(base)

    def capture(self, model: nn.Module):
        return capture_features(model, self.feature_layers, self.state_source)

    def start(self, model: nn.Module, cache) -> SequenceState:
        return self.state_class(self)

    def device_rows(self, batch: int, room: int, device: torch.device):
        return self.rows_class(self, batch, room, device)

    def device_states(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The fused layers' states (`capture_features`): ``hidden_states[i]`` is the state entering layer ``i``."""
        return torch.cat([hidden_states[i] for i in self.feature_layers], dim=-1)


class Eagle3Drafter(FeatureLayersDrafter):
    """Drafts with one decoder layer over the base's fused low, middle and high states (see the module docstring)."""

    drafter_type = "eagle3"
    reads_tokens = True
    trains_on_sequences = True

    def __init__(self, config: CerberusConfig):
        super().__init__(config)
        # a config made without a base leaves them to `attach` (EAGLE-3's three, chosen for the base's depth)
        self.feature_layers = list(config.feature_layers) if config.feature_layers else None
        hidden = config.hidden_size
        count = len(self.feature_layers) if self.feature_layers else 3  # EAGLE-3's low, middle and high layer
        self.fc = nn.Linear(count * hidden, hidden, bias=False)
        init_from_fixed_seed(self.fc)
        eps = config.rms_norm_eps or 1e-6
        self.layer = FeatureLayer(hidden, config.adapter_heads, config.adapter_kv_heads or config.adapter_heads,
                                  config.adapter_head_dim, eps, config.intermediate_size, config.rope_theta or 10000.0,
                                  config.norm_before_residual)
        self.norm = nn.RMSNorm(hidden, eps=eps)

    @classmethod
    def config_defaults(cls, base: nn.Module) -> dict:
        """EAGLE-3's layers (`default_feature_layers`) and the base's own attention shape for the decoder layer."""
        text = base.config.get_text_config()
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        return {"feature_layers": default_feature_layers(text.num_hidden_layers), "adapter_heads": heads,
                "adapter_head_dim": head_dim + head_dim % 2,
                "adapter_kv_heads": getattr(text, "num_key_value_heads", None) or heads}

    def build_blocks(self, config: CerberusConfig) -> nn.ModuleList:
        return nn.ModuleList()  # no per-depth heads: one layer serves every depth

    def build_projections(self, config: CerberusConfig) -> nn.ModuleList | None:
        """EAGLE-3's own ``lm_head`` (``head_projection="own"``: a drafter trained elsewhere, `importing`): one for
        every depth, over the draft vocabulary when one is set (row ``i`` for token ``draft_vocab[i]``)."""
        if config.head_projection != "own":
            return None
        return nn.ModuleList([nn.Linear(config.hidden_size, config.draft_vocab_size or config.vocab_size, bias=False)])

    def projection(self, k: int) -> nn.Module:
        return super().projection(0)  # one projection serves every depth

    def project(self, states: torch.Tensor, k: int) -> torch.Tensor:
        """`Drafter.project`; an own ``lm_head`` over the draft vocabulary holds only its rows, in its order."""
        if self.lm_heads is not None and self.lm_heads[0].out_features != self.vocab_size:
            return self.lm_heads[0](states)
        return super().project(states, k)

    def init_projections_from(self, lm_head_weight: torch.Tensor) -> None:
        """An own ``lm_head`` over the whole vocabulary starts as the base's; over a draft vocabulary it waits for its
        weights (a drafter with one is loaded, never trained here)."""
        if self.lm_heads is not None and self.lm_heads[0].weight.shape == lm_head_weight.shape:
            super().init_projections_from(lm_head_weight)

    state_class, rows_class = Eagle3State, Eagle3Rows

    def default_layers(self, count: int) -> list[int]:
        return default_feature_layers(count)

    # ------------------------------------------------------------------------------ the layer over verified positions
    def extend(self, features: torch.Tensor, next_tokens: torch.LongTensor, positions: torch.Tensor,
               keys: torch.Tensor | None, values: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(outputs ``[1, n, hidden]``, the cache's keys and values with these positions) for the fused-state inputs
        ``features`` ``[1, n, F]`` of ``n`` new verified positions, the token after each (``[1, n]``) and their
        ``positions``, after the cached ``keys`` and ``values`` (causal)."""
        states = self.fc(features.to(self.dtype))
        new_keys, new_values, queries = self.layer.keys_values_queries(self.embed(next_tokens), states, positions)
        if keys is not None:
            new_keys, new_values = torch.cat([keys, new_keys], dim=2), torch.cat([values, new_values], dim=2)
        count, total = states.shape[1], new_keys.shape[2]
        mask = torch.ones(count, total, dtype=torch.bool, device=states.device).tril(total - count)
        return self.layer.finish(states, attend(queries, new_keys, new_values, mask)), new_keys, new_values

    # ------------------------------------------------------------------------------ drafting, depth by depth
    def draft_level(self, k: int, hidden: torch.Tensor, tokens: torch.LongTensor, previous: torch.Tensor | None,
                    context: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Depth 0: ``hidden`` is the layer's output at the newest verified position (`Eagle3State.heads_input`).
        Depth ``k >= 1``: the layer at position ``t + k`` over each parent's output and guess, attending to
        ``context`` (the cache's keys and values; None: nothing cached, the path alone; or every row's cache in the
        device step, `Eagle3Rows`, whose nodes come row by row) and the path. A node's state holds every path node's
        output, keys and values (``[n, k + 1, hidden + 2 * kv width]``; depth 0's keys and values are in the cache, zero
        here)."""
        width = self.layer.kv_width
        if k == 0:
            state = torch.cat([hidden, hidden.new_zeros(hidden.shape[0], 2 * width)], dim=-1)[:, None]
            return state, self.project(self.readout(k, state), k)
        keys, values, visible, cached = _draft_context(context, previous, self.layer)
        size, count, rows = self.hidden_size, previous.shape[0], keys.shape[0]
        per = count // rows  # nodes of each row (a sequence's nodes: one row)
        if isinstance(cached, int):
            positions = torch.full((rows, per), max(cached - 1, 0) + k, device=previous.device)
        else:
            positions = ((cached - 1).clamp(min=0) + k)[:, None].expand(rows, per)
        states = previous[:, -1, :size].reshape(rows, per, size)
        new_keys, new_values, queries = self.layer.keys_values_queries(
            self.embed(tokens[:, -1]).reshape(rows, per, size), states, positions)
        heads, dim = self.layer.kv_heads, self.layer.head_dim

        def path(part: torch.Tensor, new: torch.Tensor) -> torch.Tensor:  # [rows, KVH, per, k, D]: ancestors, itself
            earlier = part[:, 1:].reshape(rows, per, k - 1, heads, dim).permute(0, 3, 1, 2, 4)
            return torch.cat([earlier, new[:, :, :, None]], dim=3)

        own_keys = path(previous[..., size : size + width], new_keys)
        own_values = path(previous[..., size + width :], new_values)
        mask = None if visible is None else visible[:, None, None, None, :]
        out = self.layer.finish(states, attend(queries, keys, values, mask, own_keys, own_values)).reshape(count, size)

        def flat(x: torch.Tensor) -> torch.Tensor:  # [rows, KVH, per, D] -> [count, KVH * D]
            return x.permute(0, 2, 1, 3).reshape(count, width)

        state = torch.cat([previous, torch.cat([out, flat(new_keys), flat(new_values)], dim=-1)[:, None]], dim=1)
        return state, self.project(self.readout(k, state), k)

    def readout(self, k: int, state: torch.Tensor) -> torch.Tensor:
        return self.norm(state[:, -1, : self.hidden_size])

    # ------------------------------------------------------------------------------ training-time test
    def unrolled_outputs(self, features: torch.Tensor, tokens: torch.LongTensor, steps: int) -> list[torch.Tensor]:
        """`FeatureLayersDrafter.unrolled_outputs`: ``steps`` drafting steps unrolled over whole sequences (`unrolled`)."""
        return [self.norm(out) for out in self.unrolled(features, tokens, steps)[0]]

    def unrolled(self, features: torch.Tensor, tokens: torch.LongTensor, steps: int
                 ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """(the layer's outputs ``[B, L, hidden]`` at each of ``steps`` unrolled drafting steps, step 0's keys and values
        ``[B, KVH, L, D]``) over whole sequences: fused-state inputs ``features`` ``[B, L, F]`` and ``tokens``
        ``[B, L + steps]`` (``tokens[:, p + 1]`` follows position ``p``; right padding is harmless). Step ``j``'s row
        ``i`` is drafting depth ``j`` after verified position ``i``, on the true path: it guesses the token at
        ``i + j + 2``; step 0's keys and values up to ``i`` are the cache decoding holds there."""
        length, device = features.shape[1], features.device
        states = self.fc(features.to(self.dtype))
        positions = torch.arange(length, device=device)
        keys, values, queries = self.layer.keys_values_queries(self.embed(tokens[:, 1 : length + 1]), states, positions)
        causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        out = self.layer.finish(states, attend(queries, keys, values, causal))
        outputs = [out]
        own_keys, own_values = [], []
        for j in range(1, steps):
            step_keys, step_values, queries = self.layer.keys_values_queries(
                self.embed(tokens[:, j + 1 : j + 1 + length]), out, positions + j)
            own_keys.append(step_keys)
            own_values.append(step_values)
            out = self.layer.finish(out, attend(queries, keys, values, causal, torch.stack(own_keys, dim=3),
                                                torch.stack(own_values, dim=3)))
            outputs.append(out)
        return outputs, keys, values

    def teacher_forced(self, captured: dict, ids: torch.LongTensor, first: int):
        """`Drafter.teacher_forced` through the unrolled steps: what the heads read is the layer's output at each
        position, and drafting after ``t`` attends to step 0's keys and values up to ``t``."""
        tokens = torch.cat([ids, ids[:, -1:].expand(1, self.num_heads + 1)], dim=1)  # past the end: never a target
        outputs, keys, values = self.unrolled(captured["features"], tokens, self.num_heads)
        logits = torch.stack([self.project(self.norm(out[0]), j) for j, out in enumerate(outputs)], dim=1)
        return outputs[0][0], logits, lambda t: (keys[:, :, : t + 1], values[:, :, : t + 1])

    def forced_states(self, hidden: torch.Tensor, tokens: torch.LongTensor) -> torch.Tensor:
        raise NotImplementedError("EAGLE-3 drafts over whole sequences: train it with the sequence trainer "
                                  "(training.sequence_trainer), not from single positions.")
