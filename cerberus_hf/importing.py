"""Drafters saved in other projects' layouts, loaded as this package's families, and the key maps `tools.export` writes
them with (so that an export and its import are each other's inverse).

`CerberusForCausalLM.from_pretrained(folder_or_hub_id, base_model=base)` sends a folder here once, at the start, when
its ``config.json`` is not a cerberus-hf config. What each layout holds, as the public code reads and writes it:

* **speculators EAGLE-3** (the ``speculators`` library, which vLLM and SGLang serve; what ``cerberus-hf export --format
  speculators`` writes): ``config.json`` with ``speculators_model_type: "eagle3"``, a Llama ``transformer_layer_config``,
  ``draft_vocab_size``, ``norm_before_residual``, ``eagle_aux_hidden_state_layer_ids`` and ``speculators_config``
  (the proposal's ``speculative_tokens``, the verifier's ``name_or_path``); ``model.safetensors`` with ``fc``,
  ``layers.0.*``, ``norm``, ``lm_head`` (the draft vocabulary's rows), ``d2t``, ``t2d`` and optionally ``embed_tokens``.
* **EAGLE's EAGLE-3** (SafeAILab/EAGLE, ``eagle/model/cnets.py``): a Llama-style ``config.json`` with
  ``draft_vocab_size`` (``LlamaForCausalLMEagle3``); ``model.safetensors`` with ``fc``, ``midlayer.*``, ``norm``,
  ``lm_head``, ``d2t``, ``t2d`` (absent when the draft vocabulary is the whole one) and optionally ``embed_tokens``.
  It fuses the states entering the base's layers 2, ``L // 2`` and ``L - 3`` (this family's default), or those a
  vLLM-style ``eagle_config.eagle_aux_hidden_state_layer_ids`` names; its rotary base is ``rope_theta`` (10000 when
  unset), its head width ``hidden_size // num_attention_heads``. It says neither the base nor the drafting depth:
  pass ``base_model=``, and ``num_heads=`` for a depth other than 4.
* **Medusa's** (FasterDecoding/Medusa): ``config.json`` with ``medusa_num_heads``, ``medusa_num_layers``,
  ``base_model_name_or_path``; ``medusa_lm_head.safetensors`` with ``{h}.{l}.linear.weight|bias`` (``x + SiLU(W x +
  b)``) and ``{h}.{num_layers}.weight`` (head ``h``'s ``lm_head``). Published configs sometimes name fewer heads than
  the file holds (Medusa's own loader then reads 5); the heads the file holds are loaded, and the line says so.
* **vLLM's Medusa** (what ``export --format vllm-medusa`` writes): ``model_type: medusa``, ``num_heads``,
  ``num_hidden_layers``, ``hidden_size``, ``vocab_size``, ``medusa_fc_bias`` (vLLM's default: false), optional
  ``truncated_vocab_size`` with a ``token_map`` tensor and ``original_lm_head`` (one ``lm_head`` for every head);
  ``model.safetensors`` with ``blocks.{h}.layers.{l}.weight|bias`` and ``lm_heads.{h}.weight``.
* **transformers' DFlash** (what its DFlash drafter model class saves, ``generate(assistant_model=...,
  speculation_type="dflash")`` runs): ``config.json`` with ``target_layer_ids``, ``block_size``, ``mask_token_id`` and
  the decoder's shape; ``model.safetensors`` with ``encoder.fc``, ``encoder.output_norm_enc``, ``layers.{i}.*``,
  ``norm``. **z-lab's DFlash** (z-lab/dflash): a Qwen3 ``config.json`` with ``block_size`` and ``dflash_config``
  (``target_layer_ids``, ``mask_token_id``); the same tensors with ``fc`` and ``hidden_norm`` for the encoder's. Both
  project through the base's ``lm_head`` and embed with its embedding, and say neither the base nor its vocabulary.

The mapping. EAGLE-3's decoder layer maps one to one onto `drafters.eagle3.FeatureLayer` (norm on the token embedding
as ``input_layernorm``, on the fused state as ``hidden_norm``), with the layout's MLP width, norm epsilon, rotary base
and ``norm_before_residual``; ``d2t`` gives the draft vocabulary (row ``i`` drafts token ``i + d2t[i]``; ``t2d`` must
agree). Medusa's residual blocks map onto `drafters.medusa.MedusaDrafter`'s. A projection equal to the base
``lm_head``'s rows (what an export of heads that project through it writes) becomes that again
(``head_projection="shared"``); any other is the drafter's own (``"own"``: EAGLE-3 one ``lm_head`` over its draft
vocabulary, Medusa one per head over the whole vocabulary, the base's rows outside a truncated one), and its draft
vocabulary is then fixed (``draft_vocab_trained``). A stored ``embed_tokens`` must be the base's input embedding, which
this family embeds with.

What an export carries for this library only (`tools.export`), read back here so that an export loads as the folder
it came from decodes: the decoding settings of that folder's config (prompt lookup, gate, trees) under the one key
``CARRIED_KEY`` of ``config.json``, which the engines' config classes keep as an unused attribute (vLLM's Medusa
config renames top-level keys holding ``num`` with ``heads`` or ``layers``: hence one key without them), and in the
subfolder ``CARRIED_FOLDER`` the n-gram rescorer, the calibration positions and the calibration entries
(``generation_config.json``'s ``cerberus_calibration``): a subfolder, because vLLM and SGLang load every top-level
``*.safetensors`` of a folder as its weights.

Refused in one line, before the base loads where the files alone show it: a pickled weight file (never unpickled), a
config that names no layout above, missing, unexpected or misshapen tensors, NaN weights, vocabulary maps out of range,
and what the families cannot run: more than one EAGLE-3 decoder layer, rotary scaling, ``norm_before_fc``, ``fc_norm``,
``norm_output``, a drafter narrower than its base (``target_hidden_size``), biases in EAGLE-3, a Medusa ``logit_scale``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import GenerationConfig
from transformers.utils import logging

from .base_model import check_base_compatible, load_base_model
from .blocks.ngram import NGRAM_WEIGHTS_NAME, NgramModel
from .checkpoint import load_heads_state_dict, refuse_pickles, resolve_file
from .configuration_cerberus import CerberusConfig
from .drafters import build_drafter
from .drafters.layers import llama_mlp_width
from .errors import UserError, check_int
from .loading import check_calibration, check_heads_state_dict

logger = logging.get_logger(__name__)

# The layouts, by the name their readers and `tools.export` use, as a message names them.
LAYOUTS = {"speculators": "speculators EAGLE-3", "eagle": "EAGLE's EAGLE-3", "medusa": "Medusa's",
           "vllm-medusa": "vLLM's Medusa", "transformers-dflash": "transformers' DFlash", "z-lab": "z-lab's DFlash"}

# EAGLE-3's decoder layer: this package's name of each tensor, and the Llama decoder layer's (under ``layers.0.`` in
# speculators' layout, ``midlayer.`` in EAGLE's).
EAGLE3_LAYER_KEYS = {
    "layer.embed_norm.weight": "input_layernorm.weight",
    "layer.hidden_norm.weight": "hidden_norm.weight",
    "layer.q_proj.weight": "self_attn.q_proj.weight",
    "layer.k_proj.weight": "self_attn.k_proj.weight",
    "layer.v_proj.weight": "self_attn.v_proj.weight",
    "layer.o_proj.weight": "self_attn.o_proj.weight",
    "layer.post_norm.weight": "post_attention_layernorm.weight",
    "layer.mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "layer.mlp.up_proj.weight": "mlp.up_proj.weight",
    "layer.mlp.down_proj.weight": "mlp.down_proj.weight",
}
EAGLE3_LAYER_PREFIXES = {"speculators": "layers.0.", "eagle": "midlayer."}

# What an export carries for this library beside what its engine reads (see the module docstring): the key of
# config.json holding the folder's decoding settings (those of `CARRIED_SETTINGS` that differ from the defaults), and
# the subfolder holding the n-gram rescorer, the calibration positions and the calibration entries.
CARRIED_KEY = "cerberus_hf"
CARRIED_FOLDER = "cerberus_hf"
CARRIED_SETTINGS = ("prompt_lookup_num_tokens", "max_matching_ngram_size", "gate_signal", "gate_threshold",
                    "draft_tree", "dynamic_tree")
CARRIED_GENERATION_CONFIG = "generation_config.json"
CARRIED_POSITIONS = f"{CARRIED_FOLDER}/calibration_positions.safetensors"  # `calibration.statistics.POSITIONS_NAME`


def carried_config(config: CerberusConfig) -> dict:
    """The ``config.json`` entry an export carries for ``config``'s folder: ``{CARRIED_KEY: {setting: value}}`` with
    each of `CARRIED_SETTINGS` that differs from the default (empty: nothing to carry)."""
    default = CerberusConfig()
    settings = {name: getattr(config, name) for name in CARRIED_SETTINGS
                if getattr(config, name) != getattr(default, name)}
    return {CARRIED_KEY: settings} if settings else {}


def eagle3_keys(layout: str) -> dict[str, str]:
    """The EAGLE-3 drafter's tensors but its projection: this package's name -> the name in ``layout``
    (``"speculators"`` or ``"eagle"``)."""
    prefix = EAGLE3_LAYER_PREFIXES[layout]
    return {"fc.weight": "fc.weight", **{ours: prefix + theirs for ours, theirs in EAGLE3_LAYER_KEYS.items()},
            "norm.weight": "norm.weight"}


DFLASH_LAYER_KEYS = ("input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
                     "mlp.up_proj.weight", "mlp.down_proj.weight")
DFLASH_ATTENTION_KEYS = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "q_norm.weight",
                         "k_norm.weight")


def dflash_keys(layout: str, num_layers: int) -> dict[str, str]:
    """A DFlash drafter's tensors: this package's name -> the name in ``layout`` (``"transformers-dflash"`` or
    ``"z-lab"``)."""
    encoder = ("encoder.fc.weight", "encoder.output_norm_enc.weight") if layout == "transformers-dflash" else (
        "fc.weight", "hidden_norm.weight")
    keys = {"fc.weight": encoder[0], "context_norm.weight": encoder[1], "norm.weight": "norm.weight"}
    for i in range(num_layers):
        keys.update({f"layers.{i}.{name}": f"layers.{i}.{name}" for name in DFLASH_LAYER_KEYS})
        keys.update({f"layers.{i}.{name}": f"layers.{i}.self_attn.{name}" for name in DFLASH_ATTENTION_KEYS})
    return keys


def transformers_dflash(model) -> nn.Module:
    """transformers' own DFlash drafter (its DFlash model class) with the weights of ``model``'s DFlash heads, on their
    device and dtype: what ``base.generate(assistant_model=..., speculation_type="dflash")`` runs, drafting what these
    heads draft (every layer attending to the whole context; over the whole vocabulary, where a draft vocabulary would
    restrict these heads)."""
    from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel

    heads = model.heads
    layer, count = heads.layers[0], len(heads.layers)
    config = MuseGlimmerAssistantConfig(
        hidden_size=heads.hidden_size, intermediate_size=layer.mlp.gate_proj.out_features, num_hidden_layers=count,
        num_attention_heads=layer.num_heads, num_key_value_heads=layer.kv_heads, head_dim=layer.head_dim,
        block_size=heads.num_heads + 1, mask_token_id=heads.mask_token_id,
        target_layer_ids=[i - 1 for i in heads.feature_layers], layer_types=["full_attention"] * count,
        rms_norm_eps=heads.norm.eps, rope_parameters={"rope_type": "default", "rope_theta": layer.rope_theta},
        vocab_size=heads.vocab_size, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    drafter = MuseGlimmerAssistantModel(config)
    state = heads.state_dict()
    drafter.load_state_dict({theirs: state[ours] for ours, theirs in dflash_keys("transformers-dflash", count).items()})
    return drafter.to(heads.fc.weight.device, heads.dtype).eval()


def medusa_keys(layout: str, num_heads: int, num_layers: int, bias: bool = True) -> dict[str, str]:
    """Medusa heads' residual blocks: this package's name -> the name in ``layout`` (``"medusa"``: FasterDecoding's,
    ``"vllm-medusa"``: vLLM's); without ``bias``, the weights only."""
    keys = {}
    for h in range(num_heads):
        for i in range(num_layers):
            for part in ("weight", "bias") if bias else ("weight",):
                keys[f"blocks.{h}.{i}.linear.{part}"] = (f"{h}.{i}.linear.{part}" if layout == "medusa"
                                                         else f"blocks.{h}.layers.{i}.{part}")
    return keys


def medusa_projection_key(layout: str, head: int, num_layers: int) -> str:
    """Head ``head``'s ``lm_head`` in ``layout`` (see `medusa_keys`)."""
    return f"{head}.{num_layers}.weight" if layout == "medusa" else f"lm_heads.{head}.weight"


@dataclass
class ForeignDrafter:
    """A drafter read from another project's layout and checked against that layout's config, before any base loads.

    ``tensors`` are the family's own (this package's names) but the projection; ``projections`` each head's
    projection rows (EAGLE-3: one), over ``draft_ids`` (each row's token id; None: the whole vocabulary in order)."""

    layout: str
    where: str
    options: dict
    tensors: dict[str, torch.Tensor]
    projections: list[torch.Tensor]
    draft_ids: torch.Tensor | None
    hidden_size: int
    vocab_size: int | None
    base_name: str | None = None
    embedding: torch.Tensor | None = None
    notes: list[str] = field(default_factory=list)


def foreign_config(path: str, hub_kwargs: dict) -> dict | None:
    """The ``config.json`` of the folder or Hub repo ``path`` when it is not a cerberus-hf config (None when it is
    one, or when there is none: the usual loading path names what is wrong then)."""
    file = resolve_file(path, "config.json", required=False, **hub_kwargs)
    if file is None:
        return None
    try:
        with open(file) as handle:
            raw = json.load(handle)
    except (OSError, ValueError):
        return None
    return None if not isinstance(raw, dict) or raw.get("model_type") == CerberusConfig.model_type else raw


def read_foreign(path: str, raw: dict, hub_kwargs: dict, num_heads: int | None = None) -> ForeignDrafter:
    """The drafter the folder ``path`` holds in the layout its config ``raw`` names, read and checked (see the module
    docstring); ``num_heads`` overrides the layout's drafting depth (EAGLE-3) or keeps its first heads (Medusa)."""
    where = os.path.join(path, "config.json")
    check_int("num_heads", num_heads, 1, optional=True)
    if "dflash_config" in raw or all(name in raw for name in ("target_layer_ids", "block_size", "mask_token_id")):
        reader = _read_dflash
    elif "speculators_model_type" in raw:
        reader = _read_speculators
    elif raw.get("model_type") == "medusa":
        reader = _read_vllm_medusa
    elif "medusa_num_heads" in raw:
        reader = _read_medusa
    elif "draft_vocab_size" in raw:
        reader = _read_eagle
    else:
        eagle = "eagle" in " ".join(map(str, raw.get("architectures") or [])).lower()
        kind = "an EAGLE-1/EAGLE-2 drafter: no draft_vocab_size" if eagle else f"model_type {raw.get('model_type')!r}"
        raise UserError(f"{where} names no drafter layout cerberus-hf loads ({kind}): expected a cerberus-hf folder or "
                        f"one of {', '.join(LAYOUTS.values())}.")
    foreign = reader(path, where, raw, hub_kwargs, num_heads)
    settings, notes = _carried_settings(raw, where)
    foreign.options.update(settings)
    foreign.notes.extend(notes)
    return foreign


def _carried_settings(raw: dict, where: str) -> tuple[dict, list[str]]:
    """(the decoding settings an export carried under `CARRIED_KEY`, notes on keys this version ignores)."""
    carried = raw.get(CARRIED_KEY)
    if carried is None:
        return {}, []
    if not isinstance(carried, dict):
        raise UserError(f"{where}: {CARRIED_KEY} must map decoding settings to values (what cerberus-hf export writes, "
                        f"e.g. {{\"prompt_lookup_num_tokens\": 5}}), got {carried!r}.")
    unknown = sorted(set(carried) - set(CARRIED_SETTINGS))
    notes = [f"{CARRIED_KEY} keys this version does not read ignored: {', '.join(unknown)}"] if unknown else []
    return {name: value for name, value in carried.items() if name in CARRIED_SETTINGS}, notes


def _carried_files(model: nn.Module, path: str, hub_kwargs: dict) -> list[str]:
    """Give ``model`` what an export carried in `CARRIED_FOLDER` of ``path`` (each file checked as a saved folder's
    is): the n-gram rescorer and the calibration entries; returns what it found, in words, the calibration positions
    included (which `CerberusForCausalLM.from_pretrained` reads: they are calibration's, a layer above this one)."""
    config, found = model.config, []
    ngram_file = resolve_file(path, f"{CARRIED_FOLDER}/{NGRAM_WEIGHTS_NAME}", required=False, **hub_kwargs)
    if ngram_file is not None:
        model.ngram = NgramModel.load(ngram_file, vocab_size=config.vocab_size)
        found.append("its n-gram rescorer")
    if resolve_file(path, CARRIED_POSITIONS, required=False, **hub_kwargs) is not None:
        found.append("its calibration positions")  # read by `CerberusForCausalLM.from_pretrained` (calibration's layer)
    generation_file = resolve_file(path, f"{CARRIED_FOLDER}/{CARRIED_GENERATION_CONFIG}", required=False, **hub_kwargs)
    if generation_file is not None:
        generation_config = GenerationConfig.from_pretrained(os.path.dirname(generation_file))
        check_calibration(generation_config, config, generation_file)
        entries = getattr(generation_config, "cerberus_calibration", None)
        if entries:  # the entries only: the rest of the generation config is the base's
            model.generation_config.cerberus_calibration = entries
            found.append(f"{len(entries)} calibration entr{'y' if len(entries) == 1 else 'ies'}")
    return found


def import_drafter(cls: type, path: str, raw: dict, base_model: nn.Module | None, hub_kwargs: dict, kwargs: dict
                   ) -> nn.Module:
    """A ``cls`` (`CerberusForCausalLM`) with the drafter the folder ``path`` holds in another layout (its config
    ``raw``), on ``base_model`` or the base the layout names (loaded with ``kwargs``); logs one line saying what it
    loaded."""
    foreign = read_foreign(path, raw, hub_kwargs, kwargs.pop("num_heads", None))
    if base_model is None:
        if not foreign.base_name:
            raise UserError(f"{foreign.where}: {LAYOUTS[foreign.layout]} layout names no base model: pass "
                            "base_model=<the base it drafts for>.")
        base_model = load_base_model(CerberusConfig(base_model_name_or_path=foreign.base_name), **kwargs)
    foreign.vocab_size = foreign.vocab_size or base_model.get_output_embeddings().weight.shape[0]
    check_base_compatible(CerberusConfig(hidden_size=foreign.hidden_size, vocab_size=foreign.vocab_size,
                                         base_model_name_or_path=foreign.base_name), base_model)
    _check_embedding(foreign, base_model)
    options, state = _projection(foreign, base_model.get_output_embeddings().weight.detach())
    options = {key: value for key, value in {**foreign.options, **options}.items() if value is not None}
    try:
        model = cls.from_base(base_model, **options)
    except ValueError as error:  # what only the base shows: its layers, its vocabulary
        raise UserError(f"{foreign.where}: {error}") from None
    state.update(foreign.tensors)
    check_heads_state_dict(model.config, state, foreign.where)
    model.heads.load_state_dict(state, strict=True)
    carried = [f"{name} {value}" for name, value in sorted(foreign.options.items())
               if name in CARRIED_SETTINGS and value is not None] + _carried_files(model, path, hub_kwargs)
    if carried:
        foreign.notes.insert(0, "with what cerberus-hf exported beside it: " + ", ".join(carried))
    logger.warning(f"cerberus-hf: loaded {path} ({LAYOUTS[foreign.layout]} layout) as {_described(model)}"
                   + "".join(f"; {note}" for note in foreign.notes) + ".")
    return model.eval()


# ------------------------------------------------------------------------------------------------ reading files
def _weights(path: str, filename: str, hub_kwargs: dict) -> tuple[str, dict[str, torch.Tensor]]:
    """(the file, its tensors) of the safetensors ``filename`` in ``path``; a pickle in its place is refused, unread."""
    file = resolve_file(path, filename, required=False, **hub_kwargs)
    if file is None:
        refuse_pickles(path, filename, **hub_kwargs)
        raise FileNotFoundError(f"no {filename} in {path}")
    return file, load_heads_state_dict(file)


def _field(raw: dict, name: str, where: str, default=None, kind: type = int):
    """``raw[name]`` (``default`` when absent and not None), refused in one line when missing or not a ``kind``."""
    value = raw.get(name, default)
    if value is None:
        raise UserError(f"{where} has no {name}.")
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, (int, float) if kind is float else kind):
        raise UserError(f"{where}: {name} must be {'a number' if kind is float else kind.__name__}, got {value!r}.")
    if kind in (int, float) and value <= 0:
        raise UserError(f"{where}: {name} must be > 0, got {value!r}.")
    return value


