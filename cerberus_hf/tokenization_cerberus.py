"""The tokenizer a folder of heads names: its base's.

A folder of heads holds no tokenizer (it saves only its own weights, as a PEFT adapter does), yet
``pipeline("text-generation", model=<folder or Hub id>, trust_remote_code=True)`` and
``AutoTokenizer.from_pretrained(<folder>, trust_remote_code=True)`` look for one there. The folder's
``tokenizer_config.json`` maps ``AutoTokenizer`` to `CerberusTokenizer` (through a stub module, `remote_code`), which
returns the tokenizer of the base the heads' config names, loaded as the base itself is (`base_model`).
"""

from __future__ import annotations

import os

from .base_model import load_base_tokenizer
from .checkpoint import HUB_KWARGS
from .configuration_cerberus import CerberusConfig


class CerberusTokenizer:
    """`AutoTokenizer`'s entry for a folder of heads: never instantiated, `from_pretrained` returns the base's
    tokenizer."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *args, **kwargs):
        """The tokenizer of the base that the heads at ``pretrained_model_name_or_path`` were built for."""
        # which copy of the heads' folder to read; the base's own revision is the config's
        hub_kwargs = {k: kwargs[k] for k in HUB_KWARGS if kwargs.get(k) is not None}
        return load_base_tokenizer(CerberusConfig.from_pretrained(pretrained_model_name_or_path, **hub_kwargs))

    @classmethod
    def register_for_auto_class(cls, auto_class: str = "AutoTokenizer") -> None:
        """Nothing to register: AutoTokenizer calls this on remote tokenizer classes, and the tokenizer returned is
        the base's own class, which transformers knows."""
