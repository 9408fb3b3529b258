"""`cerberus-hf export`: heads in the format a serving engine loads, for users who outgrow `generate()`.

* ``--format speculators`` (EAGLE-3 heads): the Eagle3 layout of the ``speculators`` library (0.9), which vLLM and
  SGLang serve. The drafter's layer maps one to one onto speculators' (``fc``, ``layers.0`` with ``input_layernorm``
  on the token embedding and ``hidden_norm`` on the fused state, q/k/v over ``[embedding; state]``, the residual onto
  the raw fused state, or the normed one with ``norm_before_residual``, the final ``norm``), with the rotary base, MLP
  width and norms' epsilon written as this drafter uses them. The projection becomes the drafter's own ``lm_head``:
  the frozen base ``lm_head``'s rows of the draft vocabulary (or the drafter's own ``lm_head``'s, for one loaded from
  another layout), ordered by token id, with ``d2t`` (draft index to token id offsets) and ``t2d`` (which token ids
  are drafted); the base's input embedding is copied as ``embed_tokens``. What the engine
  does not use: the calibrated trees, gate and prompt lookup (an engine drafts with its own settings; a chain of
  ``num_heads`` tokens is written as the proposal; they travel for this library, below), and the positions:
  speculators numbers a drafting position from 1, this drafter from 0, which rotary attention does not see (it reads
  only differences of positions).
* ``--format vllm-medusa`` (Medusa heads): vLLM's Medusa layout (``model_type: medusa``; ``blocks.{h}.layers.{l}``
  with biases, ``medusa_fc_bias: true``). Heads that project through the base ``lm_head`` get one ``lm_head`` for
  every head (``original_lm_head: true``): the base's, or its draft vocabulary's rows with ``truncated_vocab_size`` and
  ``token_map``, which is what vLLM 0.32 loads (it builds per-head ``lm_heads.{h}`` over the whole vocabulary only).
  Heads with ``lm_head``s of their own get ``lm_heads.{h}`` (over the draft vocabulary's rows where there is one: the
  layout vLLM describes, which 0.32's loader does not load; said when written). vLLM drafts a chain of each head's
  top-1 guess; trees, gate and lookup stay behind (vLLM 0.32 takes no draft tree: docs/checkpoints.md). Heads whose
  guesses read the drafted tokens or each other (Cerberus, Hydra, Clover) fit no engine's format and are refused.

What the engines do not use travels for this library, so that an export loaded back with ``from_pretrained`` decodes as
the folder it came from: the folder's decoding settings (copied prompt tokens, gate, trees: those that differ from the
defaults) under ``cerberus_hf`` in ``config.json``, a key the engines' config classes keep unused, and in the subfolder
``cerberus_hf/`` (never a top-level ``*.safetensors``, which vLLM and SGLang would load as weights) the n-gram rescorer,
the calibration positions and the calibration entries (`importing.carried_config`, `importing.CARRIED_FOLDER`).

The key maps are `importing`'s, which reads both layouts back (``from_pretrained`` on an export gives the same tensors).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from transformers.utils import logging

from ..blocks.ngram import NGRAM_WEIGHTS_NAME
from ..errors import UserError
from ..files import save_safetensors
from ..importing import (CARRIED_FOLDER, CARRIED_GENERATION_CONFIG, carried_config, eagle3_keys, foreign_config,
                         medusa_keys, medusa_projection_key)

logger = logging.get_logger(__name__)

SPECULATORS_VERSION = "0.9.0"
FORMATS = ("speculators", "vllm-medusa")


def add_cli(subparsers):
    """Register the ``export`` subcommand; returns its parser."""
    parser = subparsers.add_parser("export", help="write heads in a serving engine's format (EAGLE-3 for speculators/"
                                   "vLLM/SGLang, Medusa for vLLM)", description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", required=True, choices=FORMATS,
                        help="the layout to write: speculators (EAGLE-3 heads, which vLLM and SGLang serve) or "
                             "vllm-medusa (Medusa heads, vLLM)")
    parser.add_argument("heads", help="folder (or Hub id) of a cerberus-hf checkpoint")
    parser.add_argument("output", help="folder to write (must not exist or be empty)")
    parser.add_argument("--verifier", default=None,
                        help="the base's Hub id or folder as the engine should load it (default: the checkpoint's "
                             "base_model_name_or_path)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="dtype of the written tensors")
    parser.set_defaults(func=run_cli)
    return parser


def run_cli(args: argparse.Namespace) -> int:
    """Run the ``export`` subcommand from parsed arguments."""
    from ..configuration_cerberus import CerberusConfig
    from ..modeling_cerberus import CerberusForCausalLM

    output = Path(args.output)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise SystemExit(f"cerberus-hf export: {output} exists and is not an empty folder")
    if foreign_config(args.heads, {}) is None:  # a cerberus-hf folder: a family no format writes is refused unloaded
        check_family(args.format, CerberusConfig.from_pretrained(args.heads).head_type)
    model = CerberusForCausalLM.from_pretrained(args.heads)
    dtype = getattr(torch, args.dtype)
    if args.format == "speculators":
        written = export_speculators(model, output, verifier=args.verifier, dtype=dtype)
    else:
        written = export_vllm_medusa(model, output, dtype=dtype)
    print(f"{args.format} checkpoint written to {output}: {', '.join(sorted(written))}")
    return 0


def check_family(written: str, head_type: str) -> None:
    """Refuse heads of a family the format ``written`` cannot write (a `UserError`: the user chose the format and the heads)."""
    if written == "speculators" and head_type != "eagle3":
        raise UserError(f"--format speculators writes EAGLE-3 heads; these are {head_type}.")
    if written == "vllm-medusa" and head_type != "medusa":
        raise UserError(f"--format vllm-medusa writes Medusa heads (independent heads on the base's last state); "
                        f"these are {head_type}, which no serving engine's Medusa runs.")


def _draft_rows(model) -> torch.Tensor:
    """The draft vocabulary's token ids in ascending order (all ids without one)."""
    heads = model.heads
    if heads.draft_vocab is None:
        return torch.arange(model.config.vocab_size)
    return torch.sort(heads.draft_vocab.cpu()).values