def _take(where: str, tensors: dict[str, torch.Tensor], names: dict[str, str], optional: dict[str, str] | None = None
          ) -> dict[str, torch.Tensor]:
    """The tensors ``names`` and, where present, ``optional`` list (this package's name -> the file's), under this
    package's names; a missing or unexpected name is refused, naming up to five."""
    optional = optional or {}
    wanted = {**names, **optional}
    problems = [f"missing {theirs}" for theirs in names.values() if theirs not in tensors]
    problems += [f"unexpected {name}" for name in tensors if name not in wanted.values()]
    _refuse(where, problems)
    return {ours: tensors[theirs] for ours, theirs in wanted.items() if theirs in tensors}


def _check(where: str, got: dict[str, torch.Tensor], expected: dict[str, tuple[tuple, str]], names: dict[str, str]
           ) -> None:
    """Refuse tensors of another shape or kind (``"float"``, ``"int"``, ``"bool"``) than ``expected`` (by this
    package's name; ``names`` gives the file's), and NaN or infinite weights."""
    problems = []
    for ours, tensor in got.items():
        if ours not in expected:
            continue
        shape, kind = expected[ours]
        theirs = names.get(ours, ours)
        actual = "bool" if tensor.dtype == torch.bool else "float" if tensor.is_floating_point() else "int"
        if tuple(tensor.shape) != tuple(shape):
            problems.append(f"{theirs} has shape {tuple(tensor.shape)}, its config implies {tuple(shape)}")
        elif actual != kind:
            problems.append(f"{theirs} is {str(tensor.dtype).removeprefix('torch.')}, its config implies {kind} values")
        elif kind == "float" and not bool(torch.isfinite(tensor).all()):
            problems.append(f"{theirs} holds NaN or infinite values")
    _refuse(where, problems)


