# Reproduces: the export check docs/checkpoints.md and docs/training.md quote: the shipped EAGLE-3 folder
#   (model_cards/eagle3-smollm2-135m-instruct), exported by `cerberus-hf export --format speculators`, gives the same
#   depth-0 drafts and logits when loaded by the speculators library itself.
# Run: python scripts/check_speculators_export.py --python /tmp/specvenv/bin/python \
#        --heads model_cards/eagle3-smollm2-135m-instruct   (the venv as below; without --heads: tiny random heads)
"""Check `cerberus-hf export --format speculators` against the speculators library itself.

For EAGLE-3 heads on a base (a tiny random Llama, or a shipped folder on its real base), this exports the heads,
runs the base over a sequence, and computes the drafter's depth-0 logits over that sequence twice: with cerberus-hf's
own drafter, and with the export loaded by speculators' `Eagle3DraftModel` (its modules chained by hand, as its
`forward` returns argmax ids only) in another Python, whose transformers speculators accepts (<= 5.19):

    python -m venv --system-site-packages /tmp/specvenv
    /tmp/specvenv/bin/pip install transformers==5.18.0 && /tmp/specvenv/bin/pip install --no-deps speculators==0.9.0
    /tmp/specvenv/bin/pip install --no-deps openai datasets multiprocess pandas pyarrow dill xxhash fsspec  # its imports
    python scripts/check_speculators_export.py --python /tmp/specvenv/bin/python            # tiny random heads
    python scripts/check_speculators_export.py --python /tmp/specvenv/bin/python --heads model_cards/eagle3-smollm2-135m-instruct

It prints, per position, whether the two agree on the drafted token, and the largest logit difference.
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="a Python with speculators installed")
    parser.add_argument("--heads", default=None, help="an EAGLE-3 folder (default: tiny random heads)")
    args = parser.parse_args()
    from cerberus_hf.tools.export import export_speculators

    model, ids = shipped_heads(args.heads) if args.heads else tiny_heads()
    heads = model.heads
    with torch.no_grad(), heads.capture(model.base) as captured:
        model.base(ids)
        features = captured["features"]
        positions = torch.arange(ids.shape[1] - 1)
        out, _, _ = heads.extend(features[:, :-1], ids[:, 1:], positions, None, None)
        ours = heads.project(heads.norm(out[0]), 0).float()  # [T, draft vocab], draft vocabulary order
    token_ids = heads.token_ids(torch.arange(ours.shape[1]))
    order = torch.argsort(token_ids)
    ours_by_token = ours[:, order]  # columns in ascending token id, as the export orders them
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "export"
        export_speculators(model, folder)
        save_file({"features": features[:, :-1].float().contiguous(), "input_ids": ids[:, 1:].contiguous()},
                  f"{tmp}/inputs.safetensors")
        done = subprocess.run([args.python, "-c", LOAD_AND_RUN, str(folder), f"{tmp}/inputs.safetensors",
                               f"{tmp}/out.safetensors"], capture_output=True, text=True)
        if done.returncode:
            print(done.stderr[-3000:])
            return 1
        info = json.loads(done.stdout.strip().splitlines()[-1])
        theirs = load_file(f"{tmp}/out.safetensors")
    draft_ids_theirs = theirs["logits"].argmax(-1)
    tokens_theirs = draft_ids_theirs + theirs["d2t"][draft_ids_theirs] if theirs["d2t"].numel() else draft_ids_theirs
    tokens_ours = heads.token_ids(ours.argmax(-1))
    agree = (tokens_theirs == tokens_ours).float().mean().item()
    diff = (theirs["logits"] - ours_by_token).abs().max().item()
    print(json.dumps({"heads": args.heads or "tiny random", "positions": int(ours.shape[0]),
                      "draft_vocab": int(ours.shape[1]), "speculators_class": info["class"],
                      "missing_keys": info["missing"], "unexpected_keys": info["unexpected"],
                      "same_drafted_token": agree, "max_abs_logit_difference": diff,
                      "max_abs_logit": ours.abs().max().item()}, indent=1))
    return 0 if agree == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
