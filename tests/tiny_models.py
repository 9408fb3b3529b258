"""Tiny random decoders of several architectures, built from configs (nothing is downloaded).

They live in `cerberus_hf.testing`, for scripts and drafter authors too; this module keeps the tests'
``from tiny_models import ...`` working.
"""

from __future__ import annotations

from cerberus_hf.testing import ARCHITECTURES, CONFIGS, DEVICE, EOS, PAD, VOCAB, prompt_ids, tiny_model, tiny_tokenizer

__all__ = ["ARCHITECTURES", "CONFIGS", "DEVICE", "EOS", "PAD", "VOCAB", "prompt_ids", "tiny_model", "tiny_tokenizer"]