def _refuse(where: str, problems: list[str]) -> None:
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise UserError(f"{where} does not match its config: {shown}.")


def _family_shapes(file: str, options: dict, hidden: int, vocab: int) -> dict[str, tuple[tuple, str]]:
    """The shape and kind of each tensor of the drafter ``options`` describe (built on the meta device); options the
    family refuses are refused naming the config beside ``file``."""
    try:
        config = CerberusConfig(hidden_size=hidden, vocab_size=vocab,
                                **{k: v for k, v in options.items() if v is not None})
        with torch.device("meta"):
            state = build_drafter(config).state_dict()
    except ValueError as error:
        raise UserError(f"{os.path.join(os.path.dirname(file), 'config.json')}: {error}") from None
    return {name: (tuple(t.shape), "float") for name, t in state.items() if t.is_floating_point()}


# ------------------------------------------------------------------------------------------------ EAGLE-3
def _eagle3_layer(layer: dict, where: str, raw: dict) -> tuple[dict, int, int]:
    """(the EAGLE-3 family's options, hidden size, vocabulary size) from a Llama decoder layer's config ``layer``
    (``raw``: the whole config, for the drafter's own fields); refuses what the family cannot run."""
    hidden, vocab = _field(layer, "hidden_size", where), _field(layer, "vocab_size", where)
    heads = _field(layer, "num_attention_heads", where)
    layers = _field(layer, "num_hidden_layers", where, 1)
    rope = layer.get("rope_parameters") or layer.get("rope_scaling") or {}
    rope = rope if isinstance(rope, dict) else {"rope_type": rope}
    kind = rope.get("rope_type", rope.get("type", "default"))
    problems = [f"{layers} decoder layers (cerberus-hf's EAGLE-3 has one)"] if layers != 1 else []
    problems += [f"rotary scaling {kind!r}"] if kind != "default" else []
    problems += [f"{name}: true" for name in ("attention_bias", "mlp_bias", "norm_before_fc", "fc_norm", "norm_output")
                 if layer.get(name) or raw.get(name)]
    problems += [f"hidden_act {layer['hidden_act']!r}"] if layer.get("hidden_act", "silu") != "silu" else []
    if raw.get("target_hidden_size") not in (None, hidden):
        problems.append(f"target_hidden_size {raw['target_hidden_size']} (a drafter narrower than its base)")
    if problems:
        raise UserError(f"{where}: this EAGLE-3 drafter has {', '.join(problems)}, which cerberus-hf's EAGLE-3 "
                        "cannot run.")
    theta = _field({**layer, **rope}, "rope_theta", where, 10000.0, float)
    eps = _field(layer, "rms_norm_eps", where, 1e-6, float)
    width = _field(layer, "intermediate_size", where)
    head_dim = layer.get("head_dim") or hidden // heads
    return {"head_type": "eagle3", "adapter_heads": heads, "adapter_head_dim": head_dim,
            "adapter_kv_heads": _field(layer, "num_key_value_heads", where, heads),
            "intermediate_size": None if width == llama_mlp_width(hidden) else width,
            "rms_norm_eps": None if eps == 1e-6 else float(eps),
            "rope_theta": None if theta == 10000.0 else float(theta),
            "norm_before_residual": bool(raw.get("norm_before_residual", False))}, hidden, vocab


