"""Speculative decoding with the draft heads of this repository, for a base model loaded already:

    base.generate(**inputs, custom_generate="<this repository or folder>", trust_remote_code=True)

Output equals the same call without ``custom_generate`` (greedy: token for token); the heads only make it sooner.
The decoding loop is the installed cerberus-hf package's (`pip install cerberus-hf`).
"""

from cerberus_hf.custom_generate import generate

__all__ = ["generate"]
