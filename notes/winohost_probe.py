"""Where the host microseconds of a cached Winograd convolution go (issue 3),
and the A/B of the workspace reuse this session added, in one GPU process.

    python notes/winohost_probe.py            (the repository on PYTHONPATH)

Problem: the overhead bench's, x 1x64x56x56, w 64x64x3x3, pad 1 (the table
picks winograd_f4x4_3x3 for forward and backward data).  Each figure is
host us per call: bursts of 100 calls, synchronised between bursts, the
median of 20 bursts (dnnprims.bench.overhead.per_call_us).  The pieces are
timed on their own; the public calls with workspace reuse (WorkspaceSlot)
off (as before this session) and on, twice each, host and device time.
Last, a CUDA graph capture of the cuBLAS GEMM that prints why it fails
(every capture failed in session 5's run; notes/winohost.md).
Correctness: every setting's result against the float64 reference.
A short table is printed last.
"""
import time

import numpy as np

import cupy as cp
import dnnprims as dp
from dnnprims import _kernels, conv
from dnnprims.algos import REGISTRY, winograd
from dnnprims.bench.overhead import per_call_us

rows = []


def timed(name, fn):
    us = per_call_us(fn, cp, 2000)
    rows.append((name, us))
    print(f"{name:58s} {us:7.2f}", flush=True)
    return us


def main():
    f32 = np.float32
    rng = np.random.default_rng(0)
    x = cp.asarray(rng.standard_normal((1, 64, 56, 56), dtype=f32))
    w = cp.asarray(rng.standard_normal((64, 64, 3, 3), dtype=f32))
    want_f = dp.conv2d_forward(x.get().astype(np.float64), w.get().astype(np.float64), padding=1)
    want_d = dp.conv2d_backward_data(x.get().astype(np.float64), w.get().astype(np.float64), x.shape,
                                     padding=1)
    fwd = lambda: dp.conv2d_forward(x, w, padding=1)                      # noqa: E731
    bwd = lambda: dp.conv2d_backward_data(x, w, x.shape, padding=1)       # noqa: E731
    print("chosen:", dp.conv2d_choose(x.shape, w.shape, padding=1)[0],
          dp.conv2d_choose(x.shape, w.shape, padding=1, direction="backward_data")[0])

    # -- A/B of the public calls, twice, with a correctness check per setting
    errors = {}
    # (off, off) is the code before this session (a workspace allocated per call, cuBLAS called).
    # reuse off: the code before this session (a workspace allocated per call).
    for reuse in (False, True, False, True):
        if True:
            _kernels.set_workspace_reuse(reuse)
            tag = f"reuse={'on' if reuse else 'off'}"
            for name, fn, want in (("forward", fwd, want_f), ("backward_data", bwd, want_d)):
                for _ in range(3):
                    got = fn()
                cp.cuda.Device().synchronize()
                err = float(np.linalg.norm(got.get() - want) / np.linalg.norm(want))
                errors[(tag, name)] = err
                timed(f"public {name:13s} {tag}", fn)
                # Device time per call: 200 calls back to back between two events
                # (the host, at < 30 us a call, keeps ahead of ~40 us kernels).
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                for _ in range(200):
                    fn()
                end.record()
                end.synchronize()
                gpu_us = cp.cuda.get_elapsed_time(start, end) * 1e3 / 200
                rows.append((f"  device us/call, {name} {tag}", gpu_us))
                print(f"  device us/call {gpu_us:.2f}", flush=True)
    _kernels.set_workspace_reuse(True)
    print("relative errors:", {f"{k[1]} {k[0]}": f"{v:.1e}" for k, v in errors.items()})

    # -- the pieces of one cached forward call
    args = (x, w, None, 1, 1, 1, 1, "NCHW", "auto", None, None, None, "default")
    key = conv._forward_key(*args)
    timed("piece: conv._forward_key", lambda: conv._forward_key(*args))
    timed("piece: _FAST.get(key)", lambda: conv._FAST.get(key))
    run = conv._FAST[key]
    timed("piece: the fast closure (all of the call but the key)", lambda: run(x, w, None))
    slot = _kernels.OutputSlot((1, 64, 56, 56), f32)
    timed("piece: OutputSlot()", slot)
    algo = REGISTRY["winograd_f4x4_3x3"]
    problem = conv._MEMO.get(conv._MEMO.key("forward", (x, w, None), args[3:]))[0]
    plan = algo._plan(problem, "forward")
    wslot = _kernels.WorkspaceSlot(plan["elements"], plan["acc"])
    timed("piece: WorkspaceSlot take + give_back", lambda: wslot.give_back(wslot.take()))
    timed("piece: cupy.empty(workspace) (+ its free)", lambda: cp.empty(plan["elements"], plan["acc"]))
    from cupy.cuda import device
    timed("piece: device.get_cublas_handle()", device.get_cublas_handle)
    timed("piece: cupy.cuda.get_current_stream().ptr", lambda: cp.cuda.get_current_stream().ptr)
    ws = cp.empty(plan["elements"], plan["acc"])
    base = ws.data.ptr
    _, _, in_grid, in_args, out_grid, out_args, gemm = plan["chunks"][0]
    A = _kernels
    launch_in = winograd.FAMILY.prepare(plan["input"], in_grid, (256,),
                                        (A.ARRAY0, A.ARRAY4, plan["v_offset"], *in_args, A.ARRAY1,
                                         *plan["filter_args"]))
    y = cp.empty((1, 64, 56, 56), f32)
    launch_out = winograd.FAMILY.prepare(plan["output"], out_grid, (256,),
                                         (A.ARRAY4, plan["m_offset"], A.ARRAY1, np.int32(0), A.ARRAY2,
                                          *out_args, np.int32(1)))
    arrays = (x, w, y, None, ws)
    timed("piece: input-transform PreparedLaunch", lambda: launch_in(*arrays))
    timed("piece: output-transform PreparedLaunch", lambda: launch_out(*arrays))
    run_gemm = winograd._GEMM_RUN[plan["acc"]]
    head, b_off, mid, a_off, tail, c_off, last = gemm

    def gemm_direct():
        run_gemm(device.get_cublas_handle(), *head, base + b_off, *mid, base + a_off, *tail, base + c_off,
                 *last)
    timed("piece: raw cuBLAS sgemmStridedBatched (+ handle)", gemm_direct)
    timed("one cupy launch: relu via dp.activation (for scale)",
          (lambda a: (lambda: dp.activation(a, "relu")))(cp.empty((64, 1024), f32)))

    # -- why graph capture failed on the H100 (session 5: every capture did, the
    # exception unrecorded): capture the GEMM alone, print what is raised.  Last:
    # a `with stream` makes CuPy call cublasSetStream before every later cuBLAS call.
    side = cp.cuda.Stream(non_blocking=True)
    try:
        with side:
            side.begin_capture()
            try:
                gemm_direct()
            finally:
                graph = side.end_capture()
        graph.launch()
        cp.cuda.Device().synchronize()
        print("GEMM capture: ok")
        timed("piece: GEMM as a captured graph (Graph.launch)", graph.launch)
    except Exception as e:  # the diagnosis is the point
        print(f"GEMM capture failed: {type(e).__name__}: {e}")
    timed("piece: raw cuBLAS after a `with stream` (setStream each call)", gemm_direct)

    # -- the table
    print("\n== winohost probe: host us per call (H100 host)")
    for name, us in rows:
        print(f"  {name:58s} {us:7.2f}")
    print("  errors:", ", ".join(f"{k[1]}/{k[0]}: {v:.1e}" for k, v in errors.items()))


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"probe took {time.time() - t0:.1f} s")
