"""The drafter interface: the one notion of a drafter that decoding, calibration and training know.

A drafter reads what the base computed during verification (`capture`: by default the input of the
base's ``lm_head``, the last hidden state after the final norm, whatever the architecture) and guesses the
next tokens depth by depth. Depth ``k`` (0-based) guesses token ``t + k + 2`` from

* ``hidden``: the base's state ``h_t`` (the state from which the base predicted token ``t + 1``);
* ``tokens``: the tokens at ``t + 1 .. t + k + 1``: the verifier's newest token, then the guesses drafted
  above depth ``k`` on the same path (in training and calibration: the true tokens, teacher forcing);
* ``previous``: the drafter's own state at depth ``k - 1`` on the same path (``None`` at depth 0).

A family that also reads the sequence before ``t`` (``context_window > 0``: Clover's augmenting block) turns
a window of the newest verified states, each with the token that followed it, into the ``hidden`` its heads
read (`contextualize`: `window_rows` per position, then `read_window` over the window); decoding keeps that
window per sequence (`ContextState`) and training and calibration gather it from stored states
(`context_windows`).

A family is the small part that differs: how a head turns those into its state (`head_state`), which part
of that state the vocabulary projection reads (`readout`; all of it by default) and which blocks it is made
of (`make_block`). Everything else is here: the projection through the frozen base
``lm_head`` (or per-head copies, Medusa-1), the reduced draft vocabulary, and teacher-forced states for
training and calibration (`forced_states`). Families whose guesses ignore ``tokens`` and ``previous``
beyond the head index (``reads_tokens = False``: Medusa, Cerberus) run once per depth whatever the tree;
the others (Hydra) once per tree node that has children, batched per depth (`decoding.drafting`).

A drafter saves its ``state_dict`` (safetensors) and the config fields its constructor reads. The base
modules it reads (input embeddings, ``lm_head``) are attached with `attach`, never registered or saved.
Fresh heads are the identity on ``h_t`` (zero-initialised residual branches), so an untrained drafter
guesses the base's own next token at every depth: wrong, but harmless, since verification decides.
"""

from __future__ import annotations

import functools
import threading
import weakref
from contextlib import contextmanager, nullcontext
from typing import Callable, ClassVar, ContextManager, Iterator

import torch
from torch import nn

from ..configuration_cerberus import STATE_SOURCES, CerberusConfig
from ..blocks.transfer import positions_index


@contextmanager
def capture_states(model: nn.Module, source: str = "lm_head_input") -> Iterator[dict]:
    """Record the base's last hidden state on every forward: ``captured["hidden"]`` is the state named by
    ``source`` (`STATE_SOURCES`), ``[batch, positions, hidden]``.

    ``"lm_head_input"`` is the state exactly as the base turns it into logits (after the final norm,
    whatever the architecture); ``"final_norm_input"`` is the last decoder layer's output, the residual
    stream before the final norm, which Clover-2 reads (it keeps the state's scale, which the norm divides
    out). The lm_head's input is always kept as ``captured["lm_head_input"]`` too (the teacher's logits
    come from it)."""
    if source not in STATE_SOURCES:
        raise ValueError(f"Unknown state source {source!r}; expected one of {', '.join(STATE_SOURCES)}.")
    captured: dict = {}

    @in_this_thread
    def store(name: str, value: torch.Tensor) -> None:
        captured[name] = value
        if name == source:
            captured["hidden"] = value

    handles = [model.get_output_embeddings().register_forward_pre_hook(
        lambda module, args: store("lm_head_input", args[0]))]
    if source == "final_norm_input":
        handles.append(decoder_layers(model)[2][-1].register_forward_hook(
            lambda module, args, output: store("final_norm_input", output[0] if isinstance(output, tuple) else output)))
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def in_this_thread(record: Callable[..., None]) -> Callable[..., None]:
    """``record`` made to act only on calls from the thread that made it (and to ignore the rest).

    A capture hooks modules of a base that other threads may be running at the same time (their own
    `generate()` calls on the same model): each capture must see its own thread's forwards only. A hook is
    the one thing a capture adds to the base, and it changes nothing the base computes. Under ``torch.compile`` (a
    static cache's compiled forward, `decoding.static_cache`) it runs uncompiled: recording into a Python dict is a
    side effect the graph cannot hold, so the forward's graph is cut there."""
    owner = threading.get_ident()

    @torch.compiler.disable
    @functools.wraps(record)
    def recorded(*args, **kwargs) -> None:
        if threading.get_ident() == owner:
            record(*args, **kwargs)

    return recorded