def _read_speculators(path: str, where: str, raw: dict, hub_kwargs: dict, num_heads: int | None) -> ForeignDrafter:
    if raw["speculators_model_type"] != "eagle3":
        raise UserError(f"{where}: speculators {raw['speculators_model_type']!r} drafters are not a layout cerberus-hf "
                        "loads (of speculators' layouts, eagle3).")
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict) or layer.get("model_type", "llama") != "llama":
        raise UserError(f"{where}: transformer_layer_config must describe a llama decoder layer, got "
                        f"{layer.get('model_type') if isinstance(layer, dict) else layer!r}.")
    options, hidden, vocab = _eagle3_layer(layer, where, raw)
    speculators = raw.get("speculators_config") or {}
    proposals = speculators.get("proposal_methods") or [{}]
    options["num_heads"] = num_heads or _field(proposals[0], "speculative_tokens", where, 3)
    options["feature_layers"] = raw.get("eagle_aux_hidden_state_layer_ids")
    base = (speculators.get("verifier") or {}).get("name_or_path")
    draft = _field(raw, "draft_vocab_size", where, vocab)
    return _eagle3_drafter("speculators", path, hub_kwargs, options, (hidden, vocab, draft), base)


def _read_eagle(path: str, where: str, raw: dict, hub_kwargs: dict, num_heads: int | None) -> ForeignDrafter:
    options, hidden, vocab = _eagle3_layer(raw, where, raw)
    options["num_heads"] = num_heads or 4
    options["feature_layers"] = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    foreign = _eagle3_drafter("eagle", path, hub_kwargs, options, (hidden, vocab, _field(raw, "draft_vocab_size", where)),
                              None)
    if num_heads is None:
        foreign.notes.append("drafting 4 deep (EAGLE's layout does not say; pass num_heads= for another depth)")
    return foreign


