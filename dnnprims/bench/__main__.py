"""Benchmark dnnprims against PyTorch (cuDNN) side by side in one process.

    python -m dnnprims.bench [conv|memory|rnn|all] [--quick] [--all-algos] [--json PATH]

Problems come from ``dnnprims/bench/problems.json`` (a copy of the project's
public problem list).  Everything is fp32, NCHW, random data (never zeros).
Both libraries run on the same device and stream; PyTorch sees our CuPy
arrays through DLPack (no copy).  cuDNN runs in benchmark mode with TF32 off,
and CuPy's own matmuls (SGEMM ceiling, the LSTM/GRU GEMMs) without TF32.

Every row records: our time and PyTorch's (median of repeated calls, CUDA
events, ``timing.measure``), their ratio (PyTorch time / ours: above 1 means
we are faster), the algorithm, the rate (TFLOP/s for convolution, GB/s over
the floor bytes for memory-bound operations, with the fraction of the copy
bandwidth measured in the same run), and the relative error against a float64
result.  A primitive that raises records the error text and the run goes on.
The summary table is printed last; ``--json`` writes every number and, where
matplotlib is importable, a plot next to it.

Without a GPU it runs the NumPy path (and PyTorch on the CPU where installed):
only a smoke test of this script, not a benchmark.
"""
import argparse
import functools
import json
import math
import os
import pathlib
import platform
import sys
import time
import traceback

os.environ["CUPY_TF32"] = "0"  # strict fp32 for CuPy's matmuls (the SGEMM ceiling, RNN GEMMs)

import numpy as np  # noqa: E402

import dnnprims as dp  # noqa: E402
from dnnprims.bench import timing  # noqa: E402
from dnnprims.testing import relative_error  # noqa: E402

PROBLEMS = pathlib.Path(__file__).with_name("problems.json")
DIRECTIONS = ("forward", "backward_data", "backward_filter")
F32 = 4  # bytes per element


# ------------------------------------------------------------------ devices

class Backend:
    """The array module we run on, and PyTorch on the same device (or None)."""

    def __init__(self, force_cpu=False):
        self.xp, self.gpu_name = np, None
        if not force_cpu:
            try:
                import cupy
                if cupy.cuda.runtime.getDeviceCount() > 0:
                    self.xp = cupy
                    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
                    name = props["name"]
                    self.gpu_name = name.decode() if isinstance(name, bytes) else str(name)
            except Exception:
                pass
        self.gpu = self.xp is not np
        try:
            import torch
        except ImportError:
            torch = None
        self.torch = torch
        if torch is not None:
            if self.gpu and not torch.cuda.is_available():
                self.torch = None
            else:
                torch.backends.cudnn.benchmark = True
                torch.backends.cudnn.allow_tf32 = False
                torch.backends.cuda.matmul.allow_tf32 = False
        self.torch_device = "cuda" if self.gpu else "cpu"
        self._copy_cache = {}

    def random(self, rng, shape, low=-1.0, high=1.0, dtype="float32"):
        """Fresh uniform data on the device (generated there in fp32: never zeros)."""
        if self.gpu:
            a = self.xp.random.random(shape, dtype=self.xp.float32)
            a *= high - low
            a += low
            return a if np.dtype(dtype) == np.float32 else a.astype(dtype)
        return rng.uniform(low, high, shape).astype(dtype)

    def to_torch(self, a):
        if a is None:
            return None
        if self.gpu:
            return self.torch.from_dlpack(a)
        return self.torch.from_numpy(a)

    def measure(self, fn, inputs=None, repeat=20):
        """Median ms, with fewer repeats for slow calls (about 300 ms per measurement)."""
        fn(*(inputs[0] if inputs else ()))  # first call: compilation, cuDNN autotuning
        t0 = time.perf_counter()
        fn(*(inputs[0] if inputs else ()))
        if self.gpu:
            self.xp.cuda.get_current_stream().synchronize()
        once_ms = (time.perf_counter() - t0) * 1e3
        repeat = int(max(3, min(repeat, 300 / max(once_ms, 1e-3))))
        return timing.measure(fn, inputs, xp=self.xp, warmup=2, repeat=repeat).median_ms

    def device_ms(self, fn, inputs=None):
        """(device ms of one call, covered): :func:`timing.measure_queued` behind the
        overhead benchmark's busy-wait kernel (GPU only)."""
        from .overhead import SPIN
        hold = lambda ns: SPIN.launch("spin_wait_ns", (1,), (1,), (np.int64(ns),))  # noqa: E731
        t, covered = timing.measure_queued(fn, inputs, xp=self.xp, hold=hold)
        return t.median_ms, covered

    def copy_ms(self, floor_bytes, repeat=20, device=False):
        """Time of one plain device-to-device copy moving ``floor_bytes`` (half read, half
        written: cudaMemcpyAsync on the current stream), timed like every row.

        The copy ceiling is measured on 1 GiB; a tensor of a few MB cannot reach it in one
        call, for us, PyTorch or a bare copy (launch latency and the per-call events cost
        microseconds while the bytes take a fraction of one), so each memory row also says
        what a copy of its own size reaches.  Cached per size."""
        each = max(int(floor_bytes) // 2, 1)
        key = (each, device)
        if key not in self._copy_cache:
            src, dst = self.xp.empty(each, self.xp.uint8), self.xp.empty(each, self.xp.uint8)
            src[...] = 1
            if self.gpu:
                copy = lambda: dst.data.copy_from_device_async(src.data, each)  # noqa: E731
            else:
                copy = lambda: np.copyto(dst, src)  # noqa: E731
            self._copy_cache[key] = self.device_ms(copy)[0] if device else self.measure(copy, None, repeat)
            del src, dst
        return self._copy_cache[key]

    def free(self):
        if self.gpu:
            self.xp.get_default_memory_pool().free_all_blocks()

    def describe(self):
        torch_text = "torch not installed" if self.torch is None else (
            f"torch {self.torch.__version__}" + (
                f", cuDNN {self.torch.backends.cudnn.version()} (benchmark mode, TF32 off)"
                if self.gpu else " on the CPU"))
        where = f"GPU {self.gpu_name}, CuPy {self.xp.__version__}" if self.gpu else \
            "NO GPU: NumPy reference path (smoke test only, not a benchmark)"
        return f"{where}; {torch_text}"


def _error_text(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]


# -------------------------------------------------------------- convolution

def _conv_problem(spec, dtype="float32"):
    from dnnprims.conv import _describe  # the library's own geometry checks
    pair = lambda v: (v, v)  # noqa: E731
    return _describe((spec["N"], spec["C"], spec["H"], spec["W"]),
                     (spec["K"], spec["C"] // spec["groups"], spec["R"], spec["S"]),
                     pair(spec["stride"]), pair(spec["pad"]), pair(spec["dilation"]),
                     spec["groups"], "NCHW", np.dtype(dtype))


def _conv_call(direction, problem, a, b, algo):
    opts = dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation,
                groups=problem.groups, algo=algo)
    if direction == "forward":
        return dp.conv2d_forward(a, b, **opts)
    if direction == "backward_data":
        return dp.conv2d_backward_data(a, b, problem.x_shape, **opts)
    return dp.conv2d_backward_filter(a, b, problem.w_shape, **opts)


def _torch_conv_call(torch, direction, problem, a, b):
    F = torch.nn.functional
    opts = dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation,
                groups=problem.groups)
    if direction == "forward":
        return F.conv2d(a, b, **opts)
    if direction == "backward_data":
        return torch.nn.grad.conv2d_input(problem.x_shape, b, a, **opts)
    return torch.nn.grad.conv2d_weight(a, problem.w_shape, b, **opts)