def capture_lm_head_input(model: nn.Module) -> ContextManager[dict]:
    """`capture_states` of the lm_head's input, the state every family reads by default."""
    return capture_states(model, "lm_head_input")


def decoder_layers(model: nn.Module) -> tuple[nn.Module, str, nn.ModuleList]:
    """(the base's decoder, the attribute name of its layer list, the list): the ``ModuleList`` child of
    ``model.get_decoder()`` with one entry per hidden layer (``layers`` in Llama-style models, ``h`` in GPT-2)."""
    decoder = model.get_decoder()
    count = model.config.get_text_config().num_hidden_layers
    for name, child in decoder.named_children():
        if isinstance(child, nn.ModuleList) and len(child) == count:
            return decoder, name, child
    raise ValueError(f"{type(model).__name__}: no list of {count} decoder layers found; Kangaroo cannot run its "
                     "first layers on their own, and no drafter can read the state before the final norm.")


class ResidualBlock(nn.Module):
    """``x + SiLU(W [x; extra] + b)``; identity at initialisation."""

    def __init__(self, hidden_size: int, extra_size: int = 0):
        super().__init__()
        self.extra_size = extra_size
        self.linear = nn.Linear(hidden_size + extra_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
        inputs = x if extra is None else torch.cat([x, extra], dim=-1)
        return x + self.act(self.linear(inputs))


class SequenceState:
    """What a drafter keeps across the steps of one sequence, following acceptance and rollback.

    The decoding loop makes one per sequence (`Drafter.start`) and tells it, after the prefill and after
    every verification, what the base computed (``captured``, as `Drafter.capture` recorded it) and which
    of the forward's input positions were kept (``keep``; None: all of them, the prefill). Heads that
    guess from the newest state alone keep nothing; a drafter with its own KV cache (Kangaroo) extends
    it with the kept positions here, so the cache always covers exactly the tokens the base has verified.
    """

    def observe(self, captured: dict, keep: list[int] | None) -> None:
        """The base's latest forward, of which the input positions ``keep`` were kept."""

    def context(self) -> object | None:
        """What this step's drafting attends to beyond what the heads read (`Drafter.draft_level`'s ``context``),
        valid after `heads_input`: a drafter with its own KV cache over the verified tokens (EAGLE-3) gives that
        cache; None for the others."""
        return None

    def heads_input(self, input_ids: torch.LongTensor, hidden: torch.Tensor) -> torch.Tensor:
        """What the heads read this step (``[1, hidden]``) after ``input_ids``, whose newest token the base
        predicted from ``hidden`` (``[1, hidden]``): that state itself unless the drafter reads a window."""
        return hidden

    def verifying(self, model: nn.Module, step_tokens: torch.LongTensor | None) -> ContextManager[nn.Module]:
        """Entered around every verification forward, giving the model to run it with (by default ``model``
        itself): over ``step_tokens`` (``[1, n]``: the newest token and a chain draft) at consecutive positions,
        or over a tree (None). A drafter that already computed part of that forward while drafting (Kangaroo:
        the base's first layers over its chain) lends it to the forward here, through a view of ``model``
        (`module_views`: the base itself stays as it is for other threads)."""
        return nullcontext(model)


class ContextState(SequenceState):
    """The window rows (`Drafter.window_rows`) of the newest verified states of one sequence (at most
    ``context_window``), for a drafter that reads them; each row is computed once, when the token after its
    state is known, and kept while it is in the window.

    The window starts at the state that predicted the first new token (the prefill's last position), as
    training reads it from the hidden-state cache, which holds answers only."""

    def __init__(self, drafter: "Drafter"):
        self.drafter = drafter
        self.rows: torch.Tensor | None = None  # [n, ...]: the rows of the states before the pending ones
        self.pending: torch.Tensor | None = None  # [k, hidden]: the newest states, their rows not computed yet
        self.verified = 0  # states verified since the prefill's last one
        self.prefill: int | None = None  # the prefill's length; None until the first step that reads the heads

    def observe(self, captured: dict, keep: list[int] | None) -> None:
        hidden = captured["hidden"][0]
        if keep is None:
            self.rows, self.pending, self.verified, self.prefill = None, hidden[-1:], 0, None
            return
        if self.pending is None:
            raise RuntimeError("the decoding loop must call observe() with the prefill first.")
        # only the newest context_window states can still enter the window, however long no step drafts
        kept = hidden[positions_index(keep, hidden.device)]
        self.pending = torch.cat([self.pending, kept])[-self.drafter.context_window :]
        self.verified += len(keep)

    def heads_input(self, input_ids: torch.LongTensor, hidden: torch.Tensor) -> torch.Tensor:
        if self.pending is None:
            raise RuntimeError("the decoding loop must call observe() with the prefill before drafting.")
        if self.prefill is None:
            self.prefill = input_ids.shape[1] - 1 - self.verified
        if input_ids.shape[1] != self.prefill + self.verified + 1:
            raise RuntimeError(f"the drafter's window ends at position {self.prefill + self.verified} but the "
                               f"sequence has {input_ids.shape[1] - 1} verified states; observe() must follow every "
                               "forward.")
        count = self.pending.shape[0]
        if count:  # the tokens after the pending states, the sequence's newest, are known now
            rows = self.drafter.window_rows(self.pending[None].to(self.drafter.dtype), input_ids[:, -count:])[0]
            self.rows = rows if self.rows is None else torch.cat([self.rows, rows])
            self.rows, self.pending = self.rows[-self.drafter.context_window :], self.pending[:0]
        valid = torch.ones(1, self.rows.shape[0], dtype=torch.bool, device=input_ids.device)
        return self.drafter.read_window(self.rows[None], valid)


class RowWindow:
    """The newest ``context_window`` verified states of every row, each with the token that followed it, as a drafter
    that reads a window keeps them (`drafters.base.ContextState`), in fixed-shape device buffers, right-aligned (the
    newest last): ``states`` ``[B, W, hidden]``, ``tokens`` ``[B, W]``, ``valid`` ``[B, W]``."""

    def __init__(self, drafter: "Drafter", batch: int, hidden_size: int, device: torch.device):
        self.drafter, size = drafter, drafter.context_window
        self.states = torch.zeros(batch, size, hidden_size, dtype=drafter.dtype, device=device)
        self.tokens = torch.zeros(batch, size, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch, size, dtype=torch.bool, device=device)
        self.offsets = torch.arange(size, device=device)

    def start(self, states: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> None:
        """The window after a prefill of ``states`` ``[B, W, hidden]`` followed by ``tokens`` ``[B, W]`` (``valid``: not
        left padding): the prefill's last state alone, where the answer starts (as `ContextState` and training)."""
        self.states.zero_()
        self.states[:, -1] = states[:, -1]
        self.tokens.zero_()
        self.tokens[:, -1] = tokens[:, -1]
        self.valid.zero_()
        self.valid[:, -1] = True

    def read(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the heads read (``[B, hidden]``), the base's newest states being ``hidden`` (the window's newest)."""
        return self.drafter.contextualize(self.states, self.tokens, self.valid)

    def context(self) -> None:
        """Nothing beyond what the heads read."""
        return None

    def extend(self, states: torch.Tensor, tokens: torch.Tensor, count: torch.Tensor) -> None:
        """Append each row's first ``count`` of ``states`` ``[B, n, hidden]`` with the ``tokens`` after them."""
        index = count[:, None] + self.offsets[None]  # the window's last W once the row's new ones are in
        fresh = torch.arange(states.shape[1], device=count.device)[None] < count[:, None]
        joined = torch.cat([self.states, states.to(self.states.dtype)], dim=1)
        self.states.copy_(joined.gather(1, index[..., None].expand(-1, -1, joined.shape[-1])))
        self.tokens.copy_(torch.cat([self.tokens, tokens], dim=1).gather(1, index))
        self.valid.copy_(torch.cat([self.valid, fresh], dim=1).gather(1, index))


def context_windows(rows: torch.LongTensor, first: torch.LongTensor, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(index ``[n, window]``, valid ``[n, window]``) of the stored states each of ``rows`` reads in context: the
    ``window`` rows ending at it, oldest first, of which those before ``first`` (the row's window start, e.g. its
    record's first row) are not valid (their index repeats the row's own)."""
    index = rows[:, None] + torch.arange(1 - window, 1, device=rows.device)
    valid = index >= first[:, None]
    return torch.where(valid, index, rows[:, None]), valid


class Drafter(nn.Module):
    """Draft heads on a frozen base; subclasses set ``drafter_type``, ``reads_tokens`` and `head_state`.

    Each head's blocks live in their own ``ModuleList`` (``blocks[k][layer]``; no block is shared).

    A drafter guesses depth by depth (`draft_level`), and decoding builds any tree from those guesses.
    A drafter that runs through the base itself (``drafts_chains = True``: Kangaroo) proposes its own chain
    instead (`draft_chain`), token by token with a state kept across steps (`start`); it drafts chains only.
    """

    drafter_type: ClassVar[str]
    reads_tokens: ClassVar[bool] = False
    drafts_chains: ClassVar[bool] = False
    # trained over whole sequences (its state at a position depends on the positions before it), not from single
    # positions of the hidden-state cache through `forced_states`: Kangaroo's adapter, EAGLE-3's layer
    trains_on_sequences: ClassVar[bool] = False
    # its weights are layers the base ships (MTP layers): only a base that ships them can have it
    needs_base_layers: ClassVar[bool] = False
    # the device step can draft with it: its state per row fits fixed-shape device buffers (`device_rows`)
    steps_on_device: ClassVar[bool] = True
    context_window: int = 0  # how many of the newest verified states the heads read (0: only h_t)
    # `linear` for weights no module holds (the draft vocabulary's rows of a projection); a decoding view on a CPU
    # sets one that computes through packed weights (`blocks.packed.PackedWeights.linear`)
    linear: Callable[..., torch.Tensor] = staticmethod(nn.functional.linear)

    def __init__(self, config: CerberusConfig):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.vocab_size = config.vocab_size
        self.num_heads = config.num_heads
        self.state_source = config.state_source
        self.blocks = self.build_blocks(config)
        self.lm_heads = self.build_projections(config)
        # Drafting may project onto a frequency-ranked subset of the vocabulary: the projection is the
        # costly part of a head on a CPU, and verification still uses the full vocabulary.
        self.register_buffer(
            "draft_vocab",
            torch.zeros(config.draft_vocab_size, dtype=torch.long) if config.draft_vocab_size else None,
        )
        self._draft_rows: dict[int, tuple] = {}
        self.dropout = nn.Dropout(config.head_dropout)  # training only: `forced_states` applies it, drafting never

    # ------------------------------------------------------------------------------ the family's part
    def build_blocks(self, config: CerberusConfig) -> nn.ModuleList:
        """``blocks[k][layer]``: each head's stack of `make_block` blocks."""
        return nn.ModuleList(
            nn.ModuleList(self.make_block(k, layer) for layer in range(config.num_layers))
            for k in range(config.num_heads)
        )

    def build_projections(self, config: CerberusConfig) -> nn.ModuleList | None:
        """The projections of a drafter with its own (``head_projection="own"``, Medusa-1): one copy of the base
        ``lm_head`` per head; None when the heads project through the frozen base ``lm_head``."""
        if config.head_projection != "own":
            return None
        return nn.ModuleList(nn.Linear(config.hidden_size, config.vocab_size, bias=False)
                             for _ in range(config.num_heads))

    def make_block(self, k: int, layer: int) -> nn.Module:
        """Block ``layer`` of head ``k`` (a plain residual block unless the family needs more inputs)."""
        return ResidualBlock(self.hidden_size)

    def head_state(
        self, k: int, hidden: torch.Tensor, tokens: torch.LongTensor, previous: torch.Tensor | None
    ) -> torch.Tensor:
        """Head ``k``'s state ``[n, hidden]`` from ``hidden`` ``[n, hidden]``, ``tokens`` ``[n, k + 1]`` and
        ``previous`` ``[n, hidden]`` (see the module docstring)."""
        raise NotImplementedError

    def readout(self, k: int, state: torch.Tensor) -> torch.Tensor:
        """The part of head ``k``'s state ``[n, ...]`` that its vocabulary projection reads (``[n, hidden]``)."""
        return state

    def window_rows(self, hidden: torch.Tensor, next_tokens: torch.LongTensor) -> torch.Tensor:
        """What a windowed drafter keeps of each verified state ``[..., hidden]`` and the token that followed it
        (``[...]``), position by position (so decoding computes each once)."""
        return hidden

    def read_window(self, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The ``hidden`` the heads read (``[n, hidden]``) from windows of `window_rows` ``[n, W, ...]``, oldest
        first, and which of them belong to the window (``[n, W]`` bool); by default the newest row alone."""
        return rows[:, -1]

    def contextualize(self, hidden: torch.Tensor, next_tokens: torch.LongTensor, valid: torch.Tensor) -> torch.Tensor:
        """The ``hidden`` the heads read (``[n, hidden]``) from windows of verified states ``[n, W, hidden]``
        (oldest first, the newest being ``h_t``), the token that followed each (``[n, W]``) and which of them
        belong to the window (``[n, W]`` bool): by default ``h_t`` alone."""
        return self.read_window(self.window_rows(hidden, next_tokens), valid)

    def heads_inputs(self, hidden: torch.Tensor, next_tokens: torch.LongTensor, first: torch.LongTensor,
                     rows: torch.LongTensor) -> torch.Tensor:
        """`contextualize` at each of ``rows`` of stored states ``hidden`` ``[N, hidden]`` (``next_tokens[i]``
        followed state ``i``; row ``r``'s window starts at ``first[r]``): what the heads read there."""
        if self.context_window <= 0:
            return hidden[rows].to(self.dtype)
        index, valid = context_windows(rows, first[rows], self.context_window)
        return self.contextualize(hidden[index].to(self.dtype), next_tokens[index], valid)

    # ------------------------------------------------------------------------------ the base it reads
    @classmethod
    def config_defaults(cls, base: nn.Module) -> dict:
        """Config fields this family derives from ``base`` when heads are built on it and the caller did not set
        them (e.g. which of its layers to read); none by default."""
        return {}

    def attach(self, base: nn.Module) -> None:
        """Read the frozen ``base``'s ``lm_head`` and input embeddings from now on. The reference is kept
        outside the module tree (a weak one: the model owning both keeps the base alive), so the base is
        never moved, trained, copied or saved with the drafter."""
        self.__dict__["_base"] = weakref.ref(base)

    @property
    def base_lm_head(self) -> nn.Module:
        return self._attached().get_output_embeddings()

    def embed(self, tokens: torch.LongTensor) -> torch.Tensor:
        """The base's input embeddings of ``tokens`` (as the base itself embeds them, scaling included)."""
        return self._attached().get_input_embeddings()(tokens).to(self.dtype)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def _attached(self) -> nn.Module:
        ref = self.__dict__.get("_base")
        base = ref() if ref is not None else None
        if base is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a base model: call attach(base) first.")
        return base

    def capture(self, model: nn.Module):
        """A context manager during which ``captured["hidden"]`` holds what this drafter reads from the
        base's latest forward (``[batch, positions, hidden]``): the state its config's ``state_source``
        names (`capture_states`; the hidden-state cache records the same one)."""
        return capture_states(model, self.state_source)

    # ------------------------------------------------------------------------------ drafting
    def start(self, model: nn.Module, cache) -> SequenceState:
        """The state this drafter keeps for one sequence decoded by ``model`` (the base) with ``cache``."""
        return ContextState(self) if self.context_window > 0 else SequenceState()

    def device_rows(self, batch: int, room: int, device: torch.device) -> object | None:
        """What the device step (`decoding.device_step`) keeps per row for this drafter across steps, in fixed-shape
        device buffers, with ``start`` (after the prefill), ``extend`` (after each step), ``read`` (what the heads read,
        from the base's newest state, as `SequenceState.heads_input`) and ``context`` (what drafting attends to): a window of verified states (`RowWindow`), EAGLE-3's cache; None:
        nothing beyond the base's newest state. ``room``: the slots of the base's cache per row."""
        return RowWindow(self, batch, self.hidden_size, device) if self.context_window > 0 else None

    def device_states(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """What the device step's row state keeps of a base forward, from its ``hidden_states`` (the embeddings, then
        each decoder layer's output, the last after the final norm): the state `capture` records (the lm_head's
        input)."""
        return hidden_states[-1]

    def draft_chain(self, state: SequenceState, input_ids: torch.LongTensor, max_tokens: int,
                    confidence: float) -> list[int]:
        """A chain drafter's draft after ``input_ids`` (at most ``max_tokens``, ending after the first token
        drafted with probability below ``confidence``); only for ``drafts_chains`` drafters."""
        raise NotImplementedError(f"{type(self).__name__} guesses depth by depth (draft_level), not whole chains.")

    def path_scorer(self, state: SequenceState, input_ids: torch.LongTensor, visible: int | None = None):
        """A chain drafter read as a small language model for lattice rescoring: an object whose
        ``log_probs(paths)`` gives the log-distribution over the draft vocabulary after ``input_ids[:, :visible + 1]``
        (``visible``: the verified positions before the newest token, by default all) and each path of tokens,
        and whose ``close()`` undoes what scoring left in the caches; only for ``drafts_chains`` drafters."""
        raise NotImplementedError(f"{type(self).__name__} guesses depth by depth from the base's state; it cannot score "
                                  "paths of tokens on its own.")

    def forced_chain_logits(self, captured: dict, sequence: list[int]) -> torch.Tensor:
        """A chain drafter's draft logits ``[len(sequence), V]`` at every position of ``sequence`` after the
        base read it (``captured``), each as drafting computes it when every draft before it was right."""
        raise NotImplementedError(f"{type(self).__name__} guesses depth by depth (draft_level), not whole chains.")

    def draft_level(
        self, k: int, hidden: torch.Tensor, tokens: torch.LongTensor, previous: torch.Tensor | None,
        context: object | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(head ``k``'s state, its logits over the draft vocabulary) for ``n`` nodes at depth ``k``; ``context`` is
        the sequence's `SequenceState.context` (None for heads that read ``hidden`` alone)."""
        state = self.head_state(k, hidden, tokens, previous)
        return state, self.project(self.readout(k, state), k)

    def forced_states(self, hidden: torch.Tensor, tokens: torch.LongTensor) -> torch.Tensor:
        """Every head's projected state (`readout`) ``[n, num_heads, hidden]`` with the true tokens ``tokens``
        ``[n, num_heads]`` (``tokens[:, j]`` is the token at ``t + 1 + j``) in place of drafted ones: what
        training fits. In training mode, ``head_dropout`` drops parts of what the heads read and of what they
        project (Hydra++'s regularisation)."""
        states, previous = [], None
        hidden = self.dropout(hidden)
        for k in range(self.num_heads):
            previous = self.head_state(k, hidden, tokens[:, : k + 1], previous)
            states.append(self.dropout(self.readout(k, previous)))
        return torch.stack(states, dim=-2)

    def teacher_forced(self, captured: dict, ids: torch.LongTensor, first: int
                       ) -> tuple[torch.Tensor, torch.Tensor, Callable[[int], object | None]]:
        """At every position ``t`` of one sequence ``ids`` ``[1, n]`` the base read (``captured``, as `capture` recorded
        it): (what the heads read ``[n, ...]``, their logits with the true tokens above each depth ``[n, num_heads, V]``,
        the `SequenceState.context` drafting after ``t`` attends to), as decoding computes them after a prompt whose
        last state is ``first`` (a window starts there): what calibration measures."""
        seq = ids[0]
        rows = torch.arange(seq.shape[0], device=ids.device)
        hidden = self.heads_inputs(captured["hidden"][0], torch.cat([seq[1:], seq[-1:]]), rows.clamp(max=max(first, 0)),
                                   rows)
        ahead = (rows[:, None] + 1 + torch.arange(self.num_heads, device=ids.device)).clamp(max=seq.shape[0] - 1)
        return hidden, self(hidden, seq[ahead]), lambda t: None

    def forward(self, hidden: torch.Tensor, tokens: torch.LongTensor) -> torch.Tensor:
        """Teacher-forced logits ``[n, num_heads, V]`` over the draft vocabulary (``token_ids`` maps their
        indices to token ids): head ``k`` given the true tokens above it."""
        logits, previous = [], None
        for k in range(self.num_heads):
            previous, head_logits = self.draft_level(k, hidden, tokens[:, : k + 1], previous)
            logits.append(head_logits)
        return torch.stack(logits, dim=-2)

    # ------------------------------------------------------------------------------ projection
    @property
    def own_projection(self) -> bool:
        return self.lm_heads is not None

    def init_projections_from(self, lm_head_weight: torch.Tensor) -> None:
        """Start each own projection as a copy of the base ``lm_head`` (the Medusa-1 recipe)."""
        if self.lm_heads is None:
            return
        with torch.no_grad():
            for proj in self.lm_heads:
                proj.weight.copy_(lm_head_weight)

    def projection(self, k: int) -> nn.Module:
        """The vocabulary projection of head ``k``."""
        return self.lm_heads[k] if self.lm_heads is not None else self.base_lm_head

    def project(self, states: torch.Tensor, k: int) -> torch.Tensor:
        """Head ``k``'s logits from its states, restricted to the draft vocabulary's rows when one is set."""
        projection = self.projection(k)
        if self.draft_vocab is None:
            return projection(states)
        bias = getattr(projection, "bias", None)
        return self.linear(states, self._draft_rows_of(projection.weight),
                           self._draft_rows_of(bias) if bias is not None else None)

    def _draft_rows_of(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor[draft_vocab]``, gathered once and reused while neither tensor changes: a fresh gather
        of the projection rows each decoding step costs about as much as the reduced projection itself."""
        if torch.is_grad_enabled() and tensor.requires_grad:
            return tensor[self.draft_vocab]
        key = (tensor._version, self.draft_vocab.data_ptr(), self.draft_vocab._version)
        cached = self._draft_rows.get(id(tensor))
        if cached is None or cached[0]() is not tensor or cached[1] != key:
            cached = (weakref.ref(tensor), key, tensor[self.draft_vocab])
            self._draft_rows[id(tensor)] = cached
        return cached[2]

    def token_ids(self, indices: torch.Tensor) -> torch.Tensor:
        """Token ids of indices into the logits the drafter returns."""
        return indices if self.draft_vocab is None else self.draft_vocab[indices]

    def draft_index(self) -> torch.Tensor | None:
        """Each token id's index in the draft vocabulary (``[vocab_size]``, -1 where not in it); None without one."""
        if self.draft_vocab is None:
            return None
        index = torch.full((self.vocab_size,), -1, dtype=torch.long, device=self.draft_vocab.device)
        index[self.draft_vocab] = torch.arange(self.draft_vocab.numel(), device=self.draft_vocab.device)
        return index

    def set_draft_vocab(self, token_ids: torch.Tensor | None) -> None:
        """Draft over these token ids only (e.g. the most frequent ones), or over all when None."""
        self._draft_rows.clear()
        if token_ids is None:
            self.draft_vocab = None
            return
        token_ids = torch.as_tensor(token_ids, dtype=torch.long)
        if token_ids.numel() == 0 or int(token_ids.min()) < 0 or int(token_ids.max()) >= self.vocab_size:
            raise ValueError(f"A draft vocabulary needs token ids in [0, {self.vocab_size}).")
        if token_ids.unique().numel() != token_ids.numel():
            raise ValueError(f"A draft vocabulary lists {token_ids.numel() - token_ids.unique().numel()} token ids twice.")
        weight = next(self.parameters(), None)  # (a drafter of the base's own layers holds none: the base's device)
        self.draft_vocab = token_ids.to((weight if weight is not None else self.base_lm_head.weight).device)
