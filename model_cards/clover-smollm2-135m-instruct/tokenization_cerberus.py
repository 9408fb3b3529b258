"""The tokenizer of these draft heads' base from the installed cerberus-hf package (`pip install cerberus-hf`).

This folder holds draft heads; the code that runs them is the package's, so it follows the package's releases.
"""

from cerberus_hf.tokenization_cerberus import CerberusTokenizer

__all__ = ["CerberusTokenizer"]