def _conv_operands(direction, x, w, dy):
    return {"forward": (x, w), "backward_data": (dy, w), "backward_filter": (x, dy)}[direction]


def _conv_reference(be, direction, problem, a, b):
    """The direction in float64: PyTorch on upcast inputs, else our direct algorithm
    in float64 (on the GPU), else the NumPy reference."""
    if be.torch is not None:
        ta, tb = be.to_torch(a).double(), be.to_torch(b).double()
        out = _torch_conv_call(be.torch, direction, problem, ta, tb)
        return out.cpu().numpy(), "torch fp64"
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return _conv_call(direction, problem, a64, b64, "direct" if be.gpu else "auto"), "dnnprims fp64"


def _conv_algorithms(problem, direction, all_algos):
    from dnnprims.algos import REGISTRY, choose
    names = ["auto"]
    if all_algos:
        names += [n for n, alg in REGISTRY.items() if alg.supports(problem, direction)[0]]
    auto = choose(problem, direction, "auto").name
    return names, auto


def bench_conv(be, specs, repeat, all_algos, rng):
    rows = []
    for spec in specs:
        try:
            problem = _conv_problem(spec)
        except Exception as e:
            rows.append({"kind": "conv", "name": spec["name"], "N": spec["N"], "error": _error_text(e)})
            continue
        flat = {"C": problem.C, "H": problem.H, "W": problem.W, "K": problem.K, "R": problem.R,
                "S": problem.S, "P": problem.P, "Q": problem.Q, "N": problem.N,
                "groups": problem.groups}
        flops = timing.conv_flops(flat)
        x = be.random(rng, problem.x_shape)
        w = be.random(rng, problem.w_shape, -0.1, 0.1)
        dy = be.random(rng, problem.y_shape)
        for direction in DIRECTIONS:
            a, b = _conv_operands(direction, x, w, dy)
            nbytes = timing.conv_bytes(flat, direction, F32)
            sets = timing.rotation_count(a.nbytes + b.nbytes)
            inputs = [(a, b)] + [(a.copy(), b.copy()) for _ in range(sets - 1)]
            base = {"kind": "conv", "name": spec["name"], "N": problem.N, "direction": direction,
                    "flops": flops, "bytes": nbytes, "input_sets": sets}
            try:
                names, auto = _conv_algorithms(problem, direction, all_algos)
            except Exception as e:
                rows.append({**base, "algo": "auto", "error": _error_text(e)})
                continue
            torch_ms = None
            if be.torch is not None:
                try:
                    t_inputs = [tuple(be.to_torch(v) for v in s) for s in inputs]
                    torch_ms = be.measure(lambda ta, tb: _torch_conv_call(be.torch, direction, problem,
                                                                          ta, tb), t_inputs, repeat)
                except Exception as e:
                    base["torch_error"] = _error_text(e)
            reference = None
            for algo in names:
                row = {**base, "algo": algo, "algorithm": auto if algo == "auto" else algo,
                       "torch_ms": torch_ms}
                try:
                    ms = be.measure(lambda p, q: _conv_call(direction, problem, p, q, algo), inputs, repeat)
                    out = _conv_call(direction, problem, a, b, algo)
                    if reference is None:
                        reference = _conv_reference(be, direction, problem, a, b)
                    row.update(ms=ms, tflops=timing.tflops(flops, ms),
                               ratio=(torch_ms / ms) if torch_ms else None,
                               rel_error=relative_error(out, reference[0]), error_vs=reference[1])
                    del out
                except Exception as e:
                    row["error"] = _error_text(e)
                rows.append(row)
            del inputs
        del x, w, dy
        be.free()
        _progress(rows[-1] if rows else None)
    return rows


# ------------------------------------------------------------ memory-bound
# Floor bytes: what a correct algorithm must read and write for a tensor too
# big for the cache (each pass over a tensor counts once per pass):
#   pool forward:            read x, write y
#   pool backward (max):     read x (the winner is recomputed from x) and dy, write dx
#   pool backward (avg):     read dy, write dx
#   batchnorm train forward: read x twice (statistics, then normalize), write y
#   batchnorm infer forward: read x, write y
#   batchnorm backward:      read x and dy twice (the two reductions, then dx), write dx
#                            (batchnorm: when the re-read inputs fit in L2 the second read
#                            comes from L2, and the floor is each tensor once: multi_pass_floor)
#   softmax forward:         read x, write y (online max and sum in one pass)
#   softmax backward:        read y and dy, write dx (a row fits on chip)
#   activation forward:      read x, write y;  backward: read x and dy, write dx
#   layer/RMS/group norm forward: read x, write y (a row fits on chip: statistics
#                            and normalization from one read)
#   layer/RMS/group norm backward: read x and dy, write dx (a row fits on chip); the
#                            parameter gradients, reduced over rows, can ride along.
#                            Ours moves 5x today: dgamma/dbeta re-read x and dy.
#   layout transform, add with a broadcast bias: read x, write y
#   reduction over most axes: read x
#   bias_activation:         as activation (the C bias values are not counted)
# "bytes_once" counts each input read once and each output written once, the
# accounting of ../shared/bench/ANCHORS.md.

