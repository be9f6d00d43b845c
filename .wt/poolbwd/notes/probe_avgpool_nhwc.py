"""Probe: NHWC average-pool backward, ours (GPU, NumPy) vs torch (CUDA, CPU)."""
import numpy as np, cupy as cp, torch, torch.nn.functional as F
import dnnprims as dp

for (n, c, h, w, k, s, p) in [(2, 1, 10, 11, (4, 2), (3, 3), (2, 1)), (2, 3, 9, 8, 3, (1, 2), 1)]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, h, w, c))
    y = dp.pool(x, k, mode="avg", stride=s, padding=p, layout="NHWC")
    dy = rng.standard_normal(y.shape)
    ours_np = dp.pool_backward(dy, x, y, k, mode="avg", stride=s, padding=p, layout="NHWC")
    ours_gpu = dp.pool_backward(cp.asarray(dy), cp.asarray(x), None, k, mode="avg", stride=s, padding=p, layout="NHWC").get()
    res = {}
    for dev in ("cpu", "cuda"):
        for contig in (False, True):
            xt = torch.tensor(x, device=dev, requires_grad=True)
            yt = F.avg_pool2d(xt.permute(0, 3, 1, 2), k, s, p).permute(0, 2, 3, 1)
            g = torch.tensor(dy, device=dev)
            if contig:
                g = g.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)
            yt.backward(g)
            res[f"torch_{dev}_{'contig' if contig else 'nhwcgrad'}"] = xt.grad.cpu().numpy()
    print((n, c, h, w, k, s, p), "gpu-vs-numpy", np.abs(ours_gpu - ours_np).max(),
          {kk: float(np.abs(v - ours_np).max()) for kk, v in res.items()})
