"""What one `generate()` call decodes with, selected in one place for `CerberusForCausalLM`.

* **the defaults** (`decoding_settings`): a calibration entry stored for this device, dtype and processor, else the
  entry fitted to this machine on first use (`calibration.first_use`), else the closest stored entry of the same
  instruction class, else the config's values;
* **a call's settings** (`call_settings`): the call's arguments over those defaults (a malformed one refused before
  anything is measured, `check_overrides`), checked against the rescorers the model has (`has_rescorers`,
  `check_rescorers`) and cut to plain decoding where strict verification can verify no draft;
* **the weights it runs through** (`decoding_view`): packed for oneDNN where the entry used did not find the
  unpacked layers faster, and attention that groups query heads on a CPU.

The functions take the model (a `CerberusForCausalLM`) and read it; users, the bench and calibration call them
through the model's methods of the same names (`decoding_settings`, `decoding_view`, `has_rescorers`), and
`generate()` calls the rest. The module sits beside the model, above `calibration`, because selecting the defaults
may calibrate this machine on first use.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from transformers import GenerationConfig, PretrainedConfig, PreTrainedModel
from transformers.utils import logging

from .blocks.gate import EntropyGate
from .blocks.grouped_attention import grouped_attention_view
from .blocks.lookup import DEFAULT_MAX_NGRAM
from .blocks.ngram import NGRAM_COMMAND, NGRAM_WEIGHTS_NAME
from .blocks.packed import ONE_ROW_AS_IS, packed_views, packing_available, packing_unavailable_reason
from .blocks.rescoring import Rescoring
from .blocks.settings import DecodingSettings, resolve_settings, stored_settings
from .blocks.strict import MAX_STRICT_ROWS, check_strict_support, row_invariant_rows
from .calibration.first_use import MEASURED, first_use_enabled, machine_entry
from .errors import UserError
from .hardware import HardwareKey, calibrate_command, note_borrowed, note_no_entry, select_calibration
from .module_views import module_view

logger = logging.get_logger(__name__)


def decoding_settings(model: PreTrainedModel, device: torch.device | str | None = None,
                      dtype: torch.dtype | None = None, strict: bool = False, calibrate: bool | None = None) -> dict:
    """Gate threshold, gate signal, draft tree (static, dynamic or rescored), prompt lookup and packing used by
    default on a device and dtype (``model``'s when None), decided here for every caller: what calibration
    stored in ``generation_config.cerberus_calibration`` for this device, dtype and processor; else the entry
    fitted to this machine from the checkpoint's calibration positions (`calibration.first_use`: from the
    user's cache, or measured now where no stored entry serves this machine and it is the model's device and
    dtype; ``"calibration"`` then ends in ``" (measured here)"``) unless ``calibrate`` is False (None: as
    ``CERBERUS_HF_CALIBRATE`` says, on by default); else the closest stored entry of the same instruction class
    (`hardware.select_calibration`; ``"calibration"`` names the entry used, and one line says so: an entry of
    another processor of the class decoded within 2.5% of one measured here on every shipped family, so first use
    does not measure over it, docs/calibration.md); else the config's values. ``strict``: for
    ``generate(strict=True)``, the entry's strict settings (`calibrate --strict`) where it has them
    (``"calibration"`` then ends in ``" (strict)"``)."""
    device = torch.device(device) if device is not None else model.device
    dtype = dtype or model.base.dtype
    wanted = HardwareKey.of(device, dtype)
    calibrated = getattr(model.generation_config, "cerberus_calibration", None)
    command = calibrate_command(wanted, model.name_or_path or None, model.calibration_statistics is not None)
    key, stored = select_calibration(calibrated, wanted)
    if key != str(wanted) and model.calibration_statistics is not None and first_use_enabled(calibrate):
        measured = machine_entry(model, wanted, measure=key is None and device == model.device
                                 and dtype == model.base.dtype)
        if measured is not None:
            key, stored = f"{wanted}{MEASURED}", measured
    if key is None:
        note_no_entry(calibrated, wanted, command)
    elif not key.endswith(MEASURED) and HardwareKey.parse(key) != wanted:
        note_borrowed(key, wanted, command)
    if strict and "strict" in stored:
        key, stored = f"{key} (strict)", stored["strict"]
    return stored_settings(stored, model.config, key)


def check_overrides(config: PretrainedConfig, overrides: dict) -> None:
    """Refuse a malformed settings argument of a call (``overrides``, as `call_settings` takes them), checked over the
    config's defaults first: it fails before anything is measured (first use, `decoding_settings`) or decoded."""
    resolve_settings(stored_settings({}, config), config.num_heads, **overrides)