def _memory_row(be, op, name, shape, floor, once, ours, theirs, check, repeat, inputs=None, torch_inputs=None):
    row = {"kind": "memory", "op": op, "name": name, "shape": list(shape),
           "bytes": floor, "bytes_once": once}
    try:
        row["ms"] = be.measure(ours, inputs, repeat)
        row["GBps"] = timing.gbps(floor, row["ms"])
    except Exception as e:
        row["error"] = _error_text(e)
    if be.torch is not None and theirs is not None:
        try:
            row["torch_ms"] = be.measure(theirs, torch_inputs, repeat)
            row["torch_GBps"] = timing.gbps(floor, row["torch_ms"])
            if "ms" in row:
                row["ratio"] = row["torch_ms"] / row["ms"]
        except Exception as e:
            row["torch_error"] = _error_text(e)
    if "ms" in row:
        try:
            row["copy_same_size_ms"] = be.copy_ms(floor, repeat)
            row["copy_same_size_GBps"] = timing.gbps(floor, row["copy_same_size_ms"])
        except Exception as e:
            row["copy_error"] = _error_text(e)
    if "ms" in row and be.gpu and floor <= timing.L2_BYTES:
        # A tensor that fits in L2 takes a few microseconds of device time; the per-call
        # timing above is then mostly host time and launch latency (ours, PyTorch's and the
        # copy's alike).  Device time of one call (20 calls queued behind a busy-wait, timed
        # back to back) says what the kernels do; "device_uncovered" lists the sides whose
        # bursts outlasted the wait (an upper bound there).  A failure is recorded, not an
        # error of the row.
        uncovered = []
        try:
            row["device_ms"], ok = be.device_ms(ours, inputs)
            uncovered += [] if ok else ["ours"]
            row["copy_same_size_device_ms"] = be.copy_ms(floor, device=True)
            if be.torch is not None and theirs is not None:
                row["torch_device_ms"], ok = be.device_ms(theirs, torch_inputs)
                uncovered += [] if ok else ["torch"]
        except Exception as e:
            row["device_error"] = _error_text(e)
        if uncovered:
            row["device_uncovered"] = uncovered
    if "ms" in row and check is not None:
        try:
            row["rel_error"] = check()
        except Exception as e:
            row["error"] = "check: " + _error_text(e)
    _progress(row)
    return row


def _host64(a):
    if hasattr(a, "get"):
        a = a.get()
    return np.array(a, dtype=np.float64)


def _sample_error(got, want_fn, *inputs, rows=8):
    """Relative error against the float64 reference on the first ``rows`` batch
    entries (full-size float64 references of these tensors would dominate the run)."""
    cut = lambda a: _host64(a[:rows])  # noqa: E731
    return relative_error(_host64(got[:rows]), want_fn(*(cut(a) for a in inputs)))


def _layout_of(s):
    """(layout, dtype, NCHW-view function for torch) of a problem: optional keys
    "layout" (NHWC: torch gets the channels-last view) and "dtype"."""
    layout, dtype = s.get("layout", "NCHW"), s.get("dtype", "float32")
    nchw = (lambda t: t.permute(0, 3, 1, 2)) if layout == "NHWC" else (lambda t: t)
    return layout, dtype, nchw


def _shape_of(s, layout):
    return (s["N"], s["C"], s["H"], s["W"]) if layout == "NCHW" else (s["N"], s["H"], s["W"], s["C"])


def bench_pool(be, specs, repeat, rng):
    rows = []
    for s in specs:
        layout, dtype, nchw = _layout_of(s)
        x = be.random(rng, _shape_of(s, layout), dtype=dtype)
        k, st, pad, mode = s["window"], s["stride"], s["pad"], s["mode"]
        opts = dict(mode=mode, stride=st, padding=pad, layout=layout)
        y = dp.pool(x, k, **opts)
        dy = be.random(rng, y.shape, dtype=dtype)
        tx, ty, tdy = None, None, None
        if be.torch is not None:
            tx, tdy = nchw(be.to_torch(x)), nchw(be.to_torch(dy))
            F = be.torch.nn.functional
            pool_t = (lambda a: F.max_pool2d(a, k, st, pad)) if mode == "max" else \
                (lambda a: F.avg_pool2d(a, k, st, pad, count_include_pad=True))
            tx_grad = tx.detach().clone().requires_grad_()
            ty = pool_t(tx_grad)
        fwd_floor = (x.nbytes + y.nbytes)
        bwd_floor = (x.nbytes if mode == "max" else 0) + dy.nbytes + x.nbytes
        bwd_once = dy.nbytes + x.nbytes + (x.nbytes + y.nbytes if mode == "max" else 0)
        rows.append(_memory_row(
            be, f"pool_{mode} forward", s["name"], x.shape, fwd_floor, fwd_floor,
            lambda: dp.pool(x, k, **opts),
            None if be.torch is None else (lambda: pool_t(tx)),
            lambda: _sample_error(dp.pool(x, k, **opts), lambda a: dp.pool(a, k, **opts), x), repeat))
        rows.append(_memory_row(
            be, f"pool_{mode} backward", s["name"], x.shape, bwd_floor, bwd_once,
            lambda: dp.pool_backward(dy, x, y, k, **opts),
            None if be.torch is None else
            (lambda: be.torch.autograd.grad(ty, tx_grad, tdy, retain_graph=True)),
            lambda: _sample_error(dp.pool_backward(dy, x, y, k, **opts),
                                  lambda d, a, b: dp.pool_backward(d, a, b, k, **opts), dy, x, y),
            repeat))
        del x, y, dy, tx, ty, tdy
        be.free()
    return rows


def bench_batchnorm(be, specs, repeat, rng):
    rows = []
    for s in specs:
        layout, dtype, nchw = _layout_of(s)
        shape = _shape_of(s, layout)
        C = s["C"]
        x, dy = be.random(rng, shape, dtype=dtype), be.random(rng, shape, dtype=dtype)
        gamma, beta = be.random(rng, (C,), 0.5, 1.5), be.random(rng, (C,), -0.5, 0.5)
        rm, rv = be.random(rng, (C,), -0.1, 0.1), be.random(rng, (C,), 0.5, 1.5)
        bn = functools.partial(dp.batchnorm, layout=layout)
        bn_backward = functools.partial(dp.batchnorm_backward, layout=layout)
        _, mean, invstd = bn(x, gamma, beta, training=True, return_stats=True)
        n = x.nbytes
        torch_fns = {}
        if be.torch is not None:
            torch, F = be.torch, be.torch.nn.functional
            tx, tg, tb, trm, trv, tdy = (be.to_torch(a) for a in (x, gamma, beta, rm.copy(), rv.copy(), dy))
            tx, tdy = nchw(tx), nchw(tdy)
            torch_fns["train"] = lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True)
            torch_fns["infer"] = lambda: F.batch_norm(tx, trm, trv, tg, tb, training=False)
            txg, tgg, tbg = (t.detach().clone().requires_grad_() for t in (tx, tg, tb))
            ty = F.batch_norm(txg, None, None, tgg, tbg, training=True)
            torch_fns["backward"] = lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True)
        scratch = (rm.copy(), rv.copy())
        # Two passes over x (x and dy backward) only when they do not fit in L2 (bn_r50_late does).
        train_floor = timing.multi_pass_floor(3 * n, 2 * n, reread_bytes=n)
        backward_floor = timing.multi_pass_floor(5 * n, 3 * n, reread_bytes=2 * n)
        rows.append(_memory_row(
            be, "batchnorm train forward", s["name"], shape, train_floor, 2 * n,
            lambda: bn(x, gamma, beta, *scratch, training=True), torch_fns.get("train"),
            lambda: relative_error(bn(x, gamma, beta, training=True),
                                   bn(_host64(x), _host64(gamma), _host64(beta), training=True)),
            repeat))
        rows.append(_memory_row(
            be, "batchnorm infer forward", s["name"], shape, 2 * n, 2 * n,
            lambda: bn(x, gamma, beta, rm, rv, training=False), torch_fns.get("infer"),
            lambda: _sample_error(bn(x, gamma, beta, rm, rv, training=False),
                                  lambda a: bn(a, _host64(gamma), _host64(beta), _host64(rm),
                                                         _host64(rv), training=False), x),
            repeat))
        rows.append(_memory_row(
            be, "batchnorm backward", s["name"], shape, backward_floor, 3 * n,
            lambda: bn_backward(dy, x, gamma, mean=mean, invstd=invstd),
            torch_fns.get("backward"),
            lambda: relative_error(bn_backward(dy, x, gamma, mean=mean, invstd=invstd)[0],
                                   bn_backward(_host64(dy), _host64(x), _host64(gamma))[0]),
            repeat))
        del x, dy, torch_fns
        be.free()
    return rows


