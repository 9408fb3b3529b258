"""The base model with these draft heads from the installed cerberus-hf package (`pip install cerberus-hf`).

This folder holds draft heads; the code that runs them is the package's, so it follows the package's releases.
"""

from cerberus_hf.modeling_cerberus import CerberusForCausalLM

__all__ = ["CerberusForCausalLM"]
