"""Could an int8 product of the lm_head screen the vocabulary for greedy decoding, exact fp32 logits computed only for
the tokens it cannot rule out? Over real lm_head inputs of Qwen2.5-Coder-1.5B-Instruct (the float16 states that
`cerberus-hf distill --keep-states` kept, the first 25 answer positions of 12 ShareGPT answers) and its real lm_head:
the int8 product's largest error, the error bound that its quantization guarantees (weights' and activations' half
steps, through Hoelder's inequality), and how many tokens each bound leaves to compute exactly.

    python screen_bounds.py STATES_FOLDER > screen_bounds.txt
"""

import sys
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from cerberus_hf.real_models import QWEN_CODER_1_5B, converted_dir

warnings.filterwarnings("ignore")
torch.set_num_threads(1)


def candidates(approx: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """Per position, how many tokens might hold the largest logit: approx + bound reaches the best lower bound."""
    return (approx + bound >= (approx - bound).amax(1, keepdim=True)).sum(1).float()


def main(states_folder: str) -> None:
    with safe_open(converted_dir(QWEN_CODER_1_5B) / "model.safetensors", "pt") as weights:  # converted on first load
        weight = weights.get_tensor("lm_head.weight").float()
    files = sorted(Path(states_folder).glob("*.safetensors"))[:12]
    x = torch.cat([load_file(path)["hidden"][:25].float() for path in files])
    exact = x @ weight.T
    gap = exact.topk(2, dim=1).values.diff(dim=1).neg()
    print(f"{len(x)} positions; largest |activation| median {x.abs().amax(1).median():.1f}, max {x.abs().max():.1f};"
          f" top-1 minus top-2 logit: min {gap.min():.4f}, median {gap.median():.3f}")
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight.data = weight
    schemes = {"per-tensor": torch.ao.quantization.default_dynamic_qconfig,
               "per-channel": torch.ao.quantization.per_channel_dynamic_qconfig}
    for name, qconfig in schemes.items():
        int8 = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear: qconfig},
                                                      dtype=torch.qint8)[0]
        approx = torch.cat([int8(x[i : i + 1]) for i in range(len(x))])
        error = (approx - exact).abs()
        codes = int8.weight()
        per_channel = codes.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric)
        weight_step = codes.q_per_channel_scales().float() if per_channel else torch.full((len(weight),), codes.q_scale())
        activation_step = (x.clamp(min=0).amax(1) - x.clamp(max=0).amin(1)) / 127  # 7-bit activations (reduce_range)
        bound = (weight_step[None] / 2 * x.abs().sum(1, keepdim=True)
                 + activation_step[:, None] / 2 * codes.dequantize().abs().sum(1)[None])
        print(f"{name}: largest error {error.max():.3f} (median over positions {error.amax(1).median():.3f});"
              f" guaranteed bound median {bound.median():.2f}; int8 argmax = fp32 argmax at"
              f" {(approx.argmax(1) == exact.argmax(1)).float().mean():.1%}")
        print(f"  tokens left by the guaranteed bound: median {candidates(approx, bound).median():.0f},"
              f" max {candidates(approx, bound).max():.0f}")
        for times in (4, 8):
            observed = error.amax(1, keepdim=True) * times
            print(f"  by {times}x each position's observed error (no guarantee): median"
                  f" {candidates(approx, observed).median():.0f}, max {candidates(approx, observed).max():.0f}")


if __name__ == "__main__":
    main(sys.argv[1])