# Problems may list "dtypes" (softmax) or "half_modes" (activation) to add
# float16/bfloat16 rows; the op label then ends in fp16/bf16.
_DTYPE_LABEL = {"float32": "", "float16": " fp16", "bfloat16": " bf16"}


def _random_typed(be, rng, shape, dtype, low=-1.0, high=1.0):
    """Uniform data in float32, float16 or bfloat16 (bfloat16 drawn by torch on the device
    where it can be, since CuPy has no bfloat16 random generator)."""
    from dnnprims import _dtypes
    if dtype == "float32":
        return be.random(rng, shape, low, high)
    if dtype == "float16":
        return be.random(rng, shape, low, high).astype(np.float16)
    if be.gpu and be.torch is not None:
        try:
            t = be.torch.empty(shape, dtype=be.torch.bfloat16, device="cuda").uniform_(low, high)
            return be.xp.from_dlpack(t.view(be.torch.int16)).view(_dtypes.BFLOAT16)
        except Exception:
            pass
    return be.xp.asarray(rng.uniform(low, high, shape).astype(_dtypes.BFLOAT16))


def _to_torch_typed(be, a):
    """A torch view of our array (bfloat16 through its 16-bit pattern: DLPack has no ml_dtypes)."""
    if a.dtype.name == "bfloat16":
        raw = a.view(be.xp.int16)
        return (be.torch.from_dlpack(raw) if be.gpu else be.torch.from_numpy(raw)).view(be.torch.bfloat16)
    return be.to_torch(a)


def bench_softmax(be, specs, repeat, rng):
    rows = []
    for s in specs:
        shape, axis = tuple(s["shape"]), s["axis"]
        for dtype in s.get("dtypes", ["float32"]):
            x = _random_typed(be, rng, shape, dtype, -4.0, 4.0)
            for log in (False, True):
                fwd, bwd = (dp.log_softmax, dp.log_softmax_backward) if log else (dp.softmax, dp.softmax_backward)
                label = ("log_softmax" if log else "softmax")
                y = fwd(x, axis=axis)
                dy = _random_typed(be, rng, shape, dtype)
                theirs_f = theirs_b = None
                if be.torch is not None:
                    torch = be.torch
                    tx, ty, tdy = (_to_torch_typed(be, a) for a in (x, y, dy))
                    if log:
                        theirs_f = lambda tx=tx: torch.log_softmax(tx, axis)  # noqa: E731
                        theirs_b = lambda tdy=tdy, ty=ty: torch._log_softmax_backward_data(  # noqa: E731
                            tdy, ty, axis, ty.dtype)
                    else:
                        theirs_f = lambda tx=tx: torch.softmax(tx, axis)  # noqa: E731
                        theirs_b = lambda tdy=tdy, ty=ty: torch._softmax_backward_data(  # noqa: E731
                            tdy, ty, axis, ty.dtype)
                suffix = _DTYPE_LABEL[dtype]
                for row in (
                        _memory_row(be, f"{label} forward{suffix}", s["name"], shape, 2 * x.nbytes, 2 * x.nbytes,
                                    lambda: fwd(x, axis=axis), theirs_f,
                                    lambda: _sample_error(fwd(x, axis=axis), lambda a: fwd(a, axis=axis), x),
                                    repeat),
                        _memory_row(be, f"{label} backward{suffix}", s["name"], shape, 3 * x.nbytes,
                                    3 * x.nbytes, lambda: bwd(dy, y, axis=axis), theirs_b,
                                    lambda: _sample_error(bwd(dy, y, axis=axis), lambda d, b: bwd(d, b, axis=axis),
                                                          dy, y),
                                    repeat)):
                    row["dtype"] = dtype
                    rows.append(row)
                del y, dy
            del x
            be.free()
    return rows


# Options per mode, and PyTorch's forward and backward for it (aten ops, no autograd overhead).
ACTIVATION_ALPHA = {"clipped_relu": 6.0}


def _torch_activation(torch, mode, alpha):
    F, aten = torch.nn.functional, torch.ops.aten
    return {
        "relu": (F.relu, lambda dy, x: aten.threshold_backward(dy, x, 0)),
        # sigmoid's backward takes y, which autograd saves: y is computed once up front in
        # _torch_backward, not inside the timed call (that added a forward pass to PyTorch's time).
        "sigmoid": (torch.sigmoid, None),
        "tanh": (torch.tanh, None),
        "elu": (F.elu, None),
        "gelu": (F.gelu, lambda dy, x: aten.gelu_backward(dy, x)),
        "silu": (F.silu, lambda dy, x: aten.silu_backward(dy, x)),
        "leaky_relu": (F.leaky_relu, lambda dy, x: aten.leaky_relu_backward(dy, x, 0.01, False)),
        "clipped_relu": (lambda x: F.hardtanh(x, 0.0, alpha),
                         lambda dy, x: aten.hardtanh_backward(dy, x, 0.0, alpha)),
    }[mode]


def _torch_backward(be, mode, alpha, f, b):
    """PyTorch's backward as a function of (dy, x): the aten op, or for the output-based
    derivatives (sigmoid, tanh, elu) the aten op on y = f(x) computed once up front."""
    if b is not None:
        return lambda tdy, tx: lambda: b(tdy, tx)  # noqa: E731
    aten = be.torch.ops.aten
    b_y = {"sigmoid": aten.sigmoid_backward, "tanh": aten.tanh_backward}.get(
        mode, lambda dy_, y_: aten.elu_backward(dy_, 1.0, 1, 1.0, True, y_))

    def make(tdy, tx):
        ty = f(tx)
        return lambda: b_y(tdy, ty)
    return make