def _eagle3_drafter(layout: str, path: str, hub_kwargs: dict, options: dict, sizes: tuple[int, int, int],
                    base: str | None) -> ForeignDrafter:
    """The EAGLE-3 drafter in ``layout``'s ``model.safetensors``, checked against ``options`` and ``sizes`` (hidden,
    vocabulary and draft vocabulary sizes)."""
    hidden, vocab, draft = sizes
    file, tensors = _weights(path, "model.safetensors", hub_kwargs)
    names = eagle3_keys(layout)
    extra = {"lm_head": "lm_head.weight"}
    optional = {"d2t": "d2t", "t2d": "t2d", "embedding": "embed_tokens.weight"}
    got = _take(file, tensors, {**names, **extra}, optional)
    expected = _family_shapes(file, options, hidden, vocab)
    expected.update(lm_head=((draft, hidden), "float"), d2t=((draft,), "int"), t2d=((vocab,), "bool"),
                    embedding=((vocab, hidden), "float"))
    _check(file, got, expected, {**names, **extra, **optional})
    projection, ids = got.pop("lm_head"), _eagle3_ids(file, got.pop("d2t", None), got.pop("t2d", None), vocab, draft)
    if ids is not None and ids.numel() == vocab:  # the whole vocabulary, permuted: its rows in token order
        projection, ids = projection[torch.argsort(ids)], None
    embedding = got.pop("embedding", None)
    return ForeignDrafter(layout, file, options, got, [projection], ids, hidden, vocab, base, embedding)


