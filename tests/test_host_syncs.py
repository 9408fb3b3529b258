"""Host reads of device values per decoding step: each one is a synchronisation on a GPU, where a step that waits
on the host several times costs about as much as the forward itself (docs/cuda.md).

`decoding.profiling.HostReads` counts them on any device through a torch function mode (value reads such as
``item``, ``tolist`` and ``bool``, and outputs whose shape depends on values such as ``nonzero``). The bounds below
are today's counts, so that no change adds reads unnoticed; the loop's target is 2 per step (one read of how many
draft tokens were accepted, one of the next draft), against plain `generate()`'s 1.2 per token here.
"""

from __future__ import annotations

import pytest
import torch

from cerberus_hf.configuration_cerberus import HEAD_TYPES
from cerberus_hf.decoding.profiling import HostReads
from helpers import NEW_TOKENS, fresh_model, get_base, get_prompt

# Reads per step with every draft rejected (one token a step), chain drafts of 3 heads, llama, 24 new tokens.
# Tree families: the token picked (item), the stopping criteria (bool), the last token for the heads (int), the
# drafted tokens per depth and the draft as a list (tolist). Kangaroo also reads its per-token exit confidence.
BOUNDS = {"medusa": 6.8, "cerberus": 6.8, "hydra": 6.8, "clover": 6.8, "kangaroo": 8.6}


def test_the_counter_sees_every_kind_of_read():
    x = torch.arange(6)
    with HostReads() as reads:
        x[2].item(), x.tolist(), bool(x[1] > 0), int(x[3]), float(x[4]), x.nonzero(), x[x > 2], torch.unique(x)
        x + 1, x.sum(), x[1:3]  # no read
    assert reads.by_kind == {"item": 1, "tolist": 1, "bool": 1, "int": 1, "float": 1, "nonzero": 1,
                             "bool_index": 1, "unique": 1}
    # each read is charged to the line that asked (torch.unique asks through torch's own Python wrapper)
    assert sum(n for line, n in reads.by_line.items() if "test_host_syncs.py" in line) >= 7


def test_plain_generate_reads_about_once_a_token():
    base, prompt = get_base("llama"), get_prompt("llama")
    with HostReads(where=False) as reads:
        base.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert reads.total <= 1.2 * NEW_TOKENS


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_reads_per_step_stay_within_todays_bound(head_type):
    model = fresh_model("llama", head_type, randomize=True, seed=5, num_heads=3)
    prompt = get_prompt("llama")
    with HostReads(where=False) as reads:
        model.generate(prompt, max_new_tokens=NEW_TOKENS, draft_tree=None, dynamic_tree=None,
                       gate_threshold=None)
    steps = model.generation_stats.steps
    assert model.generation_stats.drafted_tokens > 0
    assert reads.total / steps <= BOUNDS[head_type], (reads.total / steps, reads.by_kind)