def bench_activation(be, specs, repeat, rng):
    rows = []
    for s in specs:
        shape = tuple(s["shape"])
        runs = [("float32", m) for m in s["modes"]] + \
            [(d, m) for d in ("float16", "bfloat16") for m in s.get("half_modes", [])]
        data = {}
        for dtype, mode in runs:
            if dtype not in data:
                data = {dtype: (_random_typed(be, rng, shape, dtype, -3.0, 3.0), _random_typed(be, rng, shape, dtype))}
                be.free()
            x, dy = data[dtype]
            n = x.nbytes
            alpha = ACTIVATION_ALPHA.get(mode)
            theirs_f = theirs_b = None
            if be.torch is not None:
                tx, tdy = _to_torch_typed(be, x), _to_torch_typed(be, dy)
                f, b = _torch_activation(be.torch, mode, alpha)
                theirs_f = lambda f=f, tx=tx: f(tx)  # noqa: E731
                theirs_b = _torch_backward(be, mode, alpha, f, b)(tdy, tx)
            suffix = _DTYPE_LABEL[dtype]
            for row in (
                    _memory_row(be, f"activation {mode} forward{suffix}", s["name"], shape, 2 * n, 2 * n,
                                lambda: dp.activation(x, mode, alpha=alpha), theirs_f,
                                lambda: _sample_error(dp.activation(x, mode, alpha=alpha),
                                                      lambda a: dp.activation(a, mode, alpha=alpha), x, rows=1),
                                repeat),
                    _memory_row(be, f"activation {mode} backward{suffix}", s["name"], shape, 3 * n, 3 * n,
                                lambda: dp.activation_backward(dy, x, mode, alpha=alpha), theirs_b,
                                lambda: _sample_error(dp.activation_backward(dy, x, mode, alpha=alpha),
                                                      lambda d, a: dp.activation_backward(d, a, mode, alpha=alpha),
                                                      dy, x, rows=1),
                                repeat)):
                row["dtype"] = dtype
                rows.append(row)
        del data
        be.free()
    return rows


def _layer_norm_rows(be, s, repeat, rng, rms):
    shape = tuple(s["shape"])
    L = shape[-1]
    x, dy = be.random(rng, shape), be.random(rng, shape)
    gamma, beta = be.random(rng, (L,), 0.5, 1.5), be.random(rng, (L,), -0.5, 0.5)
    eps = 1e-5
    n = x.nbytes
    if rms:
        label = "rms_norm"
        ours_f = lambda: dp.rms_norm(x, L, gamma, eps=eps)  # noqa: E731
        _, rstd = dp.rms_norm(x, L, gamma, eps=eps, return_stats=True)
        ours_b = lambda: dp.rms_norm_backward(dy, x, L, gamma, eps=eps, rstd=rstd)  # noqa: E731
        ref_f = lambda a: dp.rms_norm(a, L, _host64(gamma), eps=eps)  # noqa: E731
        ref_b = lambda d, a: dp.rms_norm_backward(d, a, L, _host64(gamma), eps=eps)[0]  # noqa: E731
        err_b = lambda: _sample_error(ours_b()[0], ref_b, dy, x)  # noqa: E731
    else:
        label = "layer_norm"
        ours_f = lambda: dp.layer_norm(x, L, gamma, beta, eps=eps)  # noqa: E731
        _, mean, rstd = dp.layer_norm(x, L, gamma, beta, eps=eps, return_stats=True)
        ours_b = lambda: dp.layer_norm_backward(dy, x, L, gamma, eps=eps, mean=mean, rstd=rstd)  # noqa: E731
        ref_f = lambda a: dp.layer_norm(a, L, _host64(gamma), _host64(beta), eps=eps)  # noqa: E731
        ref_b = lambda d, a: dp.layer_norm_backward(d, a, L, _host64(gamma), eps=eps)[0]  # noqa: E731
        err_b = lambda: _sample_error(ours_b()[0], ref_b, dy, x)  # noqa: E731
    theirs_f = theirs_b = None
    if be.torch is not None:
        torch, F, aten = be.torch, be.torch.nn.functional, be.torch.ops.aten
        tx, tdy, tg, tb = (be.to_torch(a) for a in (x, dy, gamma, beta))
        if rms:
            theirs_f = lambda: F.rms_norm(tx, (L,), tg, eps)  # noqa: E731
            txg, tgg = (t.detach().clone().requires_grad_() for t in (tx, tg))
            ty = F.rms_norm(txg, (L,), tgg, eps)
            theirs_b = lambda: torch.autograd.grad(ty, (txg, tgg), tdy, retain_graph=True)  # noqa: E731
        else:
            theirs_f = lambda: F.layer_norm(tx, (L,), tg, tb, eps)  # noqa: E731
            _, tmean, trstd = aten.native_layer_norm(tx, [L], tg, tb, eps)
            theirs_b = lambda: aten.native_layer_norm_backward(  # noqa: E731
                tdy, tx, [L], tmean, trstd, tg, tb, [True, True, True])
    rows = [_memory_row(be, f"{label} forward", s["name"], shape, 2 * n, 2 * n, ours_f, theirs_f,
                        lambda: _sample_error(ours_f(), ref_f, x), repeat),
            _memory_row(be, f"{label} backward", s["name"], shape, 3 * n, 3 * n, ours_b, theirs_b, err_b,
                        repeat)]
    be.free()
    return rows


def bench_row_norms(be, specs, repeat, rng):
    """Layer norm and RMS norm over (rows, L); group norm over (N, C, H, W)."""
    rows = []
    for s in specs["layer_norm"]:
        rows += _layer_norm_rows(be, s, repeat, rng, rms=False)
    for s in specs["rms_norm"]:
        rows += _layer_norm_rows(be, s, repeat, rng, rms=True)
    for s in specs["group_norm"]:
        N, C, H, W, G = s["N"], s["C"], s["H"], s["W"], s["groups"]
        shape = (N, C, H, W)
        x, dy = be.random(rng, shape), be.random(rng, shape)
        gamma, beta = be.random(rng, (C,), 0.5, 1.5), be.random(rng, (C,), -0.5, 0.5)
        n = x.nbytes
        _, mean, rstd = dp.group_norm(x, G, gamma, beta, return_stats=True)
        theirs_f = theirs_b = None
        if be.torch is not None:
            F, aten = be.torch.nn.functional, be.torch.ops.aten
            tx, tdy, tg, tb = (be.to_torch(a) for a in (x, dy, gamma, beta))
            theirs_f = lambda: F.group_norm(tx, G, tg, tb, 1e-5)  # noqa: E731
            _, tmean, trstd = aten.native_group_norm(tx, tg, tb, N, C, H * W, G, 1e-5)
            theirs_b = lambda: aten.native_group_norm_backward(  # noqa: E731
                tdy, tx, tmean, trstd, tg, N, C, H * W, G, [True, True, True])
        g64, b64 = _host64(gamma), _host64(beta)
        rows.append(_memory_row(
            be, "group_norm forward", s["name"], shape, 2 * n, 2 * n,
            lambda: dp.group_norm(x, G, gamma, beta), theirs_f,
            lambda: _sample_error(dp.group_norm(x, G, gamma, beta), lambda a: dp.group_norm(a, G, g64, b64), x),
            repeat))
        rows.append(_memory_row(
            be, "group_norm backward", s["name"], shape, 3 * n, 3 * n,
            lambda: dp.group_norm_backward(dy, x, G, gamma, mean=mean, rstd=rstd), theirs_b,
            lambda: _sample_error(dp.group_norm_backward(dy, x, G, gamma, mean=mean, rstd=rstd)[0],
                                  lambda d, a: dp.group_norm_backward(d, a, G, g64)[0], dy, x),
            repeat))
        del x, dy
        be.free()
    return rows