def _eagle3_ids(where: str, d2t: torch.Tensor | None, t2d: torch.Tensor | None, vocab: int, draft: int
                ) -> torch.Tensor | None:
    """Each draft index's token id (``index + d2t[index]``), checked against ``t2d``; None without ``d2t`` (then the
    draft vocabulary must be the whole one)."""
    if d2t is None:
        if draft != vocab:
            raise UserError(f"{where} has no d2t, which a draft vocabulary of {draft} of {vocab} tokens needs.")
        return None
    ids = _token_ids(where, torch.arange(draft) + d2t.long().cpu(), vocab, "d2t")
    if t2d is not None and not torch.equal(t2d.cpu().nonzero()[:, 0], torch.sort(ids).values):
        raise UserError(f"{where}: t2d marks other token ids ({int(t2d.sum())} of them) than d2t maps to.")
    return ids


def _token_ids(where: str, ids: torch.Tensor, vocab: int, name: str) -> torch.Tensor:
    """``ids`` (a draft vocabulary's token ids, from the tensor ``name``) when each is in [0, ``vocab``) and none
    repeats."""
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise UserError(f"{where}: {name} maps draft tokens to ids outside [0, {vocab}) (from {int(ids.min())} to "
                        f"{int(ids.max())}).")
    if ids.unique().numel() != ids.numel():
        raise UserError(f"{where}: {name} maps {ids.numel() - ids.unique().numel()} draft tokens to an id another "
                        "one has.")
    return ids


