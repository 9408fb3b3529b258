"""`CerberusForCausalLM`: any Hugging Face decoder plus draft heads, decoding through `generate()` as usual.

The wrapper computes exactly the base's logits in `forward`; only `generate()` differs, and only in speed: it runs the
base's own `generate()` preparation with a draft-verify loop as the decoding method (`decoding.paths`, `decoding.call`),
fed by a `Proposer`, with the settings `settings_selection` chooses. The class keeps what a user calls. Checkpoints hold
only the heads (safetensors), a config naming the base, and stub modules that import this package (`remote_code`), so
they load with `AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)` where it is installed (and
tokenize with the base's tokenizer: `tokenization_cerberus`).
"""

from __future__ import annotations

import copy
import os
import shlex
import shutil
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass

import torch
from huggingface_hub import HfApi
from torch import nn
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.generation.stopping_criteria import StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput
from transformers.utils import logging

from .base_model import base_shape, check_base_compatible, greedy_generation_config, load_base_model
from .checkpoint import HUB_KWARGS, resolve_file, save_heads_state_dict
from .compat import cache_argument
from .configuration_cerberus import CerberusConfig
from .blocks.acceptance import TypicalAcceptance
from .decoding.batched import shared_budget
from .decoding.call import call_rows, call_stopping_criteria, refuse_unsupported, run_base
from .decoding.proposer import Proposer
from .decoding.paths import choose_path, host_work, path_decoding
from .blocks.ngram import NGRAM_WEIGHTS_NAME, NgramModel
from .blocks.packed import PackedWeights
from .blocks.profiling import StepProfiler, phase_timer
from .blocks.rescoring import Rescoring
from .blocks.settings import UNSET, DecodingSettings
from .blocks.stats import GenerationStats
from .blocks.tree import DynamicTree
from .calibration.statistics import POSITIONS_NAME, PositionStatistics
from .drafters import DRAFTER_CLASSES, Drafter, build_drafter
from .errors import UserError
from .importing import CARRIED_POSITIONS, foreign_config, import_drafter
from .loading import RESCORER_FOLDER, check_rescorer, read_config, read_folder, read_heads, rescorer_folder
from .remote_code import copied_code, custom_generate_code, write_loading_code
from . import settings_selection

logger = logging.get_logger(__name__)
_thread_stats = threading.local()  # per thread: each model's latest generate() statistics


class CerberusPreTrainedModel(PreTrainedModel):
    config_class = CerberusConfig
    base_model_prefix = "base"
    supports_gradient_checkpointing = False

    def _init_weights(self, module: nn.Module) -> None:
        """Nothing to do: heads initialise themselves (identity blocks) and the base is pretrained."""


