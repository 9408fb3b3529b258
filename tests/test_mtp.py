"""The MTP family (`drafters.mtp`): a base's own multi-token-prediction layers as the drafter, on tiny bases that ship
them (`testing.MTP_CONFIGS`: DeepSeek-V3's latent attention, GLM-4.5's grouped-query attention).

- its drafts equal transformers' own `MTPCandidateGenerator`'s, position by position, over a decoding schedule that
  accepts every number of drafts from none to all (the reference keeps its caches as the drafts it made were kept);
- a tree's nodes, drafted together, equal each node's path drafted alone;
- greedy output equals plain `generate()` on every path (chain, static and grown trees, gate, prompt lookup, static
  cache, a batch together, the device step);
- the device step's rows (`MtpRows`) keep and draft what each sequence's state does (the device step's own tests,
  tests/test_device_step.py, run the family beside the others);
- a base without MTP layers, and more depths than it ships, are refused in one line; a saved folder holds none of the
  base's weights and loads back to the same drafts.
"""

from __future__ import annotations

import functools
import os
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from transformers import GenerationConfig
from transformers.generation.candidate_generator import MTPCandidateGenerator

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.blocks.settings import resolve_settings
from cerberus_hf.checkpoint import HEADS_WEIGHTS_NAME
from cerberus_hf.decoding import paths
from cerberus_hf.errors import UserError
from cerberus_hf.testing import DEVICE, MTP_ARCHITECTURES, prompt_ids, tiny_model, tiny_mtp_model
from helpers import check_rows_against_states, get_base
from test_sampling import CHECKS, LONG, PROMPT, assert_follows_the_base

NEW = 24
STATIC_TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]][:5]  # two depths: the tiny bases ship two MTP layers


@pytest.fixture(scope="module", params=MTP_ARCHITECTURES)
def base(request, tmp_path_factory):
    return tiny_mtp_model(request.param, str(tmp_path_factory.mktemp(request.param)))


@functools.lru_cache(maxsize=None)
def _plain(base, seed: int, length: int, new: int) -> torch.Tensor:
    return base.generate(prompt_ids(seed, length), max_new_tokens=new, do_sample=False)


def states(base, ids: torch.Tensor) -> torch.Tensor:
    """The base's last hidden states (after its final norm) at every position of ``ids``."""
    with torch.no_grad():
        return base(ids, output_hidden_states=True).hidden_states[-1]


def chain(drafter, state, ids: torch.Tensor) -> tuple[list[int], list[torch.Tensor]]:
    """This library's chain after ``ids``: every depth's top-1, depth by depth (as `decoding.drafting` runs them)."""
    hidden, previous, path, logits = state.heads_input(ids, None), None, ids[:, -1:], []
    for k in range(drafter.num_heads):
        previous, level = drafter.draft_level(k, hidden, path, previous, state.context())
        logits.append(level[0])
        path = torch.cat([path, level.argmax(-1, keepdim=True)], dim=1)
    return path[0, 1:].tolist(), logits


def test_drafts_equal_transformers_mtp_candidate_generator(base):
    """At every step of a schedule that accepts 0, 1, ... L drafts in turn (each time the drafts the reference made,
    then a token of its own choosing), both draft the same chain, with the same logits."""
    model = CerberusForCausalLM.from_base(base, head_type="mtp")
    drafter, layers = model.heads, base.config.num_mtp_layers
    reference = MTPCandidateGenerator(base, GenerationConfig(do_sample=False), {})
    generator = torch.Generator().manual_seed(0)
    ids = prompt_ids(3, 9)  # 8 verified states, then the token the prefill predicted
    state = drafter.start(base, None)
    with torch.no_grad():
        state.observe({"normed": states(base, ids[:, :-1])}, None)
        fed, accepted = None, 0
        for step in range(12):
            if fed is not None:
                state.observe({"normed": fed}, list(range(accepted + 1)))
            positions = torch.arange(ids.shape[1], device=DEVICE)[None]
            outputs = SimpleNamespace(hidden_states=(fed if fed is not None else states(base, ids[:, :-1]),))
            candidates, ref_logits = reference.get_candidates(ids, {"position_ids": positions}, outputs, False,
                                                              accepted)
            drafted, logits = chain(drafter, state, ids)
            assert drafted == candidates[0, ids.shape[1]:].tolist(), f"step {step}"
            torch.testing.assert_close(torch.stack(logits), ref_logits[0], rtol=1e-4, atol=1e-4)
            accepted = step % (layers + 1)
            bonus = torch.randint(3, 96, (1, 1), generator=generator).to(DEVICE)
            verified = ids.shape[1] - 1
            ids = torch.cat([ids, torch.tensor([drafted[:accepted]], dtype=torch.long, device=DEVICE), bonus], dim=1)
            fed = states(base, ids)[:, verified: verified + accepted + 1]  # the newest token's state, the kept drafts'


