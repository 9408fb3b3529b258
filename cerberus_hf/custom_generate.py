"""``base.generate(**inputs, custom_generate=<heads folder or Hub id>, trust_remote_code=True)``: transformers' own
convention for a decoding method kept in a repository, for a user who has the base loaded already.

A saved folder's ``custom_generate/generate.py`` (`remote_code`) imports `generate` from here. It wraps the base in a
`CerberusForCausalLM` that shares it (loading only the heads, their calibration and rescorers) and decodes with the
same arguments. The wrapper is built once per heads source, device and dtype and kept on the base itself, so a base
that is dropped frees its wrappers with it; building is serialised by a lock so threads share one wrapper.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

from torch import nn
from transformers import GenerationMixin

from .compat import custom_generate_source
from .errors import UserError
from .modeling_cerberus import CerberusForCausalLM

_WRAPPERS = "_cerberus_hf_wrappers"  # the attribute of the base that holds its wrappers
_LOCK = threading.Lock()
_GENERATE_PARAMETERS = frozenset(inspect.signature(GenerationMixin.generate).parameters) - {"self", "kwargs"}


def generate(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """Decode with the draft heads of the repository that ``custom_generate`` names, on ``model`` (the base).

    transformers passes every argument of ``generate()``, unset ones as None; those are dropped so that the wrapper
    fills them as the base's ``generate()`` would. With no ``generation_config``, the base's own is used, so the
    output is what the same call without ``custom_generate`` returns."""
    source = custom_generate_source()
    if source is None:
        raise UserError(
            "cerberus_hf.custom_generate.generate runs from base.generate(..., custom_generate=<heads folder or Hub "
            "id>, trust_remote_code=True); to decode with heads directly, use CerberusForCausalLM.from_pretrained."
        )
    arguments = {k: v for k, v in kwargs.items() if not (v is None and k in _GENERATE_PARAMETERS)}
    arguments.setdefault("generation_config", model.generation_config)
    return heads_for(model, source).generate(*args, **arguments)


def heads_for(model: nn.Module, source: str) -> CerberusForCausalLM:
    """The `CerberusForCausalLM` of the heads at ``source`` around ``model``, built on first use for the base's
    current device and dtype."""
    weight = model.get_output_embeddings().weight
    key = (source, weight.device, weight.dtype)
    wrappers = model.__dict__.get(_WRAPPERS, {})
    if key not in wrappers:
        with _LOCK:
            wrappers = model.__dict__.setdefault(_WRAPPERS, {})
            if key not in wrappers:
                wrappers[key] = CerberusForCausalLM.from_pretrained(source, base_model=model)
    return wrappers[key]