# ------------------------------------------------------------------------------------------------ DFlash
def _read_dflash(path: str, where: str, raw: dict, hub_kwargs: dict, num_heads: int | None) -> ForeignDrafter:
    layout = "z-lab" if "dflash_config" in raw else "transformers-dflash"
    own = raw.get("dflash_config") if layout == "z-lab" else raw
    if not isinstance(own, dict):
        raise UserError(f"{where}: dflash_config must be an object, got {own!r}.")
    layers = own.get("target_layer_ids")
    if not isinstance(layers, list) or not layers or any(isinstance(i, bool) or not isinstance(i, int) or i < 0
                                                         for i in layers):
        raise UserError(f"{where}: target_layer_ids must be a list of layer ids >= 0, got {layers!r}.")
    hidden, heads = _field(raw, "hidden_size", where), _field(raw, "num_attention_heads", where)
    count = _field(raw, "num_hidden_layers", where)
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope = rope if isinstance(rope, dict) else {"rope_type": rope}
    problems = [f"rotary scaling {rope.get('rope_type', rope.get('type'))!r}"] if rope.get(
        "rope_type", rope.get("type", "default")) != "default" else []
    problems += [f"{name}: true" for name in ("attention_bias", "mlp_bias") if raw.get(name)]
    problems += [f"hidden_act {raw['hidden_act']!r}"] if raw.get("hidden_act", "silu") != "silu" else []
    if problems:
        raise UserError(f"{where}: this DFlash drafter has {', '.join(problems)}, which cerberus-hf's DFlash cannot run.")
    options = {"head_type": "dflash", "num_layers": count, "adapter_heads": heads,
               "adapter_head_dim": raw.get("head_dim") or hidden // heads,
               "adapter_kv_heads": _field(raw, "num_key_value_heads", where, heads),
               "intermediate_size": _field(raw, "intermediate_size", where),
               "rms_norm_eps": float(_field(raw, "rms_norm_eps", where, 1e-6, float)),
               "rope_theta": float(_field({**raw, **rope}, "rope_theta", where, 10000.0, float)),
               "feature_layers": [i + 1 for i in layers],
               "mask_token_id": _field(own, "mask_token_id", where, kind=int),
               "num_heads": num_heads or _field(raw, "block_size", where) - 1}
    if options["num_heads"] < 1:
        raise UserError(f"{where}: block_size must be at least 2 (the newest token and one mask), got "
                        f"{raw['block_size']!r}.")
    file, tensors = _weights(path, "model.safetensors", hub_kwargs)
    names = dflash_keys(layout, count)
    got = _take(file, tensors, names)
    vocab = raw.get("vocab_size") if isinstance(raw.get("vocab_size"), int) else None
    _check(file, got, _family_shapes(file, options, hidden, vocab or options["mask_token_id"] + 1), names)
    windowed = "sliding_attention" in (raw.get("layer_types") or []) or raw.get("use_sliding_window")
    notes = [f"its sliding window ({raw.get('sliding_window')} positions) is not kept: every layer reads the whole "
             "context"] if windowed else []
    return ForeignDrafter(layout, file, options, got, [], None, hidden, vocab, notes=notes)


# ------------------------------------------------------------------------------------------------ Medusa
def _read_medusa(path: str, where: str, raw: dict, hub_kwargs: dict, num_heads: int | None) -> ForeignDrafter:
    layers = _field(raw, "medusa_num_layers", where, 1)
    said = _field(raw, "medusa_num_heads", where)
    file, tensors = _weights(path, "medusa_lm_head.safetensors", hub_kwargs)
    held = 1 + max((int(name.split(".")[0]) for name in tensors if name.split(".")[0].isdigit()), default=-1)
    count = max(said, held)
    notes = [f"{where} names {said} heads and the file holds {held}, as Medusa's own loader reads them"] if (
        held > said) else []
    foreign = _medusa_drafter("medusa", file, tensors, (count, layers, True), (None, None), num_heads, False)
    foreign.base_name, foreign.notes = raw.get("base_model_name_or_path"), notes
    return foreign


def _read_vllm_medusa(path: str, where: str, raw: dict, hub_kwargs: dict, num_heads: int | None) -> ForeignDrafter:
    count = _field(raw, "num_heads", where, raw.get("medusa_num_heads"))
    layers = _field(raw, "num_hidden_layers", where, raw.get("medusa_num_layers", 1))
    hidden, vocab = _field(raw, "hidden_size", where), _field(raw, "vocab_size", where)
    if raw.get("logit_scale", 1.0) != 1.0:
        raise UserError(f"{where}: logit_scale {raw['logit_scale']!r} scales the drafts' distributions, which "
                        "cerberus-hf's Medusa does not.")
    truncated = _field(raw, "truncated_vocab_size", where, vocab)
    bias = raw.get("medusa_fc_bias", False)
    file, tensors = _weights(path, "model.safetensors", hub_kwargs)
    tensors = {name.removeprefix("medusa_heads."): t for name, t in tensors.items()}
    if not bias and any(name.endswith(".bias") for name in tensors):
        raise UserError(f"{file} holds biases but {where} says medusa_fc_bias: false (vLLM would skip them): set "
                        "medusa_fc_bias: true if they are the heads'.")
    shared = bool(raw.get("original_lm_head", False))
    foreign = _medusa_drafter("vllm-medusa", file, tensors, (count, layers, bias), (hidden, truncated), num_heads,
                              shared, vocab)
    foreign.base_name = raw.get("base_model_name_or_path")
    return foreign