def bench_tensor_ops(be, specs, repeat, rng):
    """Layout transform both ways, a broadcast bias add, a per-channel sum."""
    rows = []
    for s in specs:
        shape = tuple(s["shape"])
        x = be.random(rng, shape)
        nhwc = dp.transform_layout(x, "NCHW", "NHWC")
        bias = be.random(rng, (1, shape[1], 1, 1))
        n = x.nbytes
        t = {}
        if be.torch is not None:
            torch = be.torch
            tx, tn, tbias = be.to_torch(x), be.to_torch(nhwc), be.to_torch(bias)
            t["to_nhwc"] = lambda: tx.permute(0, 2, 3, 1).contiguous()  # noqa: E731
            t["to_nchw"] = lambda: tn.permute(0, 3, 1, 2).contiguous()  # noqa: E731
            t["add"] = lambda: torch.add(tx, tbias, alpha=1.0)  # noqa: E731
            t["sum"] = lambda: torch.sum(tx, dim=(0, 2, 3))  # noqa: E731
        rows.append(_memory_row(
            be, "transform NCHW->NHWC", s["name"], shape, 2 * n, 2 * n,
            lambda: dp.transform_layout(x, "NCHW", "NHWC"), t.get("to_nhwc"),
            lambda: _sample_error(dp.transform_layout(x, "NCHW", "NHWC"),
                                  lambda a: dp.transform_layout(a, "NCHW", "NHWC"), x), repeat))
        rows.append(_memory_row(
            be, "transform NHWC->NCHW", s["name"], shape, 2 * n, 2 * n,
            lambda: dp.transform_layout(nhwc, "NHWC", "NCHW"), t.get("to_nchw"),
            lambda: _sample_error(dp.transform_layout(nhwc, "NHWC", "NCHW"),
                                  lambda a: dp.transform_layout(a, "NHWC", "NCHW"), nhwc), repeat))
        rows.append(_memory_row(
            be, "add_tensor bias", s["name"], shape, 2 * n, 2 * n,
            lambda: dp.add_tensor(x, bias), t.get("add"),
            lambda: _sample_error(dp.add_tensor(x, bias), lambda a: dp.add_tensor(a, _host64(bias)), x), repeat))
        rows.append(_memory_row(
            be, "reduce_tensor sum (0,2,3)", s["name"], shape, n, n,
            lambda: dp.reduce_tensor(x, (0, 2, 3), "sum"), t.get("sum"),
            lambda: relative_error(dp.reduce_tensor(x, (0, 2, 3), "sum"),
                                   _host64(x).sum(axis=(0, 2, 3))), repeat))
        del x, nhwc
        be.free()
    return rows


# Fused bias + activation: y = act(x + bias[c]).  Floor: read x, write y (forward);
# read dy and x, write dx (backward; dbias is C values).  PyTorch runs it as two
# kernels forward (x + b, then act) and act's backward plus a sum over the
# non-channel axes for dbias.
def bench_bias_activation(be, specs, repeat, rng):
    rows = []
    for s in specs:
        N, C, H, W = s["shape"]
        for layout in s.get("layouts", ["NCHW"]):
            shape = (N, C, H, W) if layout == "NCHW" else (N, H, W, C)
            x, dy = be.random(rng, shape, -3.0, 3.0), be.random(rng, shape)
            bias = be.random(rng, (C,), -0.5, 0.5)
            bias64 = _host64(bias)
            n = x.nbytes
            if be.torch is not None:
                tx, tdy, tb = be.to_torch(x), be.to_torch(dy), be.to_torch(bias)
                tbv = tb.view((1, C, 1, 1) if layout == "NCHW" else (C,))
                tz = tx + tbv  # what autograd would have saved
                others = (0, 2, 3) if layout == "NCHW" else (0, 1, 2)
            for mode in s["modes"]:
                alpha = ACTIVATION_ALPHA.get(mode)
                kw = dict(alpha=alpha, layout=layout)
                theirs_f = theirs_b = None
                if be.torch is not None:
                    f, b = _torch_activation(be.torch, mode, alpha)
                    theirs_f = lambda f=f: f(tx + tbv)  # noqa: E731
                    if b is not None:
                        theirs_b = lambda b=b: b(tdy, tz).sum(others)  # noqa: E731
                rows.append(_memory_row(
                    be, f"bias_activation {mode} forward {layout}", s["name"], shape, 2 * n, 2 * n,
                    lambda: dp.bias_activation(x, bias, mode, **kw), theirs_f,
                    lambda: _sample_error(dp.bias_activation(x, bias, mode, **kw),
                                          lambda a: dp.bias_activation(a, bias64, mode, **kw), x, rows=1),
                    repeat))
                rows.append(_memory_row(
                    be, f"bias_activation {mode} backward {layout}", s["name"], shape, 3 * n, 3 * n,
                    lambda: dp.bias_activation_backward(dy, x, bias, mode, **kw), theirs_b,
                    lambda: _sample_error(dp.bias_activation_backward(dy, x, bias, mode, **kw)[0],
                                          lambda d, a: dp.bias_activation_backward(d, a, bias64, mode, **kw)[0],
                                          dy, x, rows=1),
                    repeat))
            del x, dy
            be.free()
    return rows


# --------------------------------------------------------------- recurrent