def speculators_config(model, verifier: str | None, dtype: torch.dtype) -> dict:
    """The ``config.json`` of a speculators Eagle3 checkpoint for ``model``'s EAGLE-3 heads."""
    config, heads = model.config, model.heads
    base = model.base.config.get_text_config()
    layer = heads.layer
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": int(_draft_rows(model).numel()),
        "norm_before_residual": layer.norm_before_residual,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": list(heads.feature_layers),
        "embed_requires_grad": False,
        "tie_word_embeddings": False,
        "dtype": str(dtype).replace("torch.", ""),
        "transformer_layer_config": {
            "model_type": "llama", "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
            "intermediate_size": layer.mlp.up_proj.out_features, "num_hidden_layers": 1,
            "num_attention_heads": layer.num_heads, "num_key_value_heads": layer.kv_heads, "head_dim": layer.head_dim,
            "hidden_act": "silu", "rms_norm_eps": heads.norm.eps, "attention_bias": False, "mlp_bias": False,
            "max_position_embeddings": getattr(base, "max_position_embeddings", 8192), "tie_word_embeddings": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": float(layer.rope_theta)},
            "pad_token_id": base.pad_token_id,
        },
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": config.num_heads,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier or config.base_model_name_or_path,
                         "architectures": list(getattr(model.base.config, "architectures", None) or
                                               [type(model.base).__name__])},
        },
        **carried_config(config),  # speculators' config allows extra keys; vLLM's reads only the ones above
    }


