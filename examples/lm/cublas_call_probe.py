# The time per step of three fp32 cuBLAS products (addmm, and the two backward products) at the
# example's shapes, one line per process. Run on the GPU machine, once without and once with the
# deterministic mode's cuBLAS setting (cuBLAS reads it when its handle is made, so a process sets
# it before its first product):
#   env -u CUBLAS_WORKSPACE_CONFIG python3 cublas_call_probe.py
#   CUBLAS_WORKSPACE_CONFIG=:4096:8 python3 cublas_call_probe.py
#   CUBLAS_WORKSPACE_CONFIG=:4096:8 python3 cublas_call_probe.py det   # deterministic algorithms on
# A difference that stays the same from the smallest shape to the largest is a cost per call,
# not per FLOP. Warm-up outside the timed loop; each shape timed over 200 steps, synchronized.
import os
import sys
import time

import torch

if not torch.cuda.is_available():
    sys.exit("cublas_call_probe: no CUDA device; it cannot measure")
torch.manual_seed(0)
if len(sys.argv) > 1 and sys.argv[1] == "det":
    torch.use_deterministic_algorithms(True)
dev = "cuda"
res = []
for (m, k, n) in [(64, 32, 128), (64, 128, 32), (1024, 512, 2048), (1024, 2048, 512),
                  (1024, 512, 512), (16384, 512, 2048), (16384, 2048, 512)]:
    a = torch.randn(m, k, device=dev)
    b = torch.randn(k, n, device=dev)
    g = torch.randn(m, n, device=dev)
    bias = torch.randn(n, device=dev)

    def step():
        torch.addmm(bias, a, b)
        g @ b.t()
        a.t() @ g

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    iters = 200
    t = time.perf_counter()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    res.append(f"{m}x{k}x{n}: {(time.perf_counter() - t) / iters * 1e6:.1f} us")
print(os.environ.get("CUBLAS_WORKSPACE_CONFIG", "unset"), sys.argv[1:], "; ".join(res))