def bench_rnn(be, specs, repeat, rng):
    rows = []
    for s in specs:
        B, I, H = s["batch"], s["input"], s["hidden"]
        for cell, gates in (("lstm_cell", 4), ("gru_cell", 3)):
            x, h = be.random(rng, (B, I)), be.random(rng, (B, H))
            c = be.random(rng, (B, H))
            w_ih, w_hh = be.random(rng, (gates * H, I), -0.05, 0.05), be.random(rng, (gates * H, H), -0.05, 0.05)
            b_ih, b_hh = be.random(rng, (gates * H,), -0.1, 0.1), be.random(rng, (gates * H,), -0.1, 0.1)
            args = (x, h, c, w_ih, w_hh, b_ih, b_hh) if cell == "lstm_cell" else (x, h, w_ih, w_hh, b_ih, b_hh)
            fn = getattr(dp, cell)
            row = {"kind": "rnn", "op": f"{cell} forward", "name": f"B{B} I{I} H{H}",
                   "flops": 2 * B * gates * H * (I + H)}
            try:
                row["ms"] = be.measure(lambda: fn(*args), None, repeat)
                row["tflops"] = timing.tflops(row["flops"], row["ms"])
                got = fn(*args)
                want = fn(*(_host64(a) for a in args))
                got, want = (got[0], want[0]) if cell == "lstm_cell" else (got, want)
                row["rel_error"] = relative_error(got, want)
            except Exception as e:
                row["error"] = _error_text(e)
            if be.torch is not None:
                try:
                    torch = be.torch
                    module = (torch.nn.LSTMCell if cell == "lstm_cell" else torch.nn.GRUCell)(
                        I, H, device=be.torch_device)
                    with torch.no_grad():
                        module.weight_ih.copy_(be.to_torch(w_ih))
                        module.weight_hh.copy_(be.to_torch(w_hh))
                        module.bias_ih.copy_(be.to_torch(b_ih))
                        module.bias_hh.copy_(be.to_torch(b_hh))
                    tx, th, tc = be.to_torch(x), be.to_torch(h), be.to_torch(c)
                    state = (th, tc) if cell == "lstm_cell" else th

                    def theirs():
                        with torch.no_grad():
                            return module(tx, state)
                    row["torch_ms"] = be.measure(theirs, None, repeat)
                    if "ms" in row:
                        row["ratio"] = row["torch_ms"] / row["ms"]
                except Exception as e:
                    row["torch_error"] = _error_text(e)
            _progress(row)
            rows.append(row)
        be.free()
    return rows


# ------------------------------------------------------------------ output

_VERBOSE = True


def _progress(row):
    if _VERBOSE and row is not None:
        keys = ("kind", "name", "op", "N", "direction", "algo", "ms", "torch_ms", "ratio", "rel_error", "error")
        print("  " + ", ".join(f"{k}={_fmt(row[k])}" for k in keys if k in row), flush=True)


def _fmt(v, digits=3):
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.{digits}g}" if abs(v) < 1e-2 else f"{v:.{digits}f}"
    return str(v)