def call_settings(model: PreTrainedModel, effective: GenerationConfig, strict: bool, calibrate: bool | None,
                  **overrides) -> DecodingSettings:
    """A call's decoding settings: the call's ``overrides``, else the calibration for this device, dtype and
    processor, else the config's; each prompt-lookup setting on its own (the call's or its generation config's,
    else the heads'). Under strict verification that can verify no draft strictly, plain decoding."""
    if strict:
        check_strict_support(model.base)
    settings = resolve_settings(
        model.decoding_settings(strict=strict, calibrate=calibrate), model.config.num_heads, **overrides,
        lookup_tokens=effective.prompt_lookup_num_tokens,
        lookup_ngram=effective.max_matching_ngram_size or model.config.max_matching_ngram_size or DEFAULT_MAX_NGRAM,
        has_rescorers=model.has_rescorers,
    )
    check_rescorers(model, settings.rescoring)
    if not strict:
        return settings
    # measured only as tall as this call verifies: the measurement's cost grows with the square of its height
    limit = max(2, min(settings.most_positions(model.config.num_heads), MAX_STRICT_ROWS))
    settings = replace(settings, strict_rows=row_invariant_rows(model.base, limit))
    if settings.strict_rows == 1:
        logger.warning_once(
            f"cerberus-hf: strict=True: this base's linear layers in {model.base.dtype} on {model.device} give "
            "a row computed in a batch other bits than the row alone, so no draft can be verified strictly "
            "and decoding is plain."
        )
        settings = replace(settings, gate=EntropyGate(0.0, settings.gate.signal), lookup_tokens=0)
    return settings


def has_rescorers(model: PreTrainedModel, rescoring: dict | Rescoring | None) -> bool:
    """Whether ``model`` has every rescorer the ``rescoring`` settings give a weight (None: False)."""
    if rescoring is None:
        return False
    settings = Rescoring(**rescoring) if isinstance(rescoring, dict) else rescoring
    return (settings.weight == 0 or model.ngram is not None) and (settings.lm_weight == 0 or
                                                                  model.rescorer is not None)


def check_rescorers(model: PreTrainedModel, rescoring: Rescoring | None) -> None:
    """Refuse rescoring that weighs a rescorer ``model`` does not have, saying how to get it."""
    if rescoring is not None and rescoring.weight > 0 and model.ngram is None:
        raise UserError(f"rescoring with an n-gram weight needs an n-gram model next to the heads "
                        f"({NGRAM_WEIGHTS_NAME}): build one with `{NGRAM_COMMAND}`, or load it with "
                        "model.load_ngram(path).")
    if rescoring is not None and rescoring.lm_weight > 0 and model.rescorer is None:
        raise UserError("rescoring with an lm_weight needs a neural rescorer next to the heads (rescorer/): load "
                        "a Kangaroo checkpoint for this base with model.load_rescorer(folder).")


def decoding_view(model: PreTrainedModel, strict: bool = False, packed_weights: bool | str | None = None,
                  calibrate: bool | None = None) -> PreTrainedModel:
    """``model`` as `generate()` runs it with these arguments: a view (`module_views`) whose base and drafter
    compute through packed weights (`blocks.packed`) where ``packed_weights`` asks for them (`ONE_ROW_AS_IS`: one
    row through the weight as it is) or, when None, where packing can apply, ``strict`` is off and the calibration
    entry used (`decoding_settings`, ``calibrate`` as there) did not find the unpacked layers faster (one row as it
    is where the entry says `ONE_ROW_AS_IS`), and whose attention on a CPU groups query heads without copying the
    cache (`blocks.grouped_attention`) unless ``strict``; else the model itself. Calibration measures this view, so
    its costs are decoding's."""
    if not (packed_weights is None or isinstance(packed_weights, bool) or packed_weights == ONE_ROW_AS_IS):
        raise UserError(f"packed_weights must be True, False, {ONE_ROW_AS_IS!r} (packed for several rows, one row "
                        f"through the weight as it is) or None, got {packed_weights!r}.")
    if packed_weights and strict:
        raise UserError("packed_weights=True cannot be combined with strict=True: strict verification relies on "
                        "how this base's own linear layers compute each row.")
    available = packing_available(model.device, model.base.dtype)
    unavailable = packing_unavailable_reason(model.device, model.base.dtype)
    if packed_weights is None and not strict:
        stored = model.decoding_settings(calibrate=calibrate)["packed_weights"]
        packed_weights = stored if available or not stored else None  # an entry's packing where nothing packs: none
    if packed_weights and not available:
        raise UserError(f"packed_weights=True needs a CPU, float32 or bfloat16 and oneDNN; this base is "
                        f"{model.base.dtype} on {model.device}" + (f", and {unavailable}." if unavailable else "."))
    if unavailable and packed_weights is None and not strict:
        logger.warning_once(f"cerberus-hf: linear layers run unpacked: {unavailable}.")
    base, heads = model.base, model.heads
    if packed_weights or (packed_weights is None and available and not strict):
        base, heads = packed_views(model.packed_weights, model.base, model.heads,
                                   one_row_as_is=packed_weights == ONE_ROW_AS_IS)
        heads = module_view(heads, linear=model.packed_weights.linear)  # the draft vocabulary's rows too
    if not strict:
        base = grouped_attention_view(base)
    if base is model.base and heads is model.heads:
        return model
    return module_view(model, {"base": base, "heads": heads})
