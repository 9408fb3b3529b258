"""Times of one lm_head product the size of Qwen2.5-Coder-1.5B's (151,936 x 1,536, random weights) over 1-8 rows:
fp32 packed for oneDNN (for 1 and for 8 rows), oneDNN and MKL on the weight as it is, torch's dynamic int8 product
(fbgemm) and its plain int8 product (`torch._int_mm`). Medians of 7 after two warm-up calls, 2 threads.

    python kernel_times.py > kernel_times.txt
"""

import time
import warnings

import torch

warnings.filterwarnings("ignore")
torch.set_num_threads(2)
torch.manual_seed(0)
VOCAB, HIDDEN = 151936, 1536


def median_ms(fn, reps: int = 7) -> float:
    fn(), fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[reps // 2] * 1000


def main() -> None:
    weight = torch.randn(VOCAB, HIDDEN) * 0.02
    rows = {n: torch.randn(1, n, HIDDEN) for n in (1, 2, 5, 8)}
    pointwise = torch.ops.mkldnn._linear_pointwise
    for hint in (1, 8):
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, hint)
        for n, x in rows.items():
            print(f"fp32 packed for {hint} row(s), {n} rows: {median_ms(lambda: pointwise(x, packed, None, 'none', [], '')):.1f} ms")
        del packed
    for n in (1, 5):
        x = rows[n]
        print(f"fp32 oneDNN on the weight as it is, {n} rows: {median_ms(lambda: pointwise(x, weight, None, 'none', [], '')):.1f} ms")
        print(f"fp32 MKL (torch.nn.functional.linear), {n} rows: {median_ms(lambda: torch.nn.functional.linear(x, weight)):.1f} ms")
    linear = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    linear.weight.data = weight
    int8 = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear}, dtype=torch.qint8)
    for n in (1, 5, 8):
        x = rows[n][0]
        print(f"int8 dynamic (fbgemm), {n} rows: {median_ms(lambda: int8(x)):.1f} ms")
    codes = torch.randint(-127, 128, (VOCAB, HIDDEN), dtype=torch.int8).t()
    for n in (1, 5):
        x = torch.randint(-127, 128, (n, HIDDEN), dtype=torch.int8)
        print(f"int8 torch._int_mm, {n} rows: {median_ms(lambda: torch._int_mm(x, codes), reps=3):.1f} ms")


if __name__ == "__main__":
    main()
