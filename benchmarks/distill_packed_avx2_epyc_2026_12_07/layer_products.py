import time, statistics, torch
torch.set_num_threads(2)
L = 4
shapes = [(1536, 1536), (256, 1536), (256, 1536), (1536, 1536), (8960, 1536), (8960, 1536), (1536, 8960)]
W = [[torch.randn(o, i) for (o, i) in shapes] for _ in range(L)]
D = [[torch.ops.mkldnn._reorder_linear_weight(w, 8) for w in ws] for ws in W]
flops = sum(2 * o * i for o, i in shapes) * L
def t(f, reps=3):
    f(); xs = []
    for _ in range(reps):
        s = time.perf_counter(); f(); xs.append(time.perf_counter() - s)
    return statistics.median(xs)
for n in (1, 8, 32, 96, 192):
    xs = {i: torch.randn(n, i) for i in (1536, 8960)}
    lin = t(lambda: [torch.nn.functional.linear(xs[w.shape[1]], w) for ws in W for w in ws])
    dnn = t(lambda: [torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], p, None, "none", [], "") for ws, ps in zip(W, D) for w, p in zip(ws, ps)])
    print(f"M={n}: linear {lin/L*1e3:.1f} ms/layer ({flops*n/lin/1e9:.0f} GFLOPS), onednn packed {dnn/L*1e3:.1f} ms/layer ({flops*n/dnn/1e9:.0f} GFLOPS)", flush=True)
