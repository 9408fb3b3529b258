"""cerberus-hf: draft heads (Cerberus, Medusa, Hydra, Clover, Kangaroo, EAGLE-3) that make Hugging Face decoders generate
faster, with the same output (`CerberusForCausalLM`; docs/architecture.md for the layout)."""

from transformers import AutoConfig, AutoModelForCausalLM

from .configuration_cerberus import HEAD_TYPES, CerberusConfig
from .blocks.gate import EntropyGate, entropy
from .blocks.settings import DecodingSettings
from .drafters import (
    CerberusDrafter, CloverDrafter, Drafter, Eagle3Drafter, HydraDrafter, KangarooDrafter, MedusaDrafter, build_drafter,
)
from .modeling_cerberus import CerberusForCausalLM
from .blocks.stats import GenerationStats

AutoConfig.register(CerberusConfig.model_type, CerberusConfig, exist_ok=True)
AutoModelForCausalLM.register(CerberusConfig, CerberusForCausalLM, exist_ok=True)

__version__ = "0.3.0"

__all__ = [
    "HEAD_TYPES",
    "CerberusConfig",
    "CerberusForCausalLM",
    "CerberusDrafter",
    "CloverDrafter",
    "DecodingSettings",
    "Drafter",
    "Eagle3Drafter",
    "HydraDrafter",
    "KangarooDrafter",
    "EntropyGate",
    "GenerationStats",
    "MedusaDrafter",
    "build_drafter",
    "entropy",
]
