"""A DFlash block drafter (arXiv 2602.06036, z-lab/dflash; transformers' ``DFlashTokenCandidateGenerator``): a whole
block of guesses from one forward of a small bidirectional decoder over mask tokens.

What it reads. The base's states leaving some of its decoder layers (DFlash's ``target_layer_ids``; here
``feature_layers``, as transformers' ``hidden_states`` indices: ``target_layer_ids + 1``), concatenated and fused by
one linear map ``fc`` (``len(layers) * d -> d``, no bias) and an RMS norm into the context state ``c_p`` of every
verified position ``p``.

How it drafts. Its ``num_layers`` decoder layers (rotary positions, grouped-query attention with RMS-normed queries and
keys, a SwiGLU MLP) run once per step over a block of ``num_heads + 1`` inputs at positions ``t + 1 .. t + num_heads +
1``: the base's embedding of the newest token (the one the verifier just chose), then ``num_heads`` mask tokens
(``mask_token_id``). Every block position attends to every other (no causal mask) and to the context: each layer's keys
and values of ``c_p`` at every verified ``p``, which the drafter caches (`DFlashState`; the context enters every layer
as it is, never through the layers below). The block's outputs after the final norm, projected through the base's
``lm_head``, are the guesses: output ``k + 1`` guesses token ``t + k + 2``, depth ``k``. The guesses do not read one
another (``reads_tokens = False``), so one forward gives every depth's distribution, and a tree of each depth's top-k
(static or dynamic, as for Medusa) costs no more drafting than the chain.

Where this differs from transformers' and z-lab's code: nothing in what a step computes (the tests compare the drafts
with transformers' generator position by position), except that every layer attends to the whole context, where
transformers' configuration can make layers sliding-window ones (2048 positions by default): past that window the
drafts differ, never the output. A fresh drafter's mask token is the base's last token id and its layers start from a
fixed seed, so untrained drafts are wrong, as verification allows.
"""

from __future__ import annotations

import torch
from torch import nn

from ..configuration_cerberus import CerberusConfig
from ..errors import UserError
from .eagle3 import FeatureLayersDrafter, PendingFeaturesState, attend
from .layers import GatedMLP, init_from_fixed_seed, llama_mlp_width, rotary, rotate

# (keys, values) ``[R or 1, KVH, T, D]`` of the context at one layer
LayerContext = tuple[torch.Tensor, torch.Tensor]


