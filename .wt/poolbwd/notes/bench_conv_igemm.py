"""Device script for notes/convolution.md: the conv problems of
dnnprims/bench/problems.json (batch 32 and 1), forward and backward data, fp32
NCHW, every implicit_gemm tile and "gemm" against PyTorch's cuDNN (benchmark
mode, TF32 off), timed with the one timing helper.  Prints a short table last;
writes every number to $OUT/conv_igemm.json."""
import json
import os
import sys

os.environ["CUPY_TF32"] = "0"
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import dnnprims as dp  # noqa: E402
from dnnprims.algos import REGISTRY  # noqa: E402
from dnnprims.bench import timing  # noqa: E402
from dnnprims.conv import _describe  # noqa: E402

torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
F = torch.nn.functional
DIRS = sys.argv[1].split(",") if len(sys.argv) > 1 else ["forward", "backward_data"]
ALGOS = ["auto"] + [a for a in REGISTRY if a.startswith("implicit_gemm") or a == "gemm"]
specs = json.load(open("dnnprims/bench/problems.json"))["conv2d"]


def ours(direction, p, a, b, algo):
    o = dict(stride=p.stride, padding=p.padding, dilation=p.dilation, groups=p.groups, algo=algo)
    if direction == "forward":
        return dp.conv2d_forward(a, b, **o)
    if direction == "backward_data":
        return dp.conv2d_backward_data(a, b, p.x_shape, **o)
    return dp.conv2d_backward_filter(a, b, p.w_shape, **o)


def theirs(direction, p, a, b):
    o = dict(stride=p.stride, padding=p.padding, dilation=p.dilation, groups=p.groups)
    if direction == "forward":
        return F.conv2d(a, b, **o)
    if direction == "backward_data":
        return torch.nn.grad.conv2d_input(p.x_shape, b, a, **o)
    return torch.nn.grad.conv2d_weight(a, p.w_shape, b, **o)


def rnd(shape, scale=1.0):
    return (cp.random.random(shape, dtype=cp.float32) * 2 - 1) * scale


rows = []
for spec in specs:
    p = _describe((spec["N"], spec["C"], spec["H"], spec["W"]),
                  (spec["K"], spec["C"] // spec["groups"], spec["R"], spec["S"]),
                  (spec["stride"],) * 2, (spec["pad"],) * 2, (spec["dilation"],) * 2,
                  spec["groups"], "NCHW", np.float32)
    x, w, dy = rnd(p.x_shape), rnd(p.w_shape, 0.1), rnd(p.y_shape)
    for d in DIRS:
        a, b = {"forward": (x, w), "backward_data": (dy, w), "backward_filter": (x, dy)}[d]
        sets = timing.rotation_count(a.nbytes + b.nbytes)
        inputs = [(a, b)] + [(a.copy(), b.copy()) for _ in range(sets - 1)]
        ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
        tin = [tuple(torch.from_dlpack(v) for v in s) for s in inputs]
        t_ms = timing.measure(lambda u, v: theirs(d, p, u, v), tin, xp=cp, warmup=3, repeat=20).median_ms
        ref = theirs(d, p, ta.double(), tb.double())
        row = dict(name=spec["name"], N=p.N, direction=d, cudnn_ms=t_ms, flops=p.flops, algos={})
        for algo in ALGOS:
            if algo != "auto" and not REGISTRY[algo].supports(p, d)[0]:
                continue
            try:
                ms = timing.measure(lambda u, v: ours(d, p, u, v, algo), inputs, xp=cp, warmup=3,
                                    repeat=20).median_ms
                out = torch.from_dlpack(ours(d, p, a, b, algo)).double()
                err = float((out - ref).norm() / ref.norm())
                row["algos"][algo] = dict(ms=ms, err=err)
            except Exception as e:  # noqa: BLE001
                row["algos"][algo] = dict(error=str(e)[:200])
        rows.append(row)
        del inputs, tin
    del x, w, dy
    cp.get_default_memory_pool().free_all_blocks()

out = os.environ.get("OUT", ".")
json.dump(rows, open(os.path.join(out, "conv_igemm.json"), "w"), indent=1)
print(f"{'problem':16s} {'N':>3s} {'dir':5s} {'best':22s} {'ours':>7s} {'cuDNN':>7s} {'ratio':>6s} {'TF/s':>5s} {'auto':>7s} {'gemm':>7s} err")
ratios = {}
for r in rows:
    ok = {k: v for k, v in r["algos"].items() if "ms" in v and k != "auto"}
    auto_ms = r["algos"].get("auto", {}).get("ms")
    if auto_ms:
        ratios.setdefault(("auto", r["direction"], r["N"]), []).append(r["cudnn_ms"] / auto_ms)
    if not ok:
        print(r["name"], r["N"], r["direction"], "no algorithm", r["algos"])
        continue
    best = min(ok, key=lambda k: ok[k]["ms"])
    ms = ok[best]["ms"]
    ratio = r["cudnn_ms"] / ms
    ratios.setdefault((r["direction"], r["N"]), []).append(ratio)
    ig = auto_ms or float("nan")
    gm = ok.get("gemm", {}).get("ms", float("nan"))
    print(f"{r['name']:16s} {r['N']:3d} {r['direction'][:5]:5s} {best:22s} {ms:7.3f} {r['cudnn_ms']:7.3f} "
          f"{ratio:6.2f} {timing.tflops(r['flops'], ms):5.1f} {ig:7.3f} {gm:7.3f} {max(v['err'] for v in ok.values()):.1e}")
for key, v in sorted(ratios.items()):
    print("geomean cuDNN/ours", "(auto)" if key[0] == "auto" else "(best of ours)", key, f"{timing.geometric_mean(v):.3f}", "min", f"{min(v):.2f}")