def test_tree_nodes_equal_their_paths_alone(base):
    """Depth 1 over several nodes at once (each its own path) gives each node what it gets drafted alone."""
    drafter = CerberusForCausalLM.from_base(base, head_type="mtp").heads
    ids = _plain(base, 1, 8, 6)
    state = drafter.start(base, None)
    with torch.no_grad():
        state.observe({"normed": states(base, ids[:, :-1])}, None)
        hidden = state.heads_input(ids, None)
        root, logits = drafter.draft_level(0, hidden, ids[:, -1:], None, state.context())
        top = logits[0].topk(3).indices
        paths = torch.stack([ids[0, -1].expand(3), top], dim=1)
        together = drafter.draft_level(1, hidden.expand(3, -1), paths, root.expand(3, -1, -1), state.context())
        for i in range(3):
            alone = drafter.draft_level(1, hidden, paths[i: i + 1], root, state.context())
            torch.testing.assert_close(together[1][i: i + 1], alone[1], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(together[0][i: i + 1], alone[0], rtol=1e-5, atol=1e-5)
        # the cache holds the verified slots only, whatever was drafted
        assert [layer.get_seq_length() for layer in state.cache.layers] == [ids.shape[1] - 1 - j for j in range(2)]


PATHS = {
    "chain": {},
    "static tree": dict(draft_tree=STATIC_TREE),
    "grown tree": dict(dynamic_tree={"nodes": 6, "depth": 2, "top_k": 3}),
    "gate": dict(gate_threshold=0.5),
    "prompt lookup": dict(prompt_lookup_num_tokens=3),
    "static cache": dict(cache_implementation="static"),
    "device step": dict(device_step=True),
}


@functools.lru_cache(maxsize=None)
def _seeds(base) -> tuple[int, ...]:
    """Two prompts whose greedy continuation runs the whole ``NEW`` tokens (no end of sequence early on)."""
    return tuple(seed for seed in range(40) if _plain(base, seed, 8, NEW).shape[1] == 8 + NEW)[:2]


@pytest.mark.parametrize("path", PATHS)
def test_greedy_equals_plain_generate(base, path):
    model = CerberusForCausalLM.from_base(base, head_type="mtp")
    for seed in _seeds(base):
        plain = _plain(base, seed, 8, NEW)
        out = model.generate(prompt_ids(seed, 8), max_new_tokens=NEW, **PATHS[path])
        assert torch.equal(out, plain), f"seed {seed}"
        stats = model.generation_stats
        assert stats.new_tokens == NEW and (stats.drafted_tokens > 0 or path == "gate")


def test_paths_taken(base):
    """The batch is verified together, the static cache serves and so does the device step (`MtpRows`)."""
    model = CerberusForCausalLM.from_base(base, head_type="mtp")
    settings = resolve_settings(model.decoding_settings(), model.config.num_heads)
    assert paths.batch_refusal(model.base, model.heads, settings) is None
    assert paths.static_refusal(model.base, model.heads, settings, 1) is None
    assert paths.device_step_refusal(model.base, model.heads, settings, GenerationConfig()) is None
    out = model.generate(prompt_ids(_seeds(base)[0], 8), max_new_tokens=4, device_step=True)
    assert model.__dict__.get("_cerberus_device_steps") and out.shape[1] == 12


def drafted(drafter, hidden: torch.Tensor, last: torch.Tensor, path: torch.Tensor, context) -> list[torch.Tensor]:
    """Every depth's logits ``[n, V]`` of nodes reading ``hidden`` ``[n, hidden]`` after their newest tokens ``last``
    ``[n, 1]``, along ``path`` ``[n, depths]`` (the tokens drafted above each depth)."""
    previous, logits = None, []
    for k in range(drafter.num_heads):
        previous, level = drafter.draft_level(k, hidden, torch.cat([last, path[:, :k]], dim=1), previous, context)
        logits.append(level)
    return logits


@pytest.mark.parametrize("arch", MTP_ARCHITECTURES)
def test_device_rows_keep_what_the_sequence_state_keeps(arch):
    """`MtpRows` against `MtpState` row by row (two rows, one left-padded with fewer verified states than the three
    layers' slots need at first, extended by different counts): what depth 0 reads, and every depth's drafts of two
    nodes per row drafted together, equal each row's state's, node by node."""
    def compare(drafter, rows, states, sequences):
        generator = torch.Generator().manual_seed(sum(sequence.shape[1] for sequence in sequences))
        paths = torch.randint(3, 90, (2, 2, drafter.num_heads), generator=generator)  # [row, node, depth]
        last = torch.cat([sequence[:, -1:] for sequence in sequences]).repeat_interleave(2, dim=0)
        ours = drafted(drafter, rows.read(None).repeat_interleave(2, dim=0), last, paths.reshape(4, -1),
                       rows.context())
        for b in range(2):
            hidden = states[b].heads_input(sequences[b], None)
            torch.testing.assert_close(rows.read(None)[b: b + 1], hidden, rtol=1e-5, atol=1e-5)
            for node in range(2):
                theirs = drafted(drafter, hidden, sequences[b][:, -1:], paths[b, node][None], states[b].context())
                for k, logits in enumerate(theirs):
                    torch.testing.assert_close(ours[k][2 * b + node][None], logits, rtol=1e-4, atol=1e-4)

    with torch.no_grad():
        check_rows_against_states("mtp", compare, arch)


@pytest.mark.parametrize("arch", MTP_ARCHITECTURES)
@pytest.mark.parametrize("device_step", [False, True])
def test_a_prompt_shorter_than_the_layers_equals_plain_generate(arch, device_step):
    """A one-token prompt on a base with three MTP layers: the deepest layer has no verified slot at first."""
    base = get_base(arch)
    model = CerberusForCausalLM.from_base(base, head_type="mtp")
    ids = prompt_ids(4, 1)
    out = model.generate(ids, max_new_tokens=12, device_step=device_step, draft_tree=[[0], [1], [0, 0], [0, 0, 0]])
    assert torch.equal(out, base.generate(ids, max_new_tokens=12, do_sample=False))


def test_batch_decoded_together_equals_plain_generate(base):
    """Rows of several lengths, verified together, each drafting with its own MTP caches."""
    model = CerberusForCausalLM.from_base(base, head_type="mtp")
    rows = [prompt_ids(seed, length)[0] for seed, length in ((0, 8), (1, 5), (2, 7))]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=DEVICE)
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, width - len(row):], mask[b, width - len(row):] = row, 1
    plain = base.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0)
    out = model.generate(ids, attention_mask=mask, max_new_tokens=16, draft_tree=STATIC_TREE, pad_token_id=0)
    assert torch.equal(out, plain)