class CerberusForCausalLM(CerberusPreTrainedModel, GenerationMixin):
    """A base causal LM with draft heads; `generate()` drafts with the heads and verifies with the base.

    After each `generate()` call, ``model.generation_stats`` (a `GenerationStats`, per thread) holds the number
    of base forward passes, the tokens produced per pass (``tau``), the gate's draft rate and per-head
    acceptance; with ``return_dict_in_generate=True`` the output carries them as ``generation_stats``.

    `generate()` may be called from any number of threads on one model: a call's captured states, drafter state,
    statistics and settings belong to it, and the base and its generation config are never changed.
    """

    def __init__(self, config: CerberusConfig, base_model: nn.Module | None = None, **base_kwargs):
        super().__init__(config)
        base = base_model if base_model is not None else load_base_model(config, **base_kwargs)
        check_base_compatible(config, base)
        self.base = base
        lm_weight = base.get_output_embeddings().weight
        self.heads: Drafter = build_drafter(config).to(device=lm_weight.device, dtype=lm_weight.dtype)
        self.heads.attach(base)
        self.heads.init_projections_from(lm_weight)
        self.generation_config = greedy_generation_config(getattr(base, "generation_config", None))
        self.ngram: NgramModel | None = None  # the lattice rescorer's n-gram model, when the folder has one
        self.rescorer: Drafter | None = None  # the lattice rescorer's small LM (a Kangaroo drafter), when it has one
        self.rescorer_config: CerberusConfig | None = None
        self.packed_weights = PackedWeights()  # the base's and drafter's linear weights packed for oneDNN (on a CPU)
        # the checkpoint's half of a calibration (`calibration.statistics`): what first use fits this machine from
        self.calibration_statistics: PositionStatistics | None = None
        self.post_init()

    # ----------------------------------------------------------------------------------------- building
    @classmethod
    def from_base(
        cls,
        base_model: nn.Module,
        head_type: str = "cerberus",
        num_heads: int | None = None,
        num_layers: int = 1,
        head_projection: str = "shared",
        gate_threshold: float | None = None,
        **config_kwargs,
    ) -> "CerberusForCausalLM":
        """Fresh (untrained, identity) heads on a loaded base. ``config_kwargs`` go to `CerberusConfig`
        (e.g. ``base_model_name_or_path`` when the base was loaded from somewhere its config does not say).
        ``num_heads``: 4 unless the family derives it from the base (``head_type="mtp"``: one per MTP layer)."""
        model_type, hidden_size, vocab_size = base_shape(base_model)
        from .real_models import describe_source  # the packaged-base loader, off the package's import path

        for key, value in describe_source(getattr(base_model, "name_or_path", None)).items():
            config_kwargs.setdefault(key, value)
        if head_type in DRAFTER_CLASSES:  # (an unknown one is refused by the config, naming the choices)
            for key, value in DRAFTER_CLASSES[head_type].config_defaults(base_model).items():
                config_kwargs.setdefault(key, value)
        derived = config_kwargs.pop("num_heads", 4)
        num_heads = num_heads if num_heads is not None else derived
        config = CerberusConfig(
            base_model_type=model_type,
            hidden_size=hidden_size,
            vocab_size=vocab_size,
            head_type=head_type,
            num_heads=num_heads,
            num_layers=num_layers,
            head_projection=head_projection,
            gate_threshold=gate_threshold,
            **config_kwargs,
        )
        return cls(config, base_model=base_model)

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *model_args,
        config: CerberusConfig | None = None,
        base_model: nn.Module | None = None,
        **kwargs,
    ) -> "CerberusForCausalLM":
        """Load heads from a folder or Hub id, and the base they name (or ``base_model`` if given).

        The heads file is read and checked against its config before the base is loaded, so a bad
        checkpoint fails fast and nothing is left half-loaded. Loading keywords such as ``dtype``,
        ``device_map`` and ``attn_implementation`` apply to the base.

        A drafter saved in another project's layout (speculators' or EAGLE's EAGLE-3, Medusa's or vLLM's Medusa)
        loads as the matching family (`importing`; ``num_heads=`` sets an EAGLE-3 drafter's depth).
        """
        path = str(pretrained_model_name_or_path)
        hub_kwargs = {k: kwargs[k] for k in HUB_KWARGS if kwargs.get(k) is not None}
        foreign = foreign_config(path, hub_kwargs) if config is None else None
        if foreign is not None:
            model = import_drafter(cls, path, foreign, base_model, hub_kwargs, kwargs)
            model.calibration_statistics = _read_positions(path, CARRIED_POSITIONS, model.config, hub_kwargs)
            return model
        copied = copied_code(path)
        if copied:
            logger.warning_once(
                f"cerberus-hf: {path} carries {len(copied)} modules of package code an earlier release copied into it. "
                "Loading here ignores them, but trust_remote_code=True would run that frozen copy: "
                f"`cerberus-hf refresh-folder {shlex.quote(path)}` replaces it with stubs that import the installed "
                "package."
            )
        config = read_config(path, config, hub_kwargs)
        # every file of the folder is read and checked before the base loads: a bad one fails fast
        state_dict, generation_config, ngram = read_folder(path, config, hub_kwargs)
        statistics = _read_positions(path, POSITIONS_NAME, config, hub_kwargs)

        config.name_or_path = path  # as transformers' from_pretrained: the model's name_or_path (said in messages)
        model = cls(config, base_model=base_model, **kwargs)
        model.heads.load_state_dict(state_dict, strict=True)
        if generation_config is not None:
            model.generation_config = generation_config
        model.ngram = ngram
        model.calibration_statistics = statistics
        folder = rescorer_folder(path, hub_kwargs)
        if folder is not None:
            model.load_rescorer(folder)
        model.eval()
        return model

    def save_pretrained(self, save_directory: str | os.PathLike, is_main_process: bool = True, **kwargs) -> None:
        """Write the heads (safetensors), ``config.json`` with ``auto_map``, the loading code (`remote_code`: stub
        modules, the tokenizer's entry and ``custom_generate/``), ``generation_config.json`` and the calibration
        positions where the model holds them (`calibration.statistics`). The base's weights are never written."""
        if kwargs.get("push_to_hub"):
            raise UserError("Use model.push_to_hub(repo_id) to upload; save_pretrained only writes a folder.")
        if not is_main_process:
            return
        os.makedirs(save_directory, exist_ok=True)
        self.config.architectures = [type(self).__name__]
        self.config.save_pretrained(save_directory)
        write_loading_code(save_directory, custom_generate_code(self.config.head_type))  # the stubs came with the config
        self.generation_config.save_pretrained(save_directory)
        save_heads_state_dict(self.heads.state_dict(), save_directory)
        if self.ngram is not None:
            self.ngram.save(os.path.join(save_directory, NGRAM_WEIGHTS_NAME))
        if self.calibration_statistics is not None:
            self.calibration_statistics.save(save_directory)
        if self.rescorer is not None:
            folder = os.path.join(save_directory, RESCORER_FOLDER)
            os.makedirs(folder, exist_ok=True)
            self.rescorer_config.save_pretrained(folder)
            save_heads_state_dict(self.rescorer.state_dict(), folder)

    def load_rescorer(self, source: "str | os.PathLike | CerberusForCausalLM | None", **hub_kwargs) -> None:
        """Rescore lattices with a small LM from now on (``rescoring={"lm_weight": ...}``): a Kangaroo
        checkpoint for this base (a folder, a Hub id, or a loaded model), read as a language model (the base's
        first layers, its adapter and the lm_head; `drafters.kangaroo.PathScorer`). Its adapter is all it adds;
        `save_pretrained` writes it to ``rescorer/`` beside the heads. None drops it. A checkpoint for
        another base, of another family or with unreadable weights is refused."""
        if source is None:
            self.rescorer = self.rescorer_config = None
            return
        if isinstance(source, CerberusForCausalLM):
            config, state_dict, where = source.config, source.heads.state_dict(), "the given model"
        else:
            where = str(source)
            config = CerberusConfig.from_pretrained(where, **hub_kwargs)
            state_dict = read_heads(where, config, hub_kwargs)
        check_rescorer(self.config, config, where)
        lm_weight = self.base.get_output_embeddings().weight
        rescorer = build_drafter(config).to(device=lm_weight.device, dtype=lm_weight.dtype)
        rescorer.attach(self.base)
        rescorer.load_state_dict(state_dict, strict=True)
        self.rescorer, self.rescorer_config = rescorer.eval(), config

    def load_ngram(self, path: str | os.PathLike | None) -> None:
        """Use the n-gram model saved at ``path`` (`cerberus-hf ngram`) for lattice rescoring; None drops it.
        A model counted over another vocabulary is refused."""
        self.ngram = None if path is None else NgramModel.load(path, vocab_size=self.config.vocab_size)

    def push_to_hub(
        self,
        repo_id: str,
        *,
        commit_message: str = "Upload cerberus-hf heads",
        private: bool | None = None,
        token: str | bool | None = None,
        revision: str | None = None,
        create_pr: bool = False,
        model_card: str | os.PathLike | None = None,
        tokenizer=None,
    ):
        """Upload what `save_pretrained` writes (heads, config, code, generation config), plus a model
        card file and a tokenizer if given, with huggingface_hub's `create_repo` and `upload_folder`."""
        api = HfApi(token=token)
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        with tempfile.TemporaryDirectory() as folder:
            self.save_pretrained(folder)
            if model_card is not None:
                shutil.copyfile(model_card, os.path.join(folder, "README.md"))
            if tokenizer is not None:
                tokenizer.save_pretrained(folder)
            return api.upload_folder(
                repo_id=repo_id, folder_path=folder, commit_message=commit_message, revision=revision,
                create_pr=create_pr,
            )

    # ----------------------------------------------------------------------------------------- computing
    def get_input_embeddings(self) -> nn.Module:
        return self.base.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        return self.base.get_output_embeddings()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values=None,
        inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ):
        """The base model's forward, unchanged: heads never alter what the model computes. The KV cache may be
        given under either name (``past_key_values``, or ``cache`` from transformers 5.24 on)."""
        if past_key_values is not None:
            kwargs.update(cache_argument(past_key_values))
        return self.base(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            labels=labels,
            use_cache=use_cache,
            logits_to_keep=logits_to_keep,
            **kwargs,
        )

    def draft_logits(self, hidden_states: torch.Tensor, tokens: torch.LongTensor) -> torch.Tensor:
        """Teacher-forced head logits ``[n, num_heads, V]`` over the draft vocabulary (``self.heads.token_ids``
        maps indices to token ids) from base last hidden states ``[n, hidden]`` and the true tokens that
        follow each state, ``tokens`` ``[n, num_heads]`` (read only by drafters that condition on them)."""
        return self.heads(hidden_states, tokens)

    def set_draft_vocab(self, token_ids: torch.Tensor | None, trained: bool = False) -> None:
        """Let the heads draft among ``token_ids`` only (None: the whole vocabulary). Output is unchanged;
        drafting gets cheaper, and a token outside the set can no longer be drafted. ``trained`` records that
        the heads were trained over exactly these tokens (the trainer's ``train_vocab``); such heads refuse
        another vocabulary afterwards, since their other projection rows never learned anything."""
        if self.config.draft_vocab_trained:
            raise UserError(f"These heads were trained over their own {self.config.draft_vocab_size}-token draft "
                            "vocabulary (train --train-vocab); their rows outside it are untrained, so they keep "
                            "drafting among those tokens.")
        if trained and token_ids is None:
            raise UserError("trained=True names the vocabulary the heads were trained over: give its token ids.")
        self.heads.set_draft_vocab(token_ids)
        self.config.draft_vocab_size = None if token_ids is None else int(self.heads.draft_vocab.numel())
        self.config.draft_vocab_trained = trained

    # ----------------------------------------------------------------------------------------- generating
    @torch.no_grad()
    def generate(
        self,
        inputs: torch.Tensor | None = None,
        generation_config: GenerationConfig | None = None,
        logits_processor=None,
        stopping_criteria: StoppingCriteriaList | None = None,
        streamer=None,
        gate_threshold: float | None = UNSET,
        draft_tree: list[list[int]] | None = UNSET,
        dynamic_tree: dict | DynamicTree | None = UNSET,
        rescoring: dict | Rescoring | None = UNSET,
        typical_acceptance: TypicalAcceptance | bool = False,
        profile: bool = False,
        exit_confidence: float | None = None,
        strict: bool = False,
        packed_weights: bool | str | None = None,
        device_step: bool | None = None,
        calibrate: bool | None = None,
        **kwargs,
    ):
        """`generate()` with drafting; same arguments and results as the base's `generate()`.

        Greedy search and multinomial sampling (with any logits processors) are supported; beam search and assisted
        generation are refused. A batch's rows are decoded together where they can be, else one at a time and re-padded
        as the base pads them. Without overrides, the defaults `decoding_settings` decides (``generation_stats.
        calibration`` names the entry: stored, or fitted to this machine on first use), else the config's. Per call:

        - ``prompt_lookup_num_tokens``, ``max_matching_ngram_size`` (transformers' prompt-lookup settings): graft
          tokens copied from the context into each draft (default: the config's).
        - ``gate_threshold``: the entropy gate for this call (``None``/``inf``: always draft; ``0``/``-inf``: never).
        - ``draft_tree``: the tree of guesses to verify (Medusa-style list of paths; ``None``: the chain of every
          head's top-1); a call that names only ``draft_tree`` drafts that static tree.
        - ``dynamic_tree`` (``{"nodes", "depth", "top_k"}``, optionally Clover's per-node budget ``"top_p"`` and
          ``"min_ratio"``, or a `DynamicTree`; ``None``: off): each step's tree grown from the drafter's confidence.
        - ``rescoring`` (``{"nodes", "depth", "top_k", "candidates", "weight", "lm_weight"}`` or a `Rescoring`;
          ``None``: off): the tree grown from the guesses rescored by the n-gram model (``weight``, ``model.ngram``)
          and the small LM (``lm_weight``, ``model.rescorer``), `blocks.rescoring`.
        - ``exit_confidence``: the early exit of a drafter that drafts its own chain (Kangaroo).
        - ``typical_acceptance`` (True or a `TypicalAcceptance`): Medusa's typical acceptance for sampling, faster
          but NOT lossless.
        - ``strict=True``: every position's numbers bit-identical to a one-token forward's (`blocks.strict`), so bf16
          and fp16 output equals plain `generate()`'s token for token, at one attention call per verified position;
          drafts are cut to what this base's linear layers compute row-invariantly (``generation_stats.strict_rows``;
          1 means plain decoding). Needs sdpa attention and no sliding window.
        - ``packed_weights`` (default: on where it can be, a CPU in float32 or bfloat16, unless ``strict``; as
          calibrated): weights packed for oneDNN (`blocks.packed`); ``False``: off; ``"multi-row"``: one row as is.
        - ``device_step``: each step as one function of device buffers with one host read (`decoding.device_step`),
          in CUDA graphs on CUDA, where it is the default for greedy calls with a static tree; ``False``: off;
          ``True``: asked for elsewhere too (uncompiled).
        - ``profile=True``: each phase's wall time in ``generation_stats.phase_seconds`` (`blocks.profiling`).
        - ``calibrate=False`` (or ``CERBERUS_HF_CALIBRATE=0``): no calibration on first use (`calibration.first_use`).
        """
        started = time.perf_counter()
        # Read the call's effective settings without changing what is passed on: generate() treats an
        # explicit None in kwargs (e.g. eos_token_id=None) differently from an unset field.
        effective = copy.deepcopy(generation_config if generation_config is not None else self.generation_config)
        refuse_unsupported(effective, effective.update(**kwargs))
        overrides = dict(gate_threshold=gate_threshold, draft_tree=draft_tree, dynamic_tree=dynamic_tree,
                         rescoring=rescoring, exit_confidence=exit_confidence, typical=typical_acceptance)
        settings_selection.check_overrides(self.config, overrides)  # before anything is measured or decoded
        decoding = self.decoding_view(strict, packed_weights, calibrate)  # checked before anything runs
        settings = settings_selection.call_settings(self, effective, strict, calibrate, **overrides)
        stopping_criteria = call_stopping_criteria(effective, stopping_criteria, kwargs)
        input_ids = inputs if inputs is not None else kwargs.pop("input_ids", None)
        rows = call_rows(input_ids, kwargs.pop("attention_mask", None), effective, streamer)
        path = choose_path(self.base, decoding.heads, settings, effective, len(rows), device_step,  # `decoding.paths`
                           host_work(streamer, logits_processor, stopping_criteria, profile))
        if path.together and draft_tree is UNSET and dynamic_tree is UNSET and rescoring is UNSET:
            settings = shared_budget(settings, len(rows))  # the stored tree was sized for one row
        stats = GenerationStats(calibration=settings.calibration, strict_rows=settings.strict_rows)
        profiler = StepProfiler(self.device) if profile else None
        decode = path_decoding(self, decoding.heads, decoding._proposer, path, settings, streamer, stats, profiler)
        kwargs.update(logits_processor=logits_processor, stopping_criteria=stopping_criteria, custom_generate=decode)
        output = run_base(decoding.base, self.generation_config, input_ids, rows, path.together, effective,
                          generation_config, streamer, kwargs)
        if profiler is not None:
            stats.phase_seconds = profiler.close(time.perf_counter() - started)
        self.generation_stats = stats
        return output if isinstance(output, torch.Tensor) else CerberusGenerateOutput(**output, generation_stats=stats)

    @property
    def generation_stats(self) -> GenerationStats | None:
        """The `GenerationStats` of this thread's latest `generate()` call on this model (None before one).
        Each thread sees its own calls' statistics; ``return_dict_in_generate=True`` returns them with the output
        (``output.generation_stats``) too, which also serves a caller that hands calls to other threads."""
        return getattr(_thread_stats, "by_model", {}).get(self)

    @generation_stats.setter
    def generation_stats(self, stats: GenerationStats | None) -> None:
        if not hasattr(_thread_stats, "by_model"):
            _thread_stats.by_model = weakref.WeakKeyDictionary()
        _thread_stats.by_model[self] = stats

    def has_rescorers(self, rescoring: dict | Rescoring | None) -> bool:
        """Whether this model has every rescorer the ``rescoring`` settings give a weight (None: False)."""
        return settings_selection.has_rescorers(self, rescoring)

    def decoding_view(self, strict: bool = False, packed_weights: bool | str | None = None,
                      calibrate: bool | None = None) -> "CerberusForCausalLM":
        """This model as `generate()` runs it with these arguments: packed weights and grouped attention where they
        apply (`settings_selection.decoding_view`); else the model itself. Calibration measures this view."""
        return settings_selection.decoding_view(self, strict, packed_weights, calibrate)

    def decoding_settings(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                          strict: bool = False, calibrate: bool | None = None) -> dict:
        """The settings a call on ``device`` in ``dtype`` (this model's when None) decodes with by default: the stored
        calibration entry for this machine, else the one fitted here on first use (``calibrate``: None follows
        ``CERBERUS_HF_CALIBRATE``), else the closest of the same instruction class, else the config's values; the
        entry's strict half with ``strict`` (`settings_selection.decoding_settings`)."""
        return settings_selection.decoding_settings(self, device, dtype, strict, calibrate)

    def _proposer(self, generation_config: GenerationConfig, settings: DecodingSettings,
                  stats: GenerationStats, profiler: StepProfiler | None = None) -> Proposer:
        rescoring = settings.rescoring is not None
        return Proposer(
            self.heads, settings, generation_config.max_length, stats, ngram=self.ngram if rescoring else None,
            rescorer=self.rescorer if rescoring else None, phase=phase_timer(profiler),
        )



@dataclass
class CerberusGenerateOutput(GenerateDecoderOnlyOutput):
    """`generate()`'s output with ``return_dict_in_generate=True``: the base's fields, plus the call's
    `GenerationStats`."""

    generation_stats: GenerationStats | None = None


def _read_positions(path: str, name: str, config: CerberusConfig, hub_kwargs: dict) -> PositionStatistics | None:
    """The calibration positions stored as ``name`` in ``path`` (a saved folder's, or an export's), or None."""
    positions_file = resolve_file(path, name, required=False, **hub_kwargs)
    if positions_file is None:
        return None
    return PositionStatistics.load(positions_file, config.num_heads, DRAFTER_CLASSES[config.head_type].drafts_chains)
