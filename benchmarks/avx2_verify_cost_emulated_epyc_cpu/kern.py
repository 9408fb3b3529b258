"""fp32 linear layers of SmolLM2's shapes at M = 1, 2, 4, 8, 16 rows: plain F.linear, oneDNN packed, MKL packed."""
import time, statistics, torch
import torch.nn.functional as F
torch.set_num_threads(2)
shapes = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]  # q/o, k/v, gate/up, down, lm_head
counts = [2 * 30, 2 * 30, 2 * 30, 30, 1]
ws = [torch.randn(o, i) * 0.02 for o, i in shapes]
# packed as cerberus_hf.blocks.packed packs them (its rows hint, 8)
dnn = [torch.ops.mkldnn._reorder_linear_weight(w, 8) for w in ws]
mkl = [torch.ops.mkl._mkl_reorder_linear_weight(w, 16) for w in ws]

def timed(fn, reps=30):
    for _ in range(3): fn()
    out = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); out.append(time.perf_counter() - t)
    return statistics.median(out)

for M in (1, 2, 4, 8, 16):
    xs = [torch.randn(M, i) for o, i in shapes]
    row = {}
    for name, f in (("linear", lambda x, k: F.linear(x, ws[k])),
                    ("onednn", lambda x, k: torch.ops.mkldnn._linear_pointwise(x, dnn[k], None, "none", [], "")),
                    ("mkl", lambda x, k: torch.ops.mkl._mkl_linear(x, mkl[k], ws[k], None, M))):
        total = sum(c * timed(lambda: f(x, k)) for k, (x, c) in enumerate(zip(xs, counts)))
        row[name] = round(total * 1e3, 2)
    print(M, row, flush=True)
