"""Old (main's unpatched dnnprims/ + kernels/, copied aside by notes/ab/patch_ab.sh) against
new (this tree, notes/wip/biasact.patch applied) against PyTorch, in ONE process, on the
bench's problems (dnnprims/bench/problems.json):

- bias_act_64x256x56x56 backward (dx and dbias), float32, NCHW [64,256,56,56] and NHWC
  [64,56,56,256], relu and gelu: old *_planes / *_rows_packed, new *_plane_packs /
  *_rows_sweep (variant `new x2`, NHWC float32: the sweep on twice the resident grid);
  float16 gelu too (not a bench row: the same kernels at 8 values a pack).
  PyTorch as the bench runs it: the aten backward op on z = x + bias (what autograd
  saves, computed up front) and .sum over the non-channel axes.
- act_64x256x56x56 forward, float16 and bfloat16, relu and gelu: old 4 packs a thread and
  erff; new relu 1 pack a thread, new gelu gelu_one_exp at 4 packs a thread; variants
  `new U1` (gelu_one_exp, 1 pack a thread) and `new U4` (relu at 4: the unroll alone).

Before timing: dx of old and new must agree within the dtype's tolerance (the same
derivative_for: bit-identical expected, the row's note says), dbias within the tolerance
times sum |dx| of a channel (another summation order: the `diff` column); the 16-bit gelu forward
is checked against float64 (the GPU's float64 gelu, erf): the row's note gives max |y - y64|
in units of the 16-bit ulp at |y64| (new <= 1 asserted), old and new.  Table last.
    python notes/biasact_ab.py OLD_ROOT --json PATH"""
import sys

import cupy as cp
import torch

sys.path.insert(0, "notes/ab")
import common  # noqa: E402

import dnnprims as new  # noqa: E402
from dnnprims import activations as new_act  # noqa: E402
from dnnprims.testing.tolerances import tolerance  # noqa: E402

old = common.load_old(sys.argv[1])
from dnnprims_old import activations as old_act  # noqa: E402

assert old_act.__file__ != new_act.__file__
assert "rows_sweep" not in old_act.FAMILY.source, "old must be unpatched"
assert "rows_sweep" in new_act.FAMILY.source, "new must be patched"
print("old:", old_act.__file__, "new:", new_act.__file__, flush=True)
JSON = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None

F, aten = torch.nn.functional, torch.ops.aten
TORCH_BACKWARD = {"relu": lambda dy, z: aten.threshold_backward(dy, z, 0),
                  "gelu": lambda dy, z: aten.gelu_backward(dy, z)}
TORCH_FORWARD = {"relu": F.relu, "gelu": F.gelu}
COPY = common.copy_gbps()
print(f"copy {COPY:.0f} GB/s (1 GiB)", flush=True)
rows = []


def torch_view(a):
    """A torch view of a CuPy array (bfloat16 through its 16-bit pattern: DLPack has no ml_dtypes)."""
    if a.dtype.name == "bfloat16":
        return torch.from_dlpack(a.view(cp.int16)).view(torch.bfloat16)
    return torch.from_dlpack(a)


def to64(a):
    return cp.from_dlpack(torch_view(a).double())


def diff(a, b):
    return float(cp.abs(to64(a) - to64(b)).max())


def ulps(y, y64, dtype):
    """max |y - y64| over the 16-bit ulp at |y64| (2^-10 / 2^-7 relative, floor at the
    smallest normal)."""
    bits = 10 if dtype == "float16" else 7
    tiny = 2.0 ** -14 if dtype == "float16" else 2.0 ** -126
    y, y64 = to64(y), to64(y64)
    return float((cp.abs(y - y64) / (cp.maximum(cp.abs(y64), tiny) * 2.0 ** -bits)).max())


