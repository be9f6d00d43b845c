"""Device script for notes/conv_fft.md: FFT convolution ("fft", "fft_tiled") on
the large-filter problems of dnnprims/bench/problems.json against PyTorch's
cuDNN (benchmark mode, TF32 off) and our other algorithms, fp32 NCHW, timed
with the one timing helper; variants (plain cupy.fft + transposed copies,
power-of-two sizes, fixed tile sizes); a step profile of one forward call; and
the float32 error against float64 (PyTorch) on random N(0, 1) data.
Prints short tables; writes every number to $OUT/conv_fft.json.

    python notes/bench_conv_fft.py [time|profile|error ...]
"""
import json
import os
import sys

os.environ["CUPY_TF32"] = "0"
import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import dnnprims as dp  # noqa: E402
from dnnprims.algos import REGISTRY  # noqa: E402
from dnnprims.algos import fft as fft_algo  # noqa: E402
from dnnprims.bench import timing  # noqa: E402
from dnnprims.conv import _describe  # noqa: E402

torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
F = torch.nn.functional
DIRS = ("forward", "backward_data", "backward_filter")
WHAT = sys.argv[1:] or ["time", "profile", "error"]
OUT = os.environ.get("OUT", "out")
os.makedirs(OUT, exist_ok=True)
specs = [s for s in json.load(open("dnnprims/bench/problems.json"))["conv2d"]
         if s["name"] in ("big_7x7_s1", "big_11x11_s1", "alex_conv2_5x5")]
results = {"time": [], "profile": [], "error": []}


def problem_of(s):
    return _describe((s["N"], s["C"], s["H"], s["W"]), (s["K"], s["C"], s["R"], s["S"]),
                     (1, 1), (s["pad"], s["pad"]), (1, 1), 1, "NCHW", np.dtype(np.float32))


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


def operands(direction, x, w, dy):
    return {"forward": (x, w), "backward_data": (dy, w), "backward_filter": (x, dy)}[direction]


def ms(fn, inputs):
    fn(*inputs[0])
    return timing.measure(fn, inputs, xp=cp, warmup=2, repeat=15).median_ms


def pow2(n):
    return 1 << max(1, (n - 1).bit_length())


class Variant:
    """Module settings of fft.py for one timed variant (restored on exit)."""

    def __init__(self, **settings):
        self.settings = settings

    def __enter__(self):
        self.saved = {k: getattr(fft_algo, k) for k in self.settings}
        for k, v in self.settings.items():
            setattr(fft_algo, k, v)

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            setattr(fft_algo, k, v)


VARIANTS = {
    "fft": ("fft", {}),
    "fft/sf": ("fft", {"LAYOUT": "spatial_first"}),
    "fft/strided": ("fft", {"LAYOUT": "strided"}),
    "fft/plain": ("fft", {"LAYOUT": "plain"}),
    "fft_tiled": ("fft_tiled", {}),
    "tiled/sf": ("fft_tiled", {"LAYOUT": "spatial_first"}),
    "tiled64/sf": ("fft_tiled", {"LAYOUT": "spatial_first", "TILE_SIZES": (64,)}),
}


def rel(a, ref):
    a = cp.asnumpy(a).astype(np.float64) if isinstance(a, cp.ndarray) else a.detach().cpu().double().numpy()
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def time_all():
    rows = results["time"]
    for s in specs:
        p = problem_of(s)
        x = cp.random.standard_normal(p.x_shape, dtype=cp.float32)
        w = cp.random.standard_normal(p.w_shape, dtype=cp.float32) * 0.1
        dy = cp.random.standard_normal(p.y_shape, dtype=cp.float32)
        for d in DIRS:
            a, b = operands(d, x, w, dy)
            sets = timing.rotation_count(a.nbytes + b.nbytes)
            inputs = [(a, b)] + [(a.copy(), b.copy()) for _ in range(sets - 1)]
            t_in = [tuple(torch.from_dlpack(v) for v in t) for t in inputs]
            ref = theirs(d, p, *(torch.from_dlpack(v).double() for v in (a, b))).cpu().numpy()
            row = {"name": s["name"], "N": p.N, "direction": d,
                   "cudnn": ms(lambda q, r: theirs(d, p, q, r), t_in)}
            best = None
            for algo in ("implicit_gemm", "gemm"):
                if REGISTRY[algo].supports(p, d)[0]:
                    t = ms(lambda q, r: ours(d, p, q, r, algo), inputs)
                    best = t if best is None else min(best, t)
            row["best_gemm"] = best
            for name, (algo, settings) in VARIANTS.items():
                with Variant(**settings):
                    try:
                        row[name] = ms(lambda q, r: ours(d, p, q, r, algo), inputs)
                        row[name + ":err"] = rel(ours(d, p, a, b, algo), ref)
                    except Exception as e:  # noqa: BLE001 - report, keep timing the rest
                        row[name] = None
                        row[name + ":error"] = f"{type(e).__name__}: {e}"[:200]
                    cp.get_default_memory_pool().free_all_blocks()
            row["ws_fft_MB"] = REGISTRY["fft"].workspace_bytes(p, d) / 2**20
            row["ws_tiled_MB"] = REGISTRY["fft_tiled"].workspace_bytes(p, d) / 2**20
            rows.append(row)
            print(json.dumps(row), flush=True)
            del inputs, t_in
        del x, w, dy
        cp.get_default_memory_pool().free_all_blocks()