def _table(head, rows):
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    out = ["  ".join(str(h).ljust(w) for h, w in zip(head, widths)),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def _conv_means(conv):
    lines = []
    auto = [r for r in conv if r.get("algo") == "auto"]
    for key, label in (("direction", "direction"), ("N", "batch")):
        groups = {}
        for r in auto:
            groups.setdefault(r.get(key), []).append(r.get("ratio"))
        for value, ratios in groups.items():
            ok = [x for x in ratios if x]
            lines.append(f"  geomean cuDNN/ours, {label} {value}: {_fmt(timing.geometric_mean(ok), 3)} "
                         f"over {len(ok)} problems" + (f" (min {min(ok):.2f})" if ok else ""))
    worst = sorted((r for r in auto if r.get("ratio")), key=lambda r: r["ratio"])[:5]
    if worst:
        lines.append("  slowest vs cuDNN: " + "; ".join(
            f"{r['name']} N{r['N']} {r['direction']} {r['ratio']:.2f}" for r in worst))
    return lines


def _of_same_size_copy(r):
    """Our rate as a fraction of a plain copy of the row's own floor bytes (copy time / ours)."""
    return r["copy_same_size_ms"] / r["ms"] if r.get("copy_same_size_ms") and r.get("ms") else None


def _device_columns(r):
    """(PyTorch / ours, of same-size copy) in device time (rows that fit in L2), or "-"."""
    ours, torch_ms, copy_ms = r.get("device_ms"), r.get("torch_device_ms"), r.get("copy_same_size_device_ms")
    return (_fmt(torch_ms / ours if ours and torch_ms else None, 2),
            _fmt(copy_ms / ours if ours and copy_ms else None, 2))


def _error_of(r):
    return (r.get("error") or r.get("torch_error") or "")[:60]


def tables(result):
    """Every row, one table per kind (printed before the summary)."""
    lines = []
    copy = result.get("ceilings", {}).get("copy_GBps")
    conv = [r for r in result["rows"] if r["kind"] == "conv"]
    if conv:
        short = {"forward": "fwd", "backward_data": "bwd_data", "backward_filter": "bwd_filt"}
        rows = [(r["name"], r["N"], short.get(r.get("direction"), "-"), r.get("algorithm", r.get("algo", "-")),
                 _fmt(r.get("ms")), _fmt(r.get("torch_ms")), _fmt(r.get("ratio"), 2),
                 _fmt(r.get("tflops"), 3), _fmt(r.get("rel_error"), 2), _error_of(r)) for r in conv]
        lines += ["convolution, fp32 NCHW (ratio = cuDNN time / ours: > 1 means faster than cuDNN)",
                  _table(("problem", "N", "dir", "algorithm", "ours ms", "cuDNN ms", "ratio", "TFLOP/s",
                          "rel.err", "error"), rows), ""]
    memory = [r for r in result["rows"] if r["kind"] == "memory"]
    if memory:
        rows = [(r["op"], r["name"], _fmt(r.get("ms")), _fmt(r.get("torch_ms")), _fmt(r.get("ratio"), 2),
                 _fmt(r.get("GBps"), 4), _fmt(r["GBps"] / copy if copy and r.get("GBps") else None, 2),
                 _fmt(_of_same_size_copy(r), 2), _fmt(r.get("device_ms")), *_device_columns(r),
                 _fmt(r.get("rel_error"), 2), _error_of(r)) for r in memory]
        lines += ["memory-bound, fp32 NCHW unless the problem or op says fp16/bf16/_f16 or NHWC/_nhwc "
                  "(GB/s over the floor bytes; ratio = PyTorch time / ours)",
                  "(of copy: over the 1 GiB copy ceiling; of same-size copy: over a plain copy of the "
                  "row's floor bytes, timed the same way; device: rows that fit in L2, one call's device "
                  "time from 20 calls queued back to back behind a busy-wait -- ms, PyTorch / ours, of a same-size copy)",
                  _table(("op", "problem", "ours ms", "torch ms", "ratio", "GB/s", "of copy",
                          "of same-size copy", "device ms", "device ratio", "device of copy", "rel.err",
                          "error"), rows), ""]
    rnn = [r for r in result["rows"] if r["kind"] == "rnn"]
    if rnn:
        rows = [(r["op"], r["name"], _fmt(r.get("ms")), _fmt(r.get("torch_ms")), _fmt(r.get("ratio"), 2),
                 _fmt(r.get("rel_error"), 2), _error_of(r)) for r in rnn]
        lines += ["recurrent cells, fp32 (ratio = PyTorch time / ours)",
                  _table(("op", "problem", "ours ms", "torch ms", "ratio", "rel.err", "error"), rows), ""]
    return "\n".join(lines)


def summary(result):
    """The short summary printed last (the device tool shows the tail of the output)."""
    lines = ["== benchmark summary"]
    copy = result.get("ceilings", {}).get("copy_GBps")
    conv = [r for r in result["rows"] if r["kind"] == "conv"]
    if conv:
        lines.append("convolution (algo=auto):")
        lines += _conv_means(conv)
    memory = [r for r in result["rows"] if r["kind"] == "memory"]
    if memory:
        rows = [(r["op"], r["name"], _fmt(r.get("ratio"), 2),
                 _fmt(r["GBps"] / copy if copy and r.get("GBps") else None, 2),
                 _fmt(_of_same_size_copy(r), 2), *_device_columns(r), "ERROR" if "error" in r else "")
                for r in memory]
        lines.append(_table(("memory-bound op", "problem", "torch/ours", "of copy", "of same-size copy",
                             "device torch/ours", "device of same-size copy", ""), rows))
    rnn = [r for r in result["rows"] if r["kind"] == "rnn"]
    if rnn:
        lines.append(_table(("cell", "problem", "torch/ours", ""),
                            [(r["op"], r["name"], _fmt(r.get("ratio"), 2), "ERROR" if "error" in r else "")
                             for r in rnn]))
    c = result.get("ceilings")
    if c:
        lines.append(f"ceilings: copy {c['copy_GBps']:.0f} GB/s (read + write), SGEMM fp32 "
                     f"{c['sgemm_fp32_TFLOPs']:.1f} TFLOP/s (CUPY_TF32={c['CUPY_TF32']})")
    lines.append(result["device"])
    errors = [r for r in result["rows"] if "error" in r]
    if errors:
        lines.append(f"{len(errors)} rows recorded an error; first: {errors[0]['error']}")
    return "\n".join(lines)


def _plot(result, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    # A memory row whose correctness check failed keeps its times (and ratio): leave it out of the plot.
    rows = [r for r in result["rows"] if r.get("ratio") and "error" not in r
            and (r["kind"] != "conv" or r.get("algo") == "auto")]
    if not rows:
        return None
    labels = [f"{r['name']} N{r['N']} {r['direction']}" if r["kind"] == "conv" else f"{r['op']} {r['name']}"
              for r in rows]
    fig, ax = plt.subplots(figsize=(10, max(3, 0.22 * len(rows))))
    ax.barh(range(len(rows)), [r["ratio"] for r in rows], color="tab:blue")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("PyTorch (cuDNN) time / dnnprims time  (> 1: dnnprims faster)")
    ax.set_title(result["device"], fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def main(argv=None):
    global _VERBOSE
    parser = argparse.ArgumentParser(prog="python -m dnnprims.bench",
                                     description="Benchmark dnnprims against PyTorch/cuDNN.")
    parser.add_argument("suite", nargs="?", default="all", choices=("conv", "memory", "rnn", "all"))
    parser.add_argument("--quick", action="store_true",
                        help="fewer problems (batch 1 convolutions, one problem per memory-bound family) "
                             "and fewer repeats")
    parser.add_argument("--all-algos", action="store_true", help="also time every registry algorithm "
                        "that supports each convolution")
    parser.add_argument("--only", default=None, help="only problems whose name contains this text "
                        "(or any of several, comma-separated: --only rows_,act_)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many problems per family")
    parser.add_argument("--repeat", type=int, default=None, help="timed calls per measurement (median)")
    parser.add_argument("--json", default=None, help="write every number here (and a PNG plot beside it)")
    parser.add_argument("--cpu", action="store_true", help="run the NumPy path (a smoke test of this script)")
    parser.add_argument("--problems", default=str(PROBLEMS),
                        help="problem list (JSON, the format of dnnprims/bench/problems.json)")
    parser.add_argument("--quiet", action="store_true", help="no per-row progress lines")
    args = parser.parse_args(argv)
    _VERBOSE = not args.quiet

    be = Backend(force_cpu=args.cpu)
    problems = json.loads(pathlib.Path(args.problems).read_text())
    repeat = args.repeat or (10 if args.quick else 30)

    def select(family):
        specs = problems.get(family, [])
        if args.only:
            wanted = [w for w in args.only.split(",") if w]
            specs = [s for s in specs if any(w in s.get("name", "") for w in wanted)]
        if args.quick:
            specs = [s for s in specs if s.get("N", 1) == 1] if family == "conv2d" else specs[:1]
        return specs[:args.limit] if args.limit else specs

    result = {"device": be.describe(), "host": platform.node(), "python": sys.version.split()[0],
              "numpy": np.__version__, "dnnprims": dp.__version__, "suite": args.suite,
              "quick": args.quick, "repeat": repeat,
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": []}
    print(result["device"], flush=True)
    rng = np.random.default_rng(0)
    if be.gpu:
        try:
            result["ceilings"] = timing.measure_ceilings(be.xp)
        except Exception as e:
            result["ceilings_error"] = _error_text(e)
    steps = []
    if args.suite in ("conv", "all"):
        steps.append(lambda: bench_conv(be, select("conv2d"), repeat, args.all_algos, rng))
    if args.suite in ("memory", "all"):
        steps += [lambda: bench_pool(be, select("pool"), repeat, rng),
                  lambda: bench_batchnorm(be, select("batchnorm"), repeat, rng),
                  lambda: bench_softmax(be, select("softmax"), repeat, rng),
                  lambda: bench_activation(be, select("activation"), repeat, rng),
                  lambda: bench_row_norms(be, {k: select(k) for k in ("layer_norm", "rms_norm", "group_norm")},
                                          repeat, rng),
                  lambda: bench_tensor_ops(be, select("tensor_ops"), repeat, rng),
                  lambda: bench_bias_activation(be, select("bias_activation"), repeat, rng)]
    if args.suite in ("rnn", "all"):
        steps.append(lambda: bench_rnn(be, select("lstm"), repeat, rng))
    for step in steps:
        try:
            result["rows"] += step()
        except Exception as e:  # a family's set-up failed: record it, go on
            result["rows"].append({"kind": "setup", "error": _error_text(e)})
            traceback.print_exc()
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    if args.json:
        path = pathlib.Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        result["plot"] = _plot(result, path.with_suffix(".png"))
        path.write_text(json.dumps(result, indent=1, default=float))
    print()
    print(tables(result))
    print(summary(result))
    for r in result["rows"]:
        if r["kind"] == "setup":
            print("set-up error:", r["error"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