def bias_backward(dtype, layout, mode):
    shape = (64, 256, 56, 56) if layout == "NCHW" else (64, 56, 56, 256)
    C = 256
    x = (cp.random.random(shape, dtype=cp.float32) * 6 - 3).astype(dtype)
    dy = (cp.random.random(shape, dtype=cp.float32) * 2 - 1).astype(dtype)
    bias = (cp.random.random(C, dtype=cp.float32) - 0.5).astype(dtype)
    kw = dict(layout=layout)
    dx_old, db_old = old.bias_activation_backward(dy, x, bias, mode, **kw)
    dx_new, db_new = new.bias_activation_backward(dy, x, bias, mode, **kw)
    # the same expression; bit-identical unless the compiler contracts it differently
    dx_diff = common.max_abs(dx_new, dx_old)
    assert dx_diff <= tolerance(dtype) * float(cp.abs(dx_old).max()), f"{layout} {mode}: dx differs by {dx_diff}"
    db_diff = common.max_abs(db_new, db_old)
    others = (0, 2, 3) if layout == "NCHW" else (0, 1, 2)
    scale = float(cp.abs(dx_old.astype(cp.float64)).sum(axis=others).max())  # sum |dx| of a channel
    assert db_diff <= tolerance(dtype) * scale, \
        f"{layout} {mode}: dbias differs by {db_diff} (scale {scale})"
    del dx_old, dx_new
    tx, tdy, tb = (torch.from_dlpack(a) for a in (x, dy, bias))
    tz = tx + tb.view((1, C, 1, 1) if layout == "NCHW" else (C,))
    b = TORCH_BACKWARD[mode]
    fns = {"old": lambda: old.bias_activation_backward(dy, x, bias, mode, **kw),
           "new": lambda: new.bias_activation_backward(dy, x, bias, mode, **kw),
           "torch": lambda: b(tdy, tz).sum(others)}
    if layout == "NHWC" and dtype == "float32":
        # the sweep with twice the resident grid (blocks queue: a second wave, a tail)
        resident = new_act._resident_blocks
        fns["new x2"] = common.switched(new_act, fns["new"], _resident_blocks=lambda e: 2 * resident(e))
    label = {"float32": "fp32", "float16": "fp16"}[dtype]
    rows.append(common.ab_problem(f"bias bwd {layout} {mode} {label}", 3 * x.nbytes, fns,
                                  diffs={"new": db_diff}, note=f"diff = dbias; dx differs by {dx_diff:.1e}"))


def forward_16bit(dtype, mode):
    shape = (64, 256, 56, 56)
    t = torch.empty(shape, dtype=getattr(torch, dtype), device="cuda").uniform_(-3.0, 3.0)
    x = cp.from_dlpack(t.view(torch.int16)).view(new._dtypes.BFLOAT16) if dtype == "bfloat16" else cp.from_dlpack(t)
    y_old = old.activation(x, mode)
    y_new = new.activation(x, mode)
    fns = {"old": lambda: old.activation(x, mode), "new": lambda: new.activation(x, mode)}
    diffs = {"new": diff(y_new, y_old)}
    note = ""
    if mode == "gelu":
        fns["new U1"] = common.switched(new_act, fns["new"], FORWARD_UNROLL_16BIT=1)
        diffs["new U1"] = diff(fns["new U1"](), y_new)
        y64 = new.activation(to64(x), mode)
        e_old, e_new = ulps(y_old, y64, dtype), ulps(y_new, y64, dtype)
        note = f"err vs float64: old {e_old:.2f} ulp, new {e_new:.2f} ulp"
        assert e_new <= 1.0, note
        del y64
    else:
        assert diffs["new"] == 0.0, f"{dtype} {mode}: new differs from old"
        fns["new U4"] = common.switched(new_act, fns["new"], FORWARD_UNROLL_16BIT_RELU=4)
        diffs["new U4"] = diff(fns["new U4"](), y_old)
    del y_old, y_new
    tx = torch_view(x)
    f = TORCH_FORWARD[mode]
    fns["torch"] = lambda: f(tx)
    rows.append(common.ab_problem(f"act fwd {mode} {dtype}", 2 * x.nbytes, fns, diffs=diffs, note=note))


def free():
    cp.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()


for layout in ("NCHW", "NHWC"):
    for mode in ("relu", "gelu"):
        bias_backward("float32", layout, mode)
        free()
for dtype in ("float16", "bfloat16"):
    for mode in ("relu", "gelu"):
        forward_16bit(dtype, mode)
        free()
for layout in ("NCHW", "NHWC"):
    bias_backward("float16", layout, "gelu")
    free()

common.print_table(rows, COPY, JSON)