def profile():
    """Each step of one "fft" forward call of big_7x7_s1 (N=32), alone, per buffer layout."""
    s = [s for s in specs if s["name"] == "big_7x7_s1" and s["N"] == 32][0]
    p = problem_of(s)
    x = cp.random.standard_normal(p.x_shape, dtype=cp.float32)
    w = cp.random.standard_normal(p.w_shape, dtype=cp.float32)
    g = REGISTRY["fft"].geometry(p, "forward")
    T = g.T
    flops = 8 * g.frequencies * p.N * p.C * p.K
    for layout in fft_algo.LAYOUTS:
        with Variant(LAYOUT=layout):
            sf = layout == "spatial_first"
            steps = {}
            steps["filter spectrum"] = lambda: fft_algo._filter_spectrum(cp, w, T, cp.complex64)
            G = steps["filter spectrum"]()
            steps["input window"] = lambda: fft_algo._input_tiles(cp, x, g, 0, p.N, 0, 1, sf)
            tiles = steps["input window"]()
            steps["input spectrum"] = lambda: fft_algo._spectrum(cp, tiles)
            X = steps["input spectrum"]()
            steps["complex GEMM"] = lambda: cp.matmul(X, G)
            Y = steps["complex GEMM"]()
            steps["inverse + copy of Y"] = lambda: fft_algo._inverse(cp, Y.copy(), T, cp.float32)
            steps["copy of Y (subtract)"] = lambda: Y.copy()
            y = fft_algo._inverse(cp, Y.copy(), T, cp.float32)
            out = cp.empty(p.y_shape, cp.float32)
            steps["crop"] = lambda: out.__setitem__(Ellipsis, y[:, :, :p.P, :p.Q])
            steps["whole forward"] = lambda: dp.conv2d_forward(x, w, padding=3, algo="fft")
            for name, fn in steps.items():
                t = ms(lambda: fn(), [()])
                row = {"layout": layout, "step": name, "ms": t, "T": T, "F": g.frequencies}
                if name == "complex GEMM":
                    row["tflops"] = flops / t / 1e9
                results["profile"].append(row)
                print(json.dumps(row), flush=True)


def error():
    """float32 "fft"/"fft_tiled" against float64 (PyTorch), random N(0, 1),
    channel counts up to 512, FFT sizes 16..~230, and inputs of wide dynamic
    range (per-channel scales 10^U(-3, 3), and a +100 offset)."""
    rng = cp.random.RandomState(7)
    configs = [(1, 512, 224, 16, 7, "normal"), (2, 512, 64, 16, 11, "normal"),
               (2, 64, 56, 16, 7, "scaled"), (2, 64, 56, 16, 7, "offset")]
    torch.backends.cudnn.benchmark = False  # no autotuning of the float64 reference
    for N, C, H, K, R, kind in configs:
        p = _describe((N, C, H, H), (K, C, R, R), (1, 1), (R // 2, R // 2), (1, 1), 1, "NCHW",
                      np.dtype(np.float32))
        x = rng.standard_normal(p.x_shape, dtype=cp.float32)
        w = rng.standard_normal(p.w_shape, dtype=cp.float32)
        dy = rng.standard_normal(p.y_shape, dtype=cp.float32)
        if kind == "scaled":
            x *= (10.0 ** rng.uniform(-3, 3, (1, C, 1, 1))).astype(cp.float32)
            dy *= (10.0 ** rng.uniform(-3, 3, (1, K, 1, 1))).astype(cp.float32)
        elif kind == "offset":
            x += 100
        for d in DIRS:
            a, b = operands(d, x, w, dy)
            ref = theirs(d, p, *(torch.from_dlpack(v).double() for v in (a, b))).cpu().numpy()
            row = {"N": N, "C": C, "H": H, "K": K, "R": R, "kind": kind, "direction": d}
            for algo in ("fft", "fft_tiled", "implicit_gemm", "gemm"):
                if REGISTRY[algo].supports(p, d)[0]:
                    row[algo] = rel(ours(d, p, a, b, algo), ref)
                    row[algo + ":T"] = REGISTRY[algo].geometry(p, d).T if algo.startswith("fft") else None
            results["error"].append(row)
            print(json.dumps(row), flush=True)
        cp.get_default_memory_pool().free_all_blocks()


for what in WHAT:
    {"time": time_all, "profile": profile, "error": error}[what]()
    json.dump(results, open(os.path.join(OUT, "conv_fft.json"), "w"), indent=1)

print("\n== FFT summary (ms; ratio = cuDNN / ours)")
for r in results["time"]:
    best = min((r[k], k) for k in VARIANTS if r.get(k))
    print(f"{r['name']:15s} N={r['N']:2d} {r['direction']:15s} cuDNN {r['cudnn']:.3f} gemm* {r['best_gemm'] or 0:.3f} "
          + " ".join(f"{k} {r[k]:.3f}" if r.get(k) else f"{k} -" for k in VARIANTS)
          + f" | best {best[1]} x{r['cudnn'] / best[0]:.2f} err {r.get('fft:err', 0):.1e}")
for r in results["profile"]:
    print(f"profile {r['layout']:13s} {r['step']:22s} {r['ms']:.3f} ms" + (f" ({r['tflops']:.1f} TFLOP/s)" if "tflops" in r else ""))
if results["error"]:
    worst = {}
    for r in results["error"]:
        for algo in ("fft", "fft_tiled", "implicit_gemm", "gemm"):
            if algo in r:
                key = (algo, r["kind"])
                worst[key] = max(worst.get(key, 0), r[algo])
    print("worst relative error:", {f"{a}/{k}": f"{v:.2e}" for (a, k), v in sorted(worst.items())})