def _medusa_drafter(layout: str, file: str, tensors: dict[str, torch.Tensor], shape: tuple[int, int, bool],
                    sizes: tuple[int | None, int | None], num_heads: int | None, one_lm_head: bool,
                    vocab: int | None = None) -> ForeignDrafter:
    """Medusa heads in ``layout`` (``shape``: heads, layers each, biases), checked; ``sizes``: (hidden size, rows of
    each projection) where the config says them (else read from the file); ``one_lm_head``: vLLM's
    ``original_lm_head``. ``num_heads`` keeps the first heads only."""
    count, layers, bias = shape
    names = medusa_keys(layout, count, layers, bias)
    projections = {"lm_head": "lm_head.weight"} if one_lm_head else {
        f"lm_head.{h}": medusa_projection_key(layout, h, layers) for h in range(count)}
    token_map = {"token_map": "token_map"} if layout == "vllm-medusa" else {}
    required = token_map if vocab != sizes[1] else {}
    got = _take(file, tensors, {**names, **projections, **required}, token_map)
    first = got["lm_head" if one_lm_head else "lm_head.0"]
    hidden, rows = sizes[0] or first.shape[-1], sizes[1] or first.shape[0]
    vocab = vocab or rows
    options = {"head_type": "medusa", "num_heads": count, "num_layers": layers}
    expected = _family_shapes(file, options, hidden, vocab)
    expected.update({name: ((rows, hidden), "float") for name in projections}, token_map=((rows,), "int"))
    _check(file, got, expected, {**names, **projections, **token_map})
    ids = _token_ids(file, got.pop("token_map").long().cpu(), vocab, "token_map") if "token_map" in got else None
    heads = [got.pop("lm_head")] * count if one_lm_head else [got.pop(f"lm_head.{h}") for h in range(count)]
    if ids is not None and ids.numel() == vocab:  # the whole vocabulary, permuted: its rows in token order
        heads, ids = [p[torch.argsort(ids)] for p in heads], None
    if not bias:  # vLLM's blocks without biases: this family's, with zero ones
        got.update({name.replace(".weight", ".bias"): torch.zeros(hidden, dtype=got[name].dtype) for name in names})
    if num_heads is not None:
        if num_heads > count:
            raise UserError(f"num_heads={num_heads}, but {file} holds {count} Medusa heads.")
        got = {name: t for name, t in got.items() if int(name.split(".")[1]) < num_heads}
        heads, options["num_heads"] = heads[:num_heads], num_heads
    return ForeignDrafter(layout, file, options, got, heads, ids, hidden, vocab)


# ------------------------------------------------------------------------------------------------ onto the base
def _projection(foreign: ForeignDrafter, lm_weight: torch.Tensor) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config options, state-dict entries) of the drafter's projection and draft vocabulary on a base whose
    ``lm_head`` weight is ``lm_weight``: the base's own where every projection equals its rows, else the drafter's."""
    ids = foreign.draft_ids
    rows = lm_weight if ids is None else lm_weight[ids.to(lm_weight.device)]
    options: dict = {"draft_vocab_size": None if ids is None else int(ids.numel())}
    state = {} if ids is None else {"draft_vocab": ids}
    if all(torch.equal(p.to(rows.device), rows.to(p.dtype)) for p in foreign.projections):
        return {**options, "head_projection": "shared"}, state
    options.update(head_projection="own", draft_vocab_trained=ids is not None)
    if foreign.options["head_type"] == "eagle3":  # one lm_head, over the draft vocabulary (`Eagle3Drafter`)
        state["lm_heads.0.weight"] = foreign.projections[0]
        return options, state
    for h, projection in enumerate(foreign.projections):  # Medusa's: over the whole vocabulary, the base's rows beside
        whole = projection
        if ids is not None:
            whole = lm_weight.to("cpu", projection.dtype).clone()
            whole[ids] = projection
        state[f"lm_heads.{h}.weight"] = whole
    return options, state


def _check_embedding(foreign: ForeignDrafter, base: nn.Module) -> None:
    """Refuse a stored token embedding other than the base's input embedding, which this family embeds with."""
    if foreign.embedding is None:
        return
    mine = base.get_input_embeddings().weight.detach()
    if mine.shape != foreign.embedding.shape or not torch.equal(foreign.embedding.to(mine.device),
                                                                mine.to(foreign.embedding.dtype)):
        raise UserError(f"{foreign.where}: embed_tokens is not this base's input embedding, which cerberus-hf's "
                        "EAGLE-3 embeds tokens with (a drafter made for another base, or with an embedding of its own).")


def _described(model) -> str:
    """What a loaded drafter is, in a few words: family, heads, layers read, draft vocabulary, projection."""
    config, heads = model.config, model.heads
    parts = [f"{config.head_type} heads: {config.num_heads} heads"]
    if config.head_type in ("eagle3", "dflash"):
        parts.append(f"fusing the states entering layers {list(heads.feature_layers)}")
    else:
        parts.append(f"{config.num_layers} residual block{'s' if config.num_layers > 1 else ''} each")
    if config.draft_vocab_size:
        parts.append(f"a {config.draft_vocab_size}-token draft vocabulary")
    parts.append("projecting through " + ("their own lm_head" if config.head_projection == "own"
                                          else "the base's lm_head"))
    return ", ".join(parts)
