"""Kangaroo self-drafting (Liu et al., 2024): the base's first layers, a small adapter and the base's lm_head.

The drafter is the base itself, cut short. A draft token is the argmax of

    lm_head(adapter(h^l)),   h^l = the output of the base's layer ``l - 1`` (``exit_layer = l``),

and drafting runs token by token: the newest token goes through the base's first ``l`` layers (which
write their KV entries into the base's own cache), then through the adapter (one attention layer with its
own KV cache: input RMSNorm, attention, residual, final RMSNorm; no MLP), then through the frozen lm_head
(over the draft vocabulary where one is set). A draft ends after ``num_heads`` tokens or after the first
token drafted with probability below ``exit_confidence`` (the second early exit; that token is still
verified).

What verification reuses. Drafting runs the shallow layers on the newest token and every drafted one, the
last guess included, so when the base verifies exactly that chain (`KangarooState.verifying`) the forward
starts at layer ``l``, as Kangaroo's own code verifies from the exited states: the shallow layers stand
aside during it (`exited_forward`: each passes its input on, layer ``l - 1`` answers with the states
drafting computed) and their KV entries from drafting are appended to the base's cache after it. Until then
they are kept aside (`draft_chain` crops them, so the cache's lengths, from which the forward builds its
mask and positions, are the model's own), and nothing of the model's forward is rewritten: it works for
any decoder whose layers take the hidden states first. A step that verifies anything else (a tree, or a
longer chain, after prompt lookup grafted copied tokens into the draft) runs the whole base, and the last
guess's shallow pass was spent for nothing. The saving is ``l / num_layers`` of a verification forward
(2 / 30 for SmolLM2-135M) for the cost of one shallow pass on a single token; the bench's profile shows
both (``verify``, ``draft``). The adapter's cache is extended after each verification with the exited
states at the accepted positions (`KangarooState.observe`), so it always covers exactly the verified
tokens.

Size. Kangaroo's adapter is a full-width attention layer (``4 d^2`` parameters: as large as four Medusa
heads of one block each on SmolLM2-135M). Here its width is ``adapter_heads * adapter_head_dim`` (64 by
default), so it has ``4 * d * width + 2 d`` parameters (148k for ``d = 576``), with rotary position
embeddings of its own. A fresh adapter's output projection is zero: it drafts the base's early exit at
layer ``l`` (transformers' ``assistant_early_exit``, with the adapter's final norm).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from ..configuration_cerberus import CerberusConfig
from ..compat import cache_argument, tree_attention_ok
from ..blocks.transfer import positions_index
from .base import Drafter, SequenceState, capture_lm_head_input, decoder_layers, in_this_thread
from .layers import AttentionAdapter
from ..module_views import config_view, module_view, replace_modules, with_forward


@contextmanager
def first_layers(model: nn.Module, count: int) -> Iterator[nn.Module]:
    """A view of the base's decoder (`module_views`) running only its first ``count`` layers (then its final
    norm, which the drafter does not read); the base itself is left whole for other threads. Each layer keeps
    its index, so it reads and writes its own cache layer."""
    decoder, name, layers = decoder_layers(model)
    yield module_view(decoder, {name: layers[:count]}, config=config_view(decoder.config, num_hidden_layers=count))


@contextmanager
def capture_exit_states(model: nn.Module, exit_layer: int) -> Iterator[dict]:
    """`capture_lm_head_input`, plus ``captured["exit"]``: the output of layer ``exit_layer - 1``
    (``[batch, positions, hidden]``) on every forward that runs it."""
    _, _, layers = decoder_layers(model)

    @in_this_thread
    def hook(module, args, output):
        captured["exit"] = output[0] if isinstance(output, tuple) else output
        captured["exit_is_tuple"] = isinstance(output, tuple)  # how a stand-in for the layer must answer

    with capture_lm_head_input(model) as captured:
        handle = layers[exit_layer - 1].register_forward_hook(hook)
        try:
            yield captured
        finally:
            handle.remove()


@dataclass
class ShallowPass:
    """What drafting computed of the next verification forward: the base's first ``exit_layer`` layers over
    the newest token and the drafted chain."""

    tokens: list[int]  # the newest token, then the chain
    exit_states: torch.Tensor  # [1, len(tokens), hidden]: layer ``exit_layer - 1``'s outputs at them
    keys_values: list[tuple[torch.Tensor, torch.Tensor]]  # per shallow layer: its KV entries at them


def exited_forward(model: nn.Module, shallow: ShallowPass, as_tuple: bool) -> nn.Module:
    """A view of the base (`module_views`) whose forward starts at layer ``len(shallow.keys_values)``: the
    shallow layers stand aside (each passes its input on, the last answers with ``shallow.exit_states``) and
    leave the cache alone; their KV entries are appended after the forward. Everything else the forward builds
    (positions, masks, the cache's lengths) is the model's own, so this works for any decoder whose layers
    take the hidden states first and return them (first, in a tuple, when ``as_tuple``)."""
    decoder, name, layers = decoder_layers(model)
    count = len(shallow.keys_values)

    def passthrough(hidden_states, *args, **kwargs):
        return (hidden_states,) if as_tuple else hidden_states

    def exited(hidden_states, *args, **kwargs):
        states = shallow.exit_states.to(hidden_states.device, hidden_states.dtype)
        return (states,) if as_tuple else states

    # built each verification step: the decoder is replaced as a whole, so only the way to it is walked
    stand_ins = {str(i): with_forward(layers[i], passthrough) for i in range(count - 1)}
    stand_ins[str(count - 1)] = with_forward(layers[count - 1], exited)
    return replace_modules(model, {decoder: module_view(decoder, {name: module_view(layers, stand_ins)})})


class KangarooState(SequenceState):
    """The adapter's KV cache for one sequence, where to find the base's cache and captured states, and the
    shallow layers' work on the last draft (`ShallowPass`) until its verification."""

    def __init__(self, drafter: "KangarooDrafter", model: nn.Module, cache):
        self.drafter, self.model, self.cache = drafter, model, cache
        self.past: tuple[torch.Tensor, torch.Tensor] | None = None
        self.length = 0
        self.captured: dict = {}
        self.shallow: ShallowPass | None = None

    def extend(self, exit_states: torch.Tensor) -> torch.Tensor:
        """Run the adapter on the next positions' exited states ``[1, n, hidden]``; returns its outputs."""
        count = exit_states.shape[1]
        positions = torch.arange(self.length, self.length + count, device=exit_states.device)
        out, self.past = self.drafter.adapter(exit_states.to(self.drafter.dtype), positions, self.past)
        self.length += count
        return out

    def truncate(self, length: int) -> None:
        """Forget the positions from ``length`` on."""
        if self.past is not None and length < self.length:
            self.past = (self.past[0][..., :length, :], self.past[1][..., :length, :])
        self.length = min(self.length, length)

    def observe(self, captured: dict, keep: list[int] | None) -> None:
        self.captured = captured
        states = captured["exit"]
        self.extend(states if keep is None else states[:, positions_index(keep, states.device)])

    @contextmanager
    def verifying(self, model: nn.Module, step_tokens: torch.LongTensor | None) -> Iterator[nn.Module]:
        """Verify from layer ``exit_layer`` on when the forward reads exactly the chain just drafted (the
        shallow layers ran on it then); otherwise (a gated step, a draft lookup changed) the whole base."""
        shallow, self.shallow = self.shallow, None
        if shallow is None or step_tokens is None or step_tokens[0].tolist() != shallow.tokens:
            yield model
            return
        yield exited_forward(model, shallow, self.captured.get("exit_is_tuple", False))
        for layer, (keys, values) in zip(self.cache.layers, shallow.keys_values):
            layer.update(keys, values)


class PathScorer:
    """The Kangaroo drafter read as a small language model over token paths, for lattice rescoring
    (`blocks.rescoring.lm_rescore`): `log_probs` gives its log-distribution over the draft vocabulary after
    the sequence's first ``visible`` tokens, its newest token (at position ``visible``) and each path.

    A path's nodes are fed once, the first time a path through them is asked for, all new nodes of one depth
    in one forward: through the base's first layers (their KV entries go into the base's cache after the cached
    positions) and through the adapter (likewise into its cache). A node attends to the visible positions, its
    ancestors and itself (a tree mask, as verification uses), so it computes what drafting its path token by
    token would. `close` drops every fed node from both caches. In decoding every cached position is visible;
    calibration caches a whole held-out sequence once and scores each position with the later ones hidden."""

    def __init__(self, drafter: "KangarooDrafter", state: KangarooState, newest: int, visible: int,
                 device: torch.device):
        self.drafter, self.state, self.device = drafter, state, device
        self.newest, self.visible = newest, visible
        self.cached = state.length  # positions in both caches before the first node (>= visible)
        self.columns: dict[tuple[int, ...], int] = {}  # a fed path's node: its index after the cached positions
        self.memo: dict[tuple[int, ...], torch.Tensor] = {}  # a fed path: the log-probabilities after it [V]

    def log_probs(self, paths: list[tuple[int, ...]]) -> torch.Tensor:
        """Log-probabilities ``[len(paths), V]`` (over the draft vocabulary) of the token after each path."""
        needed = {tuple(path[:d]) for path in paths for d in range(len(path) + 1)} - self.memo.keys()
        for depth in sorted({len(path) for path in needed}):
            self._feed(sorted(path for path in needed if len(path) == depth))
        return torch.stack([self.memo[tuple(path)] for path in paths])

    def _feed(self, paths: list[tuple[int, ...]]) -> None:
        """Run the nodes ending ``paths`` (all of one depth, their ancestors fed) through both caches."""
        model, device = self.state.model, self.device
        fed, count, depth = len(self.columns), len(paths), len(paths[0])
        total = self.cached + fed + count
        if not tree_attention_ok(model, total):
            raise RuntimeError(f"{total} positions under a tree mask: more than this base can attend to that way "
                               "(flash attention, or past its sliding window); check tree_attention_ok first.")
        attend = torch.zeros(count, total, dtype=torch.bool, device=device)
        attend[:, : self.visible] = True
        for row, path in enumerate(paths):
            for ancestor in range(depth):
                attend[row, self.cached + self.columns[path[:ancestor]]] = True
            attend[row, self.cached + fed + row] = True
        tokens = torch.tensor([[path[-1] if path else self.newest for path in paths]], device=device)
        positions = torch.full((count,), self.visible + depth, device=device)
        mask = torch.zeros(1, 1, count, total, dtype=model.dtype, device=device)
        mask.masked_fill_(~attend, torch.finfo(model.dtype).min)
        with first_layers(model, self.drafter.exit_layer) as decoder:
            decoder(input_ids=tokens, **cache_argument(self.state.cache), position_ids=positions[None],
                    attention_mask=mask, use_cache=True)
        exit_states = self.state.captured["exit"].to(self.drafter.dtype)
        adapted, self.state.past = self.drafter.adapter(exit_states, positions, self.state.past, attend=attend)
        self.state.length += count
        log_probs = torch.log_softmax(self.drafter.logits(adapted[0]).float(), dim=-1)
        for row, path in enumerate(paths):
            self.columns[path] = fed + row
            self.memo[path] = log_probs[row]

    def close(self) -> None:
        """Drop the fed nodes from the base's cache and the adapter's: both are as before the first call."""
        if self.columns:
            for layer in self.state.cache.layers[: self.drafter.exit_layer]:
                layer.crop(-len(self.columns))
            self.state.truncate(self.cached)
        self.columns.clear()
        self.memo.clear()


class KangarooDrafter(Drafter):
    """Drafts with the base's first ``exit_layer`` layers, the adapter and the base's lm_head."""

    drafter_type = "kangaroo"
    drafts_chains = True
    trains_on_sequences = True

    def __init__(self, config: CerberusConfig):
        super().__init__(config)
        self.exit_layer = config.exit_layer
        self.adapter = AttentionAdapter(config.hidden_size, config.adapter_heads, config.adapter_head_dim)
        # Verification reuses the first layers' work on the draft (`KangarooState.verifying`); False recomputes
        # it, as for every other family, to measure what the reuse saves.
        self.reuse_shallow_layers = True

    def build_blocks(self, config: CerberusConfig) -> nn.ModuleList:
        return nn.ModuleList()  # no heads: the adapter is the drafter's only trained part

    def attach(self, base: nn.Module) -> None:
        layers = decoder_layers(base)[2]
        if not 1 <= self.exit_layer < len(layers):
            raise ValueError(f"exit_layer must be between 1 and {len(layers) - 1} for this base ({len(layers)} "
                             f"layers), got {self.exit_layer}.")
        super().attach(base)

    def capture(self, model: nn.Module):
        return capture_exit_states(model, self.exit_layer)

    def start(self, model: nn.Module, cache) -> KangarooState:
        return KangarooState(self, model, cache)

    def logits(self, adapted: torch.Tensor) -> torch.Tensor:
        """Draft logits over the draft vocabulary from the adapter's outputs."""
        return self.project(adapted, 0)

    def next_logits(self, adapted: torch.Tensor, sequence: list[int]) -> torch.Tensor:
        """Logits ``[V]`` of the token after ``sequence`` (the tokens so far, drafted ones included) from
        the adapter's output at its last position (``[hidden]``). The sequence is for tests' oracles."""
        return self.logits(adapted)

    @torch.no_grad()
    def draft_chain(self, state: KangarooState, input_ids: torch.LongTensor, max_tokens: int,
                    confidence: float) -> list[int]:
        start = input_ids.shape[1] - 1  # the newest token's position: not in either cache yet
        if state.length != start:
            raise RuntimeError(f"the adapter's cache covers {state.length} positions but the sequence has {start} "
                               "verified ones; the decoding loop must call observe() after every forward.")
        sequence = input_ids[0].tolist()
        drafted: list[int] = []
        exits: list[torch.Tensor] = []
        state.shallow = None

        def shallow(decoder, token: int) -> torch.Tensor:
            """The token at the next position through the first layers; their output there ``[1, 1, hidden]``."""
            length = start + len(exits)
            decoder(input_ids=torch.full((1, 1), token, device=input_ids.device, dtype=input_ids.dtype),
                    **cache_argument(state.cache), use_cache=True,
                    position_ids=torch.full((1, 1), length, device=input_ids.device),
                    attention_mask=torch.ones(1, length + 1, dtype=torch.long, device=input_ids.device))
            exits.append(state.captured["exit"][:, -1:])
            return exits[-1]

        with first_layers(state.model, self.exit_layer) as decoder:
            token = sequence[-1]
            while len(drafted) < max_tokens:
                adapted = state.extend(shallow(decoder, token))
                probs = torch.softmax(self.next_logits(adapted[0, -1], sequence + drafted).float(), dim=-1)
                top, index = probs.max(dim=-1)
                drafted.append(int(self.token_ids(index)))
                if float(top) < confidence:
                    break
                token = drafted[-1]
            if self.reuse_shallow_layers and drafted:
                shallow(decoder, drafted[-1])  # the last guess too: verification then starts at exit_layer
        fed = len(exits)
        if self.reuse_shallow_layers and drafted:
            layers = state.cache.layers[: self.exit_layer]
            state.shallow = ShallowPass(sequence[-1:] + drafted, torch.cat(exits, dim=1),
                                        [(layer.keys[..., -fed:, :], layer.values[..., -fed:, :]) for layer in layers])
        for layer in state.cache.layers[: self.exit_layer]:
            layer.crop(-fed)
        state.truncate(start)
        return drafted

    def path_scorer(self, state: KangarooState, input_ids: torch.LongTensor, visible: int | None = None) -> PathScorer:
        if state.captured.get("exit") is None:
            raise RuntimeError("the scorer reads the states the base's first layers compute: call observe() with the "
                               "prefill first.")
        visible = input_ids.shape[1] - 1 if visible is None else visible
        if state.length < visible:
            raise RuntimeError(f"the adapter's cache covers {state.length} positions but {visible} are to be visible; "
                               "the decoding loop must call observe() after every forward.")
        return PathScorer(self, state, int(input_ids[0, visible]), visible, input_ids.device)

    def adapt(self, exit_states: torch.Tensor) -> torch.Tensor:
        """The adapter's outputs ``[B, T, hidden]`` over exited states ``[B, T, hidden]`` of whole sequences
        from their first position (causal; right padding is harmless): teacher-forced, as training fits
        and calibration measures them."""
        positions = torch.arange(exit_states.shape[1], device=exit_states.device)
        return self.adapter(exit_states.to(self.dtype), positions)[0]

    def forced_chain_logits(self, captured: dict, sequence: list[int]) -> torch.Tensor:
        adapted = self.adapt(captured["exit"][:1, : len(sequence)])[0]
        return torch.stack([self.next_logits(adapted[p], sequence[: p + 1]) for p in range(len(sequence))])
