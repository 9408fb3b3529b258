"""Reproduces `cerberus_hf/data/prompts.jsonl`, the packaged prompts the shipped heads' self-distilled data
(`data/smollm2_selfdistill.jsonl`, `cerberus-hf distill`'s default prompt set) answers: byte for byte with the default
`--seed 0` (docs/data.md).

    python scripts/make_prompts [--seed 0] [--output cerberus_hf/data/prompts.jsonl] [--bench MT_BENCH_JSONL]

Every prompt is made here from templates and word lists written for this project (no benchmark or public dataset
text), deterministically for a given --seed. It finishes with a contamination check: no prompt may share a run of 8 or
more words with any question of the MT-Bench file (kept for evaluation only); the check result is printed and the
script exits non-zero on a hit.

Modules: `words` (shared word lists), one generator module per group of categories (`explain`, `howto`, `creative`,
`passages`, `coding`, `reasoning`, `conversation`), `categories` (how many of each, and their generators), `build`
(distinct prompts, shuffled, with ids) and `cli` (the check, writing and statistics).
"""
