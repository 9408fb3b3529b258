# Reproduces: the export check docs/checkpoints.md and docs/training.md quote: the shipped EAGLE-3 folder
#   (model_cards/eagle3-smollm2-135m-instruct), exported by `cerberus-hf export --format speculators`, gives the same
#   depth-0 drafts and logits when loaded by the speculators library itself; and the import check `make test-engines`
#   runs: a drafter speculators builds and saves loads into cerberus-hf and drafts what speculators computes.
# Run: python scripts/check_speculators_export.py --python /tmp/specvenv/bin/python \
#        --heads model_cards/eagle3-smollm2-135m-instruct   (the venv as below; without --heads: tiny random heads)
"""Check `cerberus-hf export --format speculators`, and importing speculators' EAGLE-3 layout, against the
speculators library itself.

For EAGLE-3 heads on a base (a tiny random Llama, or a shipped folder on its real base), this exports the heads,
runs the base over a sequence, and computes the drafter's depth-0 logits over that sequence twice: with cerberus-hf's
own drafter, and with the export loaded by speculators' `Eagle3DraftModel` (its modules chained by hand, as its
`forward` returns argmax ids only) in another Python, whose transformers speculators accepts (<= 5.19):

    python -m venv --system-site-packages /tmp/specvenv
    /tmp/specvenv/bin/pip install transformers==5.18.0
    /tmp/specvenv/bin/pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0
    /tmp/specvenv/bin/pip install --no-deps openai datasets multiprocess pandas pyarrow dill xxhash fsspec loguru
    python scripts/check_speculators_export.py --python /tmp/specvenv/bin/python            # tiny random heads
    python scripts/check_speculators_export.py --python /tmp/specvenv/bin/python --heads model_cards/eagle3-smollm2-135m-instruct

Import (``--direction import``): speculators builds an `Eagle3DraftModel` for a tiny random Llama verifier (saved to
a folder, as speculators' own `from_training_args` does: the verifier's embedding and vocabulary maps loaded, the other
weights random) and writes it with its `save_pretrained`; it runs its own `forward` (the chain of teacher-forced steps
it trains with) over the verifier's states at the drafter's layers and records every step's logits. cerberus-hf loads
the folder onto the verifier and computes the same chain (`teacher_forced`) from its own capture of the verifier's
states. ``--perturb NAME`` changes one tensor of the saved folder first: the check must then fail. The `make
test-engines` venv has speculators (see the Makefile); ``--direction both`` (the default) runs both checks.

It prints, per depth, whether the two agree on the drafted token at every position, and the largest logit difference.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

LOAD_AND_RUN = r'''
import json, sys, torch
from safetensors.torch import load_file, save_file
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
folder, inputs, out = sys.argv[1:4]
config = Eagle3SpeculatorConfig.from_pretrained(folder)
config.transformer_layer_config._attn_implementation = "eager"
model = Eagle3DraftModel(config)
report = model.load_state_dict(load_file(folder + "/model.safetensors"), strict=False)
model = model.float().eval()
data = load_file(inputs)
features, ids = data["features"].float(), data["input_ids"]
length = ids.shape[1]
with torch.no_grad():
    hidden = model.fc(features)
    z = torch.cat([model.embed_tokens(ids), hidden], dim=-1)
    positions = 1 + torch.arange(length)[None]
    embeddings = model.rotary_emb(z, positions)
    mask = torch.full((length, length), float("-inf")).triu(1)[None, None]
    for layer in model.layers:
        z = layer(z, attention_mask=mask, position_ids=positions, past_key_values=None, position_embeddings=embeddings)
        z = z[0] if isinstance(z, tuple) else z
    logits = model.lm_head(model.norm(z))[0]
save_file({"logits": logits.contiguous(), "d2t": model.d2t.clone() if model.d2t is not None else torch.zeros(0)}, out)
print(json.dumps({"missing": sorted(report.missing_keys), "unexpected": sorted(report.unexpected_keys),
                  "class": type(model).__name__}))
'''


def tiny_heads():
    from cerberus_hf import CerberusForCausalLM
    from cerberus_hf.testing import randomize_heads, tiny_model

    model = CerberusForCausalLM.from_base(tiny_model("llama"), head_type="eagle3", num_heads=3)
    randomize_heads(model, seed=1, std=0.3)
    model.set_draft_vocab(torch.tensor([5, 90, 17, 3, 44, 60, 2, 71, 30, 8, 12, 55]))  # not in token order
    return model, torch.tensor([[1, 9, 33, 7, 61, 5, 2, 88, 14, 14, 70, 3, 41, 22, 9, 50]])


def shipped_heads(folder: str):
    from cerberus_hf import CerberusForCausalLM
    from cerberus_hf.real_models import load_named_model

    model = CerberusForCausalLM.from_pretrained(folder)
    tokenizer = load_named_model(model.config.base_model_source or model.config.base_model_name_or_path,
                                 with_tokenizer=True)[1]
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Explain why the sky is blue in two sentences."}],
                                         tokenize=False, add_generation_prompt=True)
    prompt = tokenizer(text, return_tensors="pt").input_ids
    sequence = model.base.generate(prompt, max_new_tokens=48, do_sample=False)
    return model, sequence


BUILD_SAVE_AND_RUN = r'''
import json, sys, torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig
from speculators.config import SpeculatorsConfig, VerifierConfig
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
from speculators.proposals.greedy import GreedyTokenProposalConfig
verifier, inputs, folder, out, draft_ids, layers, steps = sys.argv[1:8]
torch.manual_seed(0)
layer = AutoConfig.from_pretrained(verifier)
layer.num_hidden_layers, layer._attn_implementation = 1, "eager"
draft_ids = torch.tensor(json.loads(draft_ids))
t2d = torch.zeros(layer.vocab_size, dtype=torch.bool)
t2d[draft_ids] = True
config = Eagle3SpeculatorConfig(
    transformer_layer_config=layer, draft_vocab_size=len(draft_ids), norm_before_residual=True,
    eagle_aux_hidden_state_layer_ids=json.loads(layers),
    speculators_config=SpeculatorsConfig(
        algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=int(steps))],
        default_proposal_method="greedy", verifier=VerifierConfig.from_pretrained(verifier)))
model = Eagle3DraftModel(config)
model.load_vocab_mappings(t2d, draft_ids - torch.arange(len(draft_ids)))
model.load_verifier_weights()
with torch.no_grad():
    for name, weight in model.named_parameters():
        if not name.startswith(("embed_tokens.", "verifier_")):
            noise = 0.3 * torch.randn_like(weight)
            weight.copy_(1 + noise if name.endswith("norm.weight") else noise)
model.save_pretrained(folder)
model = model.float().eval()
data = load_file(inputs)
logits = []
model.lm_head.register_forward_hook(lambda module, args, output: logits.append(output[0]))
length = data["input_ids"].shape[1]
with torch.no_grad():
    drafts = model(hidden_states=data["features"].float(), input_ids=data["input_ids"],
                   document_ids=torch.zeros(1, length, dtype=torch.long), ttt_steps=int(steps))
save_file({"logits": torch.stack(logits).contiguous(), "drafts": torch.cat(drafts).contiguous(), "d2t": model.d2t}, out)
print(json.dumps({"class": type(model).__name__}))
'''
VERIFIER_LAYERS, IMPORT_LAYERS, IMPORT_STEPS = 6, [1, 3, 4], 3


def run_in(python: str, code: str, *args: str) -> dict | None:
    """Run ``code`` in ``python`` with ``args``: its last printed line (JSON), or None (its error printed) if it
    failed."""
    done = subprocess.run([python, "-c", code, *args], capture_output=True, text=True)
    if done.returncode:
        print(done.stderr[-3000:])
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def by_token(logits: torch.Tensor, token_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """``logits`` ``[..., draft vocabulary]`` spread over ``vocab`` token ids (-inf off the draft vocabulary)."""
    full = torch.full((*logits.shape[:-1], vocab), float("-inf"))
    full[..., token_ids] = logits.float()
    return full


def check_export(python: str, heads_folder: str | None) -> dict | None:
    """Our depth-0 logits beside speculators' over our export of ``heads_folder`` (or tiny random heads)."""
    from cerberus_hf.tools.export import export_speculators

    model, ids = shipped_heads(heads_folder) if heads_folder else tiny_heads()
    heads = model.heads
    with torch.no_grad(), heads.capture(model.base) as captured:
        model.base(ids)
        features = captured["features"]
        positions = torch.arange(ids.shape[1] - 1)
        out, _, _ = heads.extend(features[:, :-1], ids[:, 1:], positions, None, None)
        ours = heads.project(heads.norm(out[0]), 0).float()  # [T, draft vocab], draft vocabulary order
    token_ids = heads.token_ids(torch.arange(ours.shape[1]))
    ours_by_token = ours[:, torch.argsort(token_ids)]  # columns in ascending token id, as the export orders them
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "export"
        export_speculators(model, folder)
        save_file({"features": features[:, :-1].float().contiguous(), "input_ids": ids[:, 1:].contiguous()},
                  f"{tmp}/inputs.safetensors")
        info = run_in(python, LOAD_AND_RUN, str(folder), f"{tmp}/inputs.safetensors", f"{tmp}/out.safetensors")
        if info is None:
            return None
        theirs = load_file(f"{tmp}/out.safetensors")
    draft_ids_theirs = theirs["logits"].argmax(-1)
    tokens_theirs = draft_ids_theirs + theirs["d2t"][draft_ids_theirs] if theirs["d2t"].numel() else draft_ids_theirs
    agree = (tokens_theirs == heads.token_ids(ours.argmax(-1))).float().mean().item()
    return {"check": "export", "heads": heads_folder or "tiny random", "positions": int(ours.shape[0]),
            "draft_vocab": int(ours.shape[1]), "speculators_class": info["class"], "missing_keys": info["missing"],
            "unexpected_keys": info["unexpected"], "same_drafted_token": agree,
            "max_abs_logit_difference": (theirs["logits"] - ours_by_token).abs().max().item(),
            "max_abs_logit": ours.abs().max().item(), "passed": agree == 1.0}