def test_saved_folder_holds_no_base_weights_and_loads_back(base, tmp_path):
    model = CerberusForCausalLM.from_base(base, head_type="mtp", base_model_name_or_path=base.config.name_or_path)
    model.save_pretrained(tmp_path)
    assert load_file(os.path.join(tmp_path, HEADS_WEIGHTS_NAME)) == {}
    loaded = CerberusForCausalLM.from_pretrained(tmp_path, base_model=base)
    assert loaded.config.head_type == "mtp" and loaded.config.num_heads == 2
    seed = _seeds(base)[0]
    assert torch.equal(loaded.generate(prompt_ids(seed, 8), max_new_tokens=NEW), _plain(base, seed, 8, NEW))


def test_a_base_without_mtp_layers_is_refused_in_one_line():
    with pytest.raises(UserError, match="ships no multi-token-prediction layers") as error:
        CerberusForCausalLM.from_base(tiny_model("llama"), head_type="mtp")
    assert "\n" not in str(error.value)


def test_more_depths_than_mtp_layers_are_refused_in_one_line(base):
    with pytest.raises(UserError, match="num_heads=3 asks for more depths than the 2 MTP layers") as error:
        CerberusForCausalLM.from_base(base, head_type="mtp", num_heads=3)
    assert "\n" not in str(error.value)
    assert CerberusForCausalLM.from_base(base, head_type="mtp", num_heads=1).heads.num_heads == 1