def default_feature_layers(num_layers: int, drafter_layers: int) -> list[int]:
    """DFlash's choice of the base's layers (z-lab's ``build_target_layer_ids``) for a drafter of ``drafter_layers``
    layers, as ``hidden_states`` indices (one more than DFlash's layer ids), each kept between 1 and
    ``num_layers - 1`` (the last one, after the final norm, is no layer's output here)."""
    if drafter_layers == 1:
        ids = [num_layers // 2]
    else:
        span = num_layers - 4
        ids = [int(round(1 + i * span / (drafter_layers - 1))) for i in range(drafter_layers)]
    return [min(max(i + 1, 1), num_layers - 1) for i in ids]


class BlockLayer(nn.Module):
    """One DFlash decoder layer: attention of the block over the context's keys and values and its own (every block
    position sees all of them), then a SwiGLU MLP, each with its RMS norm and residual."""

    def __init__(self, hidden_size: int, num_heads: int, kv_heads: int, head_dim: int, width: int, eps: float,
                 rope_theta: float):
        super().__init__()
        if head_dim % 2:
            raise UserError(f"adapter_head_dim must be even (rotary embeddings), got {head_dim}.")
        self.num_heads, self.kv_heads, self.head_dim, self.rope_theta = num_heads, kv_heads, head_dim, rope_theta
        self.input_layernorm = nn.RMSNorm(hidden_size, eps=eps)
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.q_norm = nn.RMSNorm(head_dim, eps=eps)
        self.k_norm = nn.RMSNorm(head_dim, eps=eps)
        self.post_attention_layernorm = nn.RMSNorm(hidden_size, eps=eps)
        self.mlp = GatedMLP(hidden_size, width)
        init_from_fixed_seed(self.q_proj, self.k_proj, self.v_proj, self.o_proj)

    def _heads(self, x: torch.Tensor, count: int) -> torch.Tensor:
        return x.view(*x.shape[:-1], count, self.head_dim).transpose(-3, -2)  # [B, heads, N, D]

    def _rotation(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        rotation = rotary(positions, self.head_dim, dtype, self.rope_theta)
        return rotation if positions.dim() == 1 else tuple(part[:, None] for part in rotation)

    def keys_values(self, x: torch.Tensor, rotation: tuple[torch.Tensor, torch.Tensor]) -> LayerContext:
        """(keys, values ``[B, KVH, N, D]``) of inputs ``x`` ``[B, N, hidden]`` (the context as it is, or the block
        after the input norm) with their positions' ``rotation``."""
        keys = rotate(self.k_norm(self._heads(self.k_proj(x), self.kv_heads)), rotation)
        return keys, self._heads(self.v_proj(x), self.kv_heads)

    def context(self, states: torch.Tensor, positions: torch.Tensor) -> LayerContext:
        """This layer's keys and values of context states ``[B, N, hidden]`` at ``positions`` ``[N]`` or ``[B, N]``."""
        return self.keys_values(states, self._rotation(positions, states.dtype))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, context: LayerContext,
                visible: torch.Tensor | None) -> torch.Tensor:
        """The block ``x`` ``[B, N, hidden]`` at ``positions`` (``[N]`` or ``[B, N]``) through this layer, attending to
        the ``context`` (``visible``: which of its keys each row sees, broadcastable to ``[B, 1, 1, 1, T]``; None: all)
        and to the whole block."""
        normed = self.input_layernorm(x)
        rotation = self._rotation(positions, x.dtype)
        keys, values = self.keys_values(normed, rotation)
        queries = rotate(self.q_norm(self._heads(self.q_proj(normed), self.num_heads)), rotation)
        if context[0].shape[0] == 1 and x.shape[0] > 1:
            attended = self._attend_one_context(queries, keys, values, context, visible)
        else:
            count = x.shape[1]

            def every_position(part: torch.Tensor) -> torch.Tensor:  # [B, KVH, N, N, D]: each query sees the block
                return part[:, :, None].expand(-1, -1, count, -1, -1)

            attended = attend(queries, context[0], context[1], visible, every_position(keys), every_position(values))
        x = x + self.o_proj(attended.transpose(-3, -2).reshape(*x.shape[:-1], -1))
        return x + self.mlp(self.post_attention_layernorm(x))

    @staticmethod
    def _attend_one_context(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, context: LayerContext,
                            visible: torch.Tensor | None) -> torch.Tensor:
        """`attend` for ``R`` blocks (``queries`` ``[R, H, N, D]``, their own ``keys``/``values`` ``[R, KVH, N, D]``) over
        one sequence's context (``[1, KVH, T, D]``; ``visible`` broadcastable to ``[R, 1, 1, 1, T]``): the blocks after
        every position, in training and calibration. The ``R * N`` queries attend as one row, so the context's keys
        are never copied per block (the broadcast form copies them ``R`` times, which dominated a training step)."""
        rows, heads, count, dim = queries.shape
        kv_heads = keys.shape[1]

        def flat(part: torch.Tensor) -> torch.Tensor:  # [R, KVH, N, D] -> [1, KVH, R * N, N, D]: each query's block
            return part[:, :, None].expand(-1, -1, count, -1, -1).transpose(0, 1).reshape(1, kv_heads, rows * count,
                                                                                          count, dim)

        mask = None if visible is None else visible.reshape(-1, visible.shape[-1]).expand(rows, -1) \
            .repeat_interleave(count, dim=0)
        out = attend(queries.transpose(0, 1).reshape(1, heads, rows * count, dim), context[0], context[1], mask,
                     flat(keys), flat(values))
        return out.reshape(heads, rows, count, dim).transpose(0, 1)


class DFlashState(PendingFeaturesState):
    """Every layer's keys and values of the context over one sequence's verified positions, and the fused states of the
    newest ones (`DFlashDrafter.capture`), which wait for the next drafting step."""

    def __init__(self, drafter: "DFlashDrafter"):
        self.drafter = drafter
        self.layers: list[LayerContext] | None = None
        self.pending: torch.Tensor | None = None  # [1, k, features]: verified, not in the cache yet

    @property
    def cached(self) -> int:
        return 0 if self.layers is None else self.layers[0][0].shape[2]

    def forget(self) -> None:
        self.layers = None

    def heads_input(self, input_ids: torch.LongTensor, hidden: torch.Tensor) -> torch.Tensor:
        positions = self.pending_positions(input_ids)
        if positions.numel():  # new copies, never written in place: calibration copies this state to repeat a step
            new = self.drafter.context(self.pending, positions)
            self.layers = new if self.layers is None else [
                (torch.cat([k, nk], dim=2), torch.cat([v, nv], dim=2)) for (k, v), (nk, nv) in zip(self.layers, new)]
            self.pending = self.pending[:, :0]
        return hidden

    def context(self) -> tuple[list[LayerContext] | None, int]:
        """(every layer's keys and values of the context, how many positions they cover: the newest token's)."""
        return self.layers, self.cached


class DFlashRows:
    """Every layer's keys and values of the context over every row's verified positions, for the device step
    (`decoding.device_step`), in fixed-shape device buffers: a row writes its new positions right after its own
    (``length``), ``visible`` hides its left padding and what lies past it, ``position`` counts its verified positions
    (rotary). What `DFlashState` keeps for one sequence, kept
    for a batch."""

    def __init__(self, drafter: "DFlashDrafter", batch: int, room: int, device: torch.device):
        self.drafter = drafter
        shape = (batch, drafter.layers[0].kv_heads, room, drafter.layers[0].head_dim)
        self.keys = [torch.zeros(shape, dtype=drafter.dtype, device=device) for _ in drafter.layers]
        self.values = [torch.zeros(shape, dtype=drafter.dtype, device=device) for _ in drafter.layers]
        self.visible = torch.zeros(batch, room, dtype=torch.bool, device=device)
        self.length = torch.zeros(batch, dtype=torch.long, device=device)
        self.position = torch.zeros_like(self.length)

    def start(self, features: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> None:
        """The context of a prefill's fused states ``[B, W, F]`` followed by ``tokens`` ``[B, W]`` (``valid``: not left
        padding)."""
        self.visible.zero_()
        self.length.zero_()
        self.position.zero_()
        self._extend(features, valid, valid.shape[1])

    def extend(self, features: torch.Tensor, tokens: torch.Tensor, count: torch.Tensor) -> None:
        """Each row's first ``count`` of ``features`` ``[B, n, F]`` (the accepted path), with the ``tokens`` after
        them."""
        self._extend(features, torch.arange(tokens.shape[1], device=count.device)[None] < count[:, None], count)

    def _extend(self, features: torch.Tensor, valid: torch.Tensor, advance) -> None:
        positions = self.position[:, None] + (valid.long().cumsum(-1) - 1).clamp(min=0)
        slots = self.length[:, None] + torch.arange(valid.shape[1], device=valid.device)[None]  # [B, n]
        for layer, (keys, values) in enumerate(self.drafter.context(features, positions)):
            index = slots[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[-1])
            self.keys[layer].scatter_(2, index, keys)
            self.values[layer].scatter_(2, index, values)
        self.visible.scatter_(1, slots, valid)
        self.length.add_(advance)
        self.position.add_(valid.long().sum(dim=-1))

    def read(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden  # the block reads the newest token and the context alone

    def context(self) -> "DFlashRows":
        """What the block attends to: every row's context (`DFlashDrafter.draft_level`)."""
        return self


class DFlashDrafter(FeatureLayersDrafter):
    """Drafts a block at once with a small bidirectional decoder over mask tokens and the base's fused states (see the
    module docstring)."""

    drafter_type = "dflash"
    reads_tokens = False
    trains_on_sequences = True

    def __init__(self, config: CerberusConfig):
        super().__init__(config)
        # a config made without a base leaves them to `attach` (DFlash's, chosen for the base's depth)
        self.feature_layers = list(config.feature_layers) if config.feature_layers else None
        hidden = config.hidden_size
        if config.mask_token_id is None or not 0 <= config.mask_token_id < config.vocab_size:
            raise UserError(f"DFlash needs a mask_token_id in [0, {config.vocab_size}), got {config.mask_token_id!r}.")
        self.mask_token_id = config.mask_token_id
        count = len(self.feature_layers) if self.feature_layers else 1
        self.fc = nn.Linear(count * hidden, hidden, bias=False)
        init_from_fixed_seed(self.fc)
        eps = config.rms_norm_eps or 1e-6
        self.context_norm = nn.RMSNorm(hidden, eps=eps)
        self.layers = nn.ModuleList(
            BlockLayer(hidden, config.adapter_heads, config.adapter_kv_heads or config.adapter_heads,
                       config.adapter_head_dim, config.intermediate_size or llama_mlp_width(hidden), eps,
                       config.rope_theta or 10000.0)
            for _ in range(config.num_layers))
        self.norm = nn.RMSNorm(hidden, eps=eps)

    @classmethod
    def config_defaults(cls, base: nn.Module) -> dict:
        """DFlash's layers for one drafter layer (`default_feature_layers`), the base's attention shape and its last
        token id as the mask token."""
        text = base.config.get_text_config()
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        return {"feature_layers": default_feature_layers(text.num_hidden_layers, 1), "adapter_heads": heads,
                "adapter_head_dim": head_dim + head_dim % 2,
                "adapter_kv_heads": getattr(text, "num_key_value_heads", None) or heads,
                "mask_token_id": base.get_output_embeddings().weight.shape[0] - 1}

    def build_blocks(self, config: CerberusConfig) -> nn.ModuleList:
        return nn.ModuleList()  # no per-depth heads: one block serves every depth

    state_class, rows_class = DFlashState, DFlashRows

    def default_layers(self, count: int) -> list[int]:
        return default_feature_layers(count, len(self.layers))

    def check_layers(self) -> None:
        if self.fc.in_features != len(self.feature_layers) * self.hidden_size:
            raise UserError(f"this DFlash drafter fuses {self.fc.in_features // self.hidden_size} layers, but "
                            f"feature_layers names {len(self.feature_layers)}.")

    # ------------------------------------------------------------------------------ the block
    def context(self, features: torch.Tensor, positions: torch.Tensor) -> list[LayerContext]:
        """Every layer's keys and values of the context at ``positions`` (``[N]`` or ``[B, N]``) from the fused layers'
        states ``[B, N, F]``."""
        states = self.context_norm(self.fc(features.to(self.dtype)))
        return [layer.context(states, positions) for layer in self.layers]

    def block(self, last: torch.LongTensor, first: torch.Tensor, contexts: list[LayerContext],
              visible: torch.Tensor | None) -> torch.Tensor:
        """Each row's guesses ``[B, num_heads * hidden]`` (depth ``k``'s normed output at ``[:, k * hidden :]``) from its
        newest token ``last`` ``[B]`` at position ``first`` (``[B, 1]`` or ``[1, 1]``) and the mask tokens after it,
        attending to ``contexts`` (each layer's) where ``visible`` (None: all of it)."""
        masks = torch.full((last.shape[0], self.num_heads), self.mask_token_id, dtype=torch.long, device=last.device)
        x = self.embed(torch.cat([last[:, None], masks], dim=1))
        positions = (first + torch.arange(self.num_heads + 1, device=last.device)).expand(last.shape[0], -1)
        for layer, context in zip(self.layers, contexts):
            x = layer(x, positions, context, visible)
        return self.norm(x[:, 1:]).reshape(x.shape[0], -1)

    def draft_level(self, k: int, hidden: torch.Tensor, tokens: torch.LongTensor, previous: torch.Tensor | None,
                    context: object | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Depth 0 runs the block after the newest token (``tokens[:, 0]``), attending to ``context`` (a sequence's,
        `DFlashState.context`; every row's in the device step, `DFlashRows`, whose nodes come row by row; None: nothing
        cached, the block alone); its state ``[n, num_heads * hidden]`` holds every depth's normed output, which the
        deeper depths read from ``previous``. ``hidden`` (the base's newest state) is not read: the context holds it."""
        if k == 0:
            previous = self.block(tokens[:, 0], *self._draft_context(context, tokens))
        size = self.hidden_size
        return previous, self.project(previous[:, k * size : (k + 1) * size], k)

    def _draft_context(self, context: object | None, tokens: torch.LongTensor
                       ) -> tuple[torch.Tensor, list[LayerContext], torch.Tensor | None]:
        """(the newest token's position ``[n, 1]`` or ``[1, 1]``, each layer's context, which of its keys each node
        sees) for nodes whose newest tokens are ``tokens[:, 0]``."""
        if isinstance(context, DFlashRows):
            per = tokens.shape[0] // context.position.shape[0]  # nodes of each row
            return (context.position.repeat_interleave(per)[:, None], list(zip(context.keys, context.values)),
                    context.visible.repeat_interleave(per, dim=0)[:, None, None, None, :])
        layers, cached = context if context is not None else (None, 0)
        if layers is None:  # no verified position cached: the block alone
            layer = self.layers[0]
            empty = tokens.new_zeros(1, layer.kv_heads, 0, layer.head_dim, dtype=self.dtype)
            layers = [(empty, empty)] * len(self.layers)
        return torch.full((1, 1), cached, device=tokens.device), layers, None

    def unrolled_outputs(self, features: torch.Tensor, tokens: torch.LongTensor, steps: int) -> list[torch.Tensor]:
        """`FeatureLayersDrafter.unrolled_outputs`: the block after every position at once."""
        rows, cols = torch.meshgrid(*(torch.arange(n, device=features.device) for n in features.shape[:2]),
                                    indexing="ij")
        picked = self.unrolled_at(features, tokens, [(rows.reshape(-1), cols.reshape(-1))] * steps)
        return [out.view(*features.shape[:2], -1) for out in picked]

    def unrolled_at(self, features: torch.Tensor, tokens: torch.LongTensor,
                    picks: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """`FeatureLayersDrafter.unrolled_at`: the blocks after the positions depth 0 scores alone (every deeper depth
        scores a subset of them), each row's attending to its sequence's context up to its position."""
        rows, cols = picks[0]
        length = int(cols.max()) + 1 if cols.numel() else 0
        contexts = self.context(features[:, :length], torch.arange(length, device=features.device))
        blocks = features.new_empty(rows.shape[0], self.num_heads * self.hidden_size, dtype=self.dtype)
        for b in rows.unique().tolist():
            at = (rows == b).nonzero()[:, 0]
            blocks[at] = self._blocks_after(tokens[b, cols[at] + 1], cols[at],
                                            [(k[b : b + 1], v[b : b + 1]) for k, v in contexts])
        where = torch.full((features.shape[0], max(length, 1)), -1, dtype=torch.long, device=features.device)
        where[rows, cols] = torch.arange(rows.shape[0], device=features.device)
        size = self.hidden_size
        return [blocks[where[r, c], j * size : (j + 1) * size] for j, (r, c) in enumerate(picks)]

    def _blocks_after(self, following: torch.LongTensor, positions: torch.Tensor, contexts: list[LayerContext]
                      ) -> torch.Tensor:
        """One sequence's blocks ``[n, num_heads * hidden]`` after each of ``positions`` ``[n]`` (their newest tokens
        ``following`` ``[n]``), attending to ``contexts`` (each layer's, ``[1, KVH, T, D]``) up to that position, as
        drafting does after it."""
        keys = torch.arange(contexts[0][0].shape[2], device=positions.device)
        return self.block(following, positions[:, None] + 1, contexts,
                          (keys[None] <= positions[:, None])[:, None, None, None])

    def teacher_forced(self, captured: dict, ids: torch.LongTensor, first: int):
        """`Drafter.teacher_forced`: the block after every position ``t`` of ``ids`` at once; the heads read the base's
        state there."""
        length = ids.shape[1]
        rows = torch.arange(length, device=ids.device)
        contexts = self.context(captured["features"], rows)
        following = ids[0, (rows + 1).clamp(max=length - 1)]  # past the end: never a target
        blocks = self._blocks_after(following, rows, contexts)
        size = self.hidden_size
        logits = torch.stack([self.project(blocks[:, k * size : (k + 1) * size], k) for k in range(self.num_heads)],
                             dim=1)
        hidden = captured["hidden"][0].to(self.dtype)
        return hidden, logits, lambda t: ([(k[:, :, : t + 1], v[:, :, : t + 1]) for k, v in contexts], t + 1)

    def forced_states(self, hidden: torch.Tensor, tokens: torch.LongTensor) -> torch.Tensor:
        raise NotImplementedError("DFlash drafts from the context of whole sequences, not from single positions.")