def check_import(python: str, perturb: str | None) -> dict | None:
    """Speculators' chain of logits beside ours over a drafter speculators built and saved (``perturb``: one tensor of
    the folder changed before cerberus-hf loads it)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from cerberus_hf import CerberusForCausalLM
    from cerberus_hf.testing import VOCAB

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=VERIFIER_LAYERS, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256, rope_theta=500.0)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(config).eval()
    ids = torch.tensor([[1, 9, 33, 7, 61, 5, 2, 88, 14, 14, 70, 3, 41, 22, 9, 50, 17, 64]])
    draft_ids = [2, 3, 5, 7, 9, 14, 17, 22, 33, 41, 50, 61, 64, 70, 88, 90, 91, 92]  # not every token id
    with torch.no_grad():
        states = base(ids, output_hidden_states=True).hidden_states  # [i]: the state entering layer i
    features = torch.cat([states[i] for i in IMPORT_LAYERS], dim=-1)
    with tempfile.TemporaryDirectory() as tmp:
        base.save_pretrained(f"{tmp}/verifier")
        save_file({"features": features[:, :-1].contiguous(), "input_ids": ids[:, 1:].contiguous()},
                  f"{tmp}/inputs.safetensors")
        info = run_in(python, BUILD_SAVE_AND_RUN, f"{tmp}/verifier", f"{tmp}/inputs.safetensors", f"{tmp}/drafter",
                      f"{tmp}/out.safetensors", json.dumps(draft_ids), json.dumps(IMPORT_LAYERS), str(IMPORT_STEPS))
        if info is None:
            return None
        if perturb:
            tensors = load_file(f"{tmp}/drafter/model.safetensors")
            tensors[perturb] = tensors[perturb] + 0.05
            save_file(tensors, f"{tmp}/drafter/model.safetensors")
        theirs = load_file(f"{tmp}/out.safetensors")
        model = CerberusForCausalLM.from_pretrained(f"{tmp}/drafter", base_model=base)
    heads = model.heads
    with torch.no_grad(), heads.capture(base) as captured:
        base(ids)
        ours = heads.teacher_forced(captured, ids, 0)[1]  # [T, depths, draft vocab]: position t, depth k
    ours = by_token(ours, heads.token_ids(torch.arange(ours.shape[-1])), VOCAB)
    mine_ids = torch.arange(theirs["logits"].shape[-1])
    theirs_logits = by_token(theirs["logits"], mine_ids + theirs["d2t"][mine_ids], VOCAB)  # [steps, n, vocab]
    agree, diff = [], 0.0
    for k in range(IMPORT_STEPS):  # step k's tokens are real up to position n - 1 - k (speculators pads with 0 after)
        valid = ids.shape[1] - 1 - k
        mine, their = ours[:valid, k], theirs_logits[k, :valid]
        drafted = theirs["drafts"][k, :valid]  # speculators' own drafts (draft vocabulary ids)
        agree.append((mine.argmax(-1) == drafted + theirs["d2t"][drafted]).float().mean().item())
        finite = torch.isfinite(their)
        assert torch.equal(finite, torch.isfinite(mine)), "the draft vocabularies differ"
        diff = max(diff, (mine[finite] - their[finite]).abs().max().item())
    scale = theirs["logits"].abs().max().item()
    return {"check": "import", "speculators_class": info["class"], "perturbed": perturb,
            "loaded_feature_layers": model.config.feature_layers, "loaded_num_heads": model.config.num_heads,
            "positions": ids.shape[1] - 1, "depths": IMPORT_STEPS, "draft_vocab": len(draft_ids),
            "same_drafted_token_per_depth": agree, "max_abs_logit_difference": diff, "max_abs_logit": scale,
            "passed": model.config.feature_layers == IMPORT_LAYERS and min(agree) == 1.0 and diff <= 1e-4 * scale}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="a Python with speculators installed")
    parser.add_argument("--heads", default=None, help="export: an EAGLE-3 folder (default: tiny random heads)")
    parser.add_argument("--direction", choices=("export", "import", "both"), default="both")
    parser.add_argument("--perturb", default=None, help="import: a tensor of speculators' folder to change first")
    args = parser.parse_args()
    reports = []
    if args.direction in ("export", "both"):
        reports.append(check_export(args.python, args.heads))
    if args.direction in ("import", "both"):
        reports.append(check_import(args.python, args.perturb))
    for report in reports:
        if report is not None:
            print(json.dumps(report, indent=1))
    return 0 if all(report is not None and report["passed"] for report in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