def test_bench_runs_transformers_use_mtp_beside_this_librarys_generate(base):
    """The bench row of transformers' own ``generate(use_mtp=True)`` sits beside the mtp rows, with the same layers."""
    from cerberus_hf.tools.bench import run_bench

    model = CerberusForCausalLM.from_base(base, head_type="mtp", draft_tree=STATIC_TREE)
    prompts = [prompt_ids(seed, 8) for seed in _seeds(base)]
    result = run_bench(base, {"mtp": model}, prompts, max_new_tokens=12, warmup=0, variants=["chain", "tree"],
                       prompt_lookup=False, packed_peer=False)
    names = [row["method"] for row in result["methods"]]
    assert names[:2] == ["plain generate()", "transformers generate(use_mtp=True)"]
    assert len(result["methods"]) == 4 and all(row["identical"] == 1.0 for row in result["methods"])


def test_teacher_forced_logits_equal_drafting_on_the_true_path(base):
    """What calibration measures at every position equals what decoding drafts there when every draft above was right,
    and a tree drafted from calibration's context equals one drafted by decoding's state."""
    drafter = CerberusForCausalLM.from_base(base, head_type="mtp").heads
    ids = _plain(base, _seeds(base)[0], 8, NEW)
    with torch.no_grad(), drafter.capture(base) as captured:
        base(ids)
        hidden, logits, context = drafter.teacher_forced(captured, ids, 7)
    for t in (7, 12, ids.shape[1] - 4):
        state = drafter.start(base, None)
        with torch.no_grad():
            state.observe({"normed": states(base, ids[:, :t + 1])}, None)
            torch.testing.assert_close(state.heads_input(ids[:, :t + 2], None), hidden[t: t + 1], rtol=1e-4, atol=1e-5)
            for source in (state, context(t)):
                previous, path = None, ids[:, t + 1: t + 2]
                for k in range(drafter.num_heads):
                    previous, level = drafter.draft_level(k, hidden[t: t + 1], path, previous, source)
                    torch.testing.assert_close(level[0], logits[t, k], rtol=1e-4, atol=1e-4)
                    path = ids[:, t + 1: t + k + 3]  # the true tokens above the next depth


def test_calibration_fits_and_stores_settings_generate_uses(base):
    """`calibrate` collects positions through `teacher_forced` and times a step from a copied state (`MtpState`)."""
    from cerberus_hf.calibration.pipeline import calibrate

    model = CerberusForCausalLM.from_base(base, head_type="mtp")
    seed = _seeds(base)[0]
    sequences = [(_plain(base, s, 8, NEW)[0].tolist(), 7) for s in _seeds(base)]  # random layers: top-32 ranks hit
    report = calibrate(model, sequences, top_k=32, max_nodes=6, repeats=1, dynamic_budgets=())
    assert report["positions"] > 0 and report["settings"]["dynamic_tree"]["depth"] == 2
    assert model.decoding_settings()["calibration"] == report["key"]
    assert torch.equal(model.generate(prompt_ids(seed, 8), max_new_tokens=NEW), _plain(base, seed, 8, NEW))


def test_a_base_without_its_mtp_weights_is_refused_in_one_line(tmp_path):
    """Built from a config (no checkpoint to read), or loaded from a checkpoint that lacks the layers."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from cerberus_hf.testing import MTP_CONFIGS

    options = dict(MTP_CONFIGS["glm4_moe"])
    config = AutoConfig.for_model(options.pop("model_type"), **options)
    base = AutoModelForCausalLM.from_config(config)
    with pytest.raises(UserError, match="was not loaded from a folder or Hub id") as error:
        CerberusForCausalLM.from_base(base, head_type="mtp")
    assert "\n" not in str(error.value)
    base.save_pretrained(tmp_path)
    with pytest.raises(UserError, match="could not be read from its checkpoint .*weights are missing") as error:
        CerberusForCausalLM.from_base(AutoModelForCausalLM.from_pretrained(tmp_path), head_type="mtp")
    assert "\n" not in str(error.value) and len(str(error.value)) < 400


@pytest.mark.parametrize("check", CHECKS)
def test_sampling_follows_the_base(tmp_path, check):
    """Sampled tokens follow the base's distribution with MTP drafts accepted (the chi-square checks of test_sampling,
    on a GLM-4.5 layout over its 12-token vocabulary)."""
    base = tiny_mtp_model("glm4_moe", str(tmp_path), vocab_size=12, bos_token_id=0, eos_token_id=None,
                          pad_token_id=None, max_position_embeddings=PROMPT.shape[1] + LONG).cpu()  # (prompts: CPU)
    model = CerberusForCausalLM.from_base(base, head_type="mtp", num_heads=1)
    assert_follows_the_base(model, base, check, draft_tree=[[0], [1], [2], [3]])