def speculators_tensors(model, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The tensors of a speculators Eagle3 checkpoint for ``model``'s EAGLE-3 heads (see the module docstring)."""
    heads = model.heads
    check_family("speculators", heads.drafter_type)
    layer = heads.layer
    for norm in (layer.embed_norm, layer.hidden_norm, layer.post_norm):
        if norm.eps != heads.norm.eps:  # one rms_norm_eps in the layer config
            raise UserError("the drafter's norms use different epsilons; the Llama layer config has one.")
    rows = _draft_rows(model)
    t2d = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    t2d[rows] = True
    state = heads.state_dict()
    tensors = {"embed_tokens.weight": model.base.get_input_embeddings().weight.detach().cpu(),
               **{theirs: state[ours] for ours, theirs in eagle3_keys("speculators").items()},
               "lm_head.weight": _lm_head_rows(model, rows)}
    out = {name: t.detach().cpu().to(dtype).contiguous() for name, t in tensors.items()}
    if rows.numel() != model.config.vocab_size:
        out["d2t"] = (rows - torch.arange(rows.numel())).to(torch.int64)
        out["t2d"] = t2d
    return out


def _lm_head_rows(model, rows: torch.Tensor) -> torch.Tensor:
    """The rows ``rows`` (token ids) of the projection EAGLE-3 drafts through: the base ``lm_head``'s, or the drafter's
    own (whose rows over a draft vocabulary are that vocabulary's, in its order)."""
    heads = model.heads
    weight = heads.projection(0).weight.detach().cpu()
    if weight.shape[0] != model.config.vocab_size:  # an own lm_head over the draft vocabulary
        return weight[torch.argsort(heads.draft_vocab.cpu())]
    return weight[rows]


def export_speculators(model, output: Path, verifier: str | None = None, dtype: torch.dtype = torch.float32
                       ) -> list[str]:
    """Write ``model``'s EAGLE-3 heads as a speculators Eagle3 checkpoint in ``output``; returns the files written."""
    tensors = speculators_tensors(model, dtype)  # refuses other families before anything is written
    output.mkdir(parents=True, exist_ok=True)
    save_safetensors(tensors, output / "model.safetensors", metadata={"format": "pt"})
    (output / "config.json").write_text(json.dumps(speculators_config(model, verifier, dtype), indent=2) + "\n")
    return ["config.json", "model.safetensors", *write_carried(model, output)]


def write_carried(model, output: Path) -> list[str]:
    """Write into ``output``'s subfolder `CARRIED_FOLDER` what ``model`` holds beyond its config and heads that this
    library decodes with and no engine reads: the n-gram rescorer, the calibration positions, the calibration entries
    (a ``generation_config.json`` with ``cerberus_calibration``); returns the files written (none: no subfolder)."""
    entries = getattr(model.generation_config, "cerberus_calibration", None)
    if model.ngram is None and model.calibration_statistics is None and not entries:
        return []
    folder = output / CARRIED_FOLDER
    folder.mkdir(exist_ok=True)
    written = []
    if model.ngram is not None:
        model.ngram.save(folder / NGRAM_WEIGHTS_NAME)
        written.append(f"{CARRIED_FOLDER}/{NGRAM_WEIGHTS_NAME}")
    if model.calibration_statistics is not None:
        path = model.calibration_statistics.save(folder)
        written.append(f"{CARRIED_FOLDER}/{Path(path).name}")
    if entries:
        model.generation_config.save_pretrained(folder)
        written.append(f"{CARRIED_FOLDER}/{CARRIED_GENERATION_CONFIG}")
    return written


def vllm_medusa_tensors(model, dtype: torch.dtype = torch.float32) -> tuple[dict, dict[str, torch.Tensor]]:
    """(``config.json``, tensors) of vLLM's Medusa layout for ``model``'s Medusa heads (see the module docstring)."""
    heads, config = model.heads, model.config
    check_family("vllm-medusa", heads.drafter_type)
    rows = heads.draft_vocab.cpu() if heads.draft_vocab is not None else None
    state = heads.state_dict()
    tensors = {theirs: state[ours] for ours, theirs in medusa_keys("vllm-medusa", config.num_heads,
                                                                   config.num_layers).items()}
    shared = heads.lm_heads is None  # every head projects through the base lm_head: one `lm_head` in vLLM
    for h in range(1 if shared else config.num_heads):
        weight = heads.projection(h).weight.detach().cpu()
        name = "lm_head.weight" if shared else medusa_projection_key("vllm-medusa", h, config.num_layers)
        tensors[name] = weight[rows] if rows is not None else weight.clone()  # a copy: not the base's storage
    out = {name: t.detach().cpu().to(dtype).contiguous() for name, t in tensors.items()}
    vllm_config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": config.hidden_size,
                   "vocab_size": config.vocab_size, "num_heads": config.num_heads,
                   "num_hidden_layers": config.num_layers, "medusa_fc_bias": True,
                   "base_model_name_or_path": config.base_model_name_or_path,
                   **carried_config(config)}  # MedusaConfig keeps it as an attribute it never reads
    if shared:
        vllm_config["original_lm_head"] = True
    if rows is not None:
        vllm_config["truncated_vocab_size"] = int(rows.numel())
        out["token_map"] = rows.to(torch.int64)
    return vllm_config, out


def export_vllm_medusa(model, output: Path, dtype: torch.dtype = torch.float32) -> list[str]:
    """Write ``model``'s Medusa heads in vLLM's Medusa layout in ``output``; returns the files written."""
    vllm_config, tensors = vllm_medusa_tensors(model, dtype)
    if "token_map" in tensors and not vllm_config.get("original_lm_head"):
        logger.warning("cerberus-hf export: heads with lm_heads of their own over a draft vocabulary are written as "
                       "vLLM's layout describes them (lm_heads.{h} over truncated_vocab_size rows, token_map), which "
                       "vLLM 0.32's loader does not load (it builds each lm_heads.{h} over the whole vocabulary); "
                       "heads that project through the base lm_head load there.")
    output.mkdir(parents=True, exist_ok=True)
    save_safetensors(tensors, output / "model.safetensors", metadata={"format": "pt"})
    (output / "config.json").write_text(json.dumps(vllm_config, indent=2) + "\n")
    return ["config.json", "model.safetensors", *write_carried(model, output)]
