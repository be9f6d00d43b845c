"""Helper hostwino's GPU probe (notes/hostwino.md): the cached batch-1 Winograd call
(1x64x56x56, K 64, 3x3, pad 1; winograd_f4x4_3x3) in three GEMM modes, and the
pieces of one call, with dnnprims.bench.overhead.measure (host us per call with the
GPU held by a spin; GPU us per call by events; the fraction of bursts the spin
covered).  Rows as "ROW {json}", then a table.

    PYTHONPATH=$PWD python notes/hostwino_probe.py

Modes: "cupy" = CuPy's cuBLAS wrapper on CuPy's handle (main before this branch),
"ctypes" = our handle through ctypes, stream set when it changed, "graph" = the GEMM
as a CUDA graph over the kept workspace (the branch's default), "full" = the whole
call as a graph per pointer set (only with notes/wip/hostwino_full_graph_unverified.patch
applied).  "free us" is the same call timed without the spin (the old method)."""
import json
import time

import numpy as np


def main():
    import cupy as cp
    import dnnprims as dp
    from dnnprims import _cublas, _kernels, conv
    from dnnprims.algos import winograd, REGISTRY
    from dnnprims.bench.overhead import measure, per_call_us

    rows = []

    def row(**kw):
        rows.append(kw)
        print("ROW " + json.dumps(kw), flush=True)

    full = hasattr(winograd, "FULL_GRAPHS")   # notes/wip/hostwino_full_graph_unverified.patch applied

    def reset(mode):
        _cublas.DIRECT = mode != "cupy"
        winograd.GEMM_GRAPHS = mode in ("graph", "full")
        if full:
            winograd.FULL_GRAPHS = mode == "full"
        winograd._GEMM_RUN.clear()
        conv._MEMO.clear()
        for algorithm in REGISTRY.values():
            plans = getattr(algorithm, "_plans", None)
            if plans is not None:
                plans.clear()
        _kernels.release_outputs()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 64, 56, 56)).astype(np.float32)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    x32 = rng.standard_normal((32, 64, 56, 56)).astype(np.float32)
    gx, gw, gx32 = cp.asarray(x), cp.asarray(w), cp.asarray(x32)
    want = {"forward": dp.conv2d_forward(x.astype(np.float64), w.astype(np.float64), padding=1),
            "backward_data": dp.conv2d_backward_data(x.astype(np.float64), w.astype(np.float64), x.shape,
                                                     padding=1)}
    calls = {
        ("forward", 1): lambda: dp.conv2d_forward(gx, gw, padding=1),
        ("backward_data", 1): lambda: dp.conv2d_backward_data(gx, gw, x.shape, padding=1),
        ("forward", 32): lambda: dp.conv2d_forward(gx32, gw, padding=1),
    }
    print("auto picks:", dp.conv2d_choose(x.shape, w.shape, padding=1)[0],
          dp.conv2d_choose(x.shape, w.shape, padding=1, direction="backward_data")[0], flush=True)
    modes = ("cupy", "ctypes", "graph", "cupy", "graph") + (("full", "graph", "full") if full else ())
    for mode in modes:
        reset(mode)
        captures = _cublas.captures
        for (direction, n), fn in calls.items():
            got = None
            for _ in range(3):
                got = fn()
            err = None
            if n == 1:
                g = cp.asnumpy(got).astype(np.float64)
                err = float(np.linalg.norm(g - want[direction]) / np.linalg.norm(want[direction]))
            host, gpu, covered = measure(fn, cp, 1000)
            free = per_call_us(fn, cp, 1000)
            row(kind="call", mode=mode, direction=direction, n=n, host_us=host, gpu_us=gpu, covered=covered,
                err=err, free_us=free)
        row(kind="captures", mode=mode, captured=_cublas.captures - captures,
            failures=list(_cublas.CAPTURE_FAILURES), lib=bool(_cublas._library()), load_error=_cublas._LOAD_ERROR)

    # Pieces of one forward call (graph mode's plan).
    reset("graph")
    p = conv._describe(x.shape, w.shape, 1, 1, 1, 1, "NCHW", "float32")
    alg = REGISTRY["winograd_f4x4_3x3"]
    plan = alg._plan(p, "forward")
    run = alg.prepare(p, "forward")
    out = cp.empty(p.y_shape, cp.float32)
    for _ in range(3):
        run(gx, gw, out, None)
    ws = cp.empty(plan["elements"], cp.float32)
    base = ws.data.ptr
    head, b_off, mid, a_off, tail, c_off, last = plan["chunks"][0][6]
    args = (*head, base + b_off, *mid, base + a_off, *tail, base + c_off, *last)
    from cupy.cuda import device
    from cupy_backends.cuda.libs import cublas
    direct = _cublas.StridedBatched(np.float32)
    captured = direct.capture([args])
    graph = captured[0] if captured else None
    sgemm, handle = cublas.sgemmStridedBatched, device.get_cublas_handle
    slot = _kernels.WorkspaceSlot(plan["elements"], np.float32)
    output = _kernels.OutputSlot(p.y_shape, np.float32)
    key_args = (gx, gw, None, 1, 1, 1, 1, "NCHW", "auto", None, None, None, "default")
    pieces = {
        "prepared runner, graph mode (no key, no output slot)": lambda: run(gx, gw, out, None),
        "GEMM: CuPy wrapper + CuPy handle": lambda: sgemm(handle(), *args),
        "GEMM: ctypes, our handle": lambda: direct(*args),
        "GEMM: graph.launch()": (lambda: graph.launch()) if graph is not None else None,
        "conv._forward_key": lambda: conv._forward_key(*key_args),
        "_FAST.get(key)": (lambda k=conv._forward_key(*key_args): conv._FAST.get(k)),
        "OutputSlot": output,
        "WorkspaceSlot take + give_back": lambda: slot.give_back(slot.take()),
        "get_current_stream().ptr": lambda: cp.cuda.get_current_stream().ptr,
    }
    for name, fn in pieces.items():
        if fn is None:
            row(kind="piece", name=name, host_us=None)
            continue
        host, gpu, covered = measure(fn, cp, 1000)
        row(kind="piece", name=name, host_us=host, gpu_us=gpu, covered=covered)
    cp.cuda.Device().synchronize()

    print("\n== cached conv 3x3 (x n x64x56x56, K64), host us per call with the GPU held; GPU us per call")
    print(f"{'mode':7s} {'direction':14s} {'n':>3s} {'host us':>8s} {'GPU us':>8s} {'covered':>8s} {'rel err':>9s} "
          f"{'free us':>8s}")
    for r in rows:
        if r["kind"] == "call":
            err = f"{r['err']:9.1e}" if r["err"] is not None else f"{'-':>9s}"
            print(f"{r['mode']:7s} {r['direction']:14s} {r['n']:3d} {r['host_us']:8.1f} {r['gpu_us']:8.1f} "
                  f"{r['covered']:8.0%} {err} {r['free_us']:8.1f}")
        elif r["kind"] == "captures":
            print(f"  {r['mode']}: graphs captured {r['captured']}, failures {r['failures'][:1]}, "
                  f"ctypes lib {r['lib']} {r['load_error'] or ''}")
    print("== pieces (host us)")
    for r in rows:
        if r["kind"] == "piece":
            print(f"  {r['name']:54s} {r['host_us'] if r['host_us'] is None else round(r['host_us'], 2)}")


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"probe {time.time() - t0:.1f} s")
