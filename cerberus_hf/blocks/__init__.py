"""Decoding's building blocks that know no drafter: trees and their masks, the entropy gate, acceptance rules, prompt
lookup, n-gram and lattice rescoring, a call's settings and statistics, strict verification, packed weights, batching
and host transfers. The draft-verify loop (`cerberus_hf.decoding`) and the drafter families (`cerberus_hf.drafters`)
are built on them."""
