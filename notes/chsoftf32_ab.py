"""A/B of notes/wip/chsoftf32.patch (float32 channel softmax forward with fewer instructions,
notes/chsoftf32.md): old (the tree before the patch: softmax_forward_channels_packs) vs new
(FLOAT_FORWARD default = softmax_forward_channels_floats (8, 256, 3 blocks an SM, ex2)) and
its variants vs PyTorch, in one process, float32 softmax / log_softmax forward over dim 1 on
  64x256x56x56  the bench's channel_64x256x56x56 (6272 tiles of 32 positions x 256 channels)
  64x192x28x28  an odd one: 784 positions (a partial last tile of 16 every outer index), 192
                channels (each thread holds 6 of its 8 slots)
Variants (FLOAT_FORWARD):  new = True (8, 256, 3, True, False);  new4 = 4 blocks an SM (64
registers, spills);  newExpf = exp2 False (expf + IEEE 1 / s: bitwise old's results, so
old -> newExpf is the branch / address / reduction cut and newExpf -> new the exp);
newCs = new with .cs (evict-first) stores;  newW = 16 packs a thread, 2 blocks an SM: tiles
16 threads (256 bytes a row) wide, 64 KB (as the backward's 0.99-of-copy tiles).  Checks before timing: every variant's normwise
error against float64 (torch) <= 2e-5 (tolerances.py float32 "default") and <= 2 x old's
+ 1e-8, and newExpf bitwise equal to old; failures print "CHECK FAILED" (again under the
table) and the timing goes on.  Floor: read x + write y = 2 x 4 bytes a value.
    python notes/chsoftf32_ab.py OLD_ROOT --json PATH
"""
import sys

sys.path.insert(0, "notes/ab")

import cupy as cp  # noqa: E402
import torch  # noqa: E402

import common  # noqa: E402
from dnnprims import softmaxes  # noqa: E402

SHAPES = {"64x256x56x56": (64, 256, 56, 56), "64x192x28x28": (64, 192, 28, 28)}
VARIANTS = {"new": True, "new4": (8, 256, 4, True, False), "newExpf": (8, 256, 3, False, False),
            "newCs": (8, 256, 3, True, True), "newW": (16, 256, 2, True, False)}
FAILED = []


def rel_err(out, ref64):
    """Normwise relative error against the float64 result."""
    d = torch.from_dlpack(out).double() - ref64
    return float(torch.linalg.vector_norm(d) / torch.linalg.vector_norm(ref64))


def main():
    old_root = sys.argv[1]
    json_path = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    old = common.load_old(old_root)
    assert "channels_floats" not in open(f"{old_root}/kernels/softmax.cu").read(), "old must be unpatched"
    assert "softmax_forward_channels_floats" in softmaxes.FAMILY.source, "new must be patched"
    copy = common.copy_gbps()
    rows = []
    for label, shape in SHAPES.items():
        rng = cp.random.default_rng(7)
        x = (rng.random(shape, dtype=cp.float32) * 16 - 8).astype(cp.float32)
        tx = torch.from_dlpack(x)
        x64 = tx.double()
        for log in (False, True):
            op = "log_softmax" if log else "softmax"
            ours_new = softmaxes.log_softmax if log else softmaxes.softmax
            ours_old = old.log_softmax if log else old.softmax
            tfwd = torch.log_softmax if log else torch.softmax
            want = tfwd(x64, 1)
            fns = {"old": lambda: ours_old(x, axis=1)}
            for tag, switch in VARIANTS.items():
                fns[tag] = common.switched(softmaxes, lambda: ours_new(x, axis=1), FLOAT_FORWARD=switch)
            fns["torch"] = lambda: tfwd(tx, 1)
            name = f"{op} fwd {label}"
            expr = {tag: softmaxes._plan("forward", log, shape, 1, x.dtype, True)[0] for tag in ("new",)}
            outs = {tag: fn() for tag, fn in fns.items()}
            errs = {tag: rel_err(v, want) for tag, v in outs.items()}
            diffs = {tag: common.max_abs(outs[tag], outs["old"]) for tag in VARIANTS}
            for tag in VARIANTS:
                if not (errs[tag] <= 2e-5 and errs[tag] <= 2 * errs["old"] + 1e-8):
                    FAILED.append(f"CHECK FAILED {name} {tag}: error {errs[tag]:.2e} (old {errs['old']:.2e})")
                    print(FAILED[-1], flush=True)
            if not cp.array_equal(outs["newExpf"].view(cp.int32), outs["old"].view(cp.int32)):
                FAILED.append(f"CHECK FAILED {name} newExpf: not bitwise old (max |diff| {diffs['newExpf']:.2e})")
                print(FAILED[-1], flush=True)
            del outs
            note = ("err vs float64 (normwise): " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items())
                    + f"; new = {expr['new']}")
            rows.append(common.ab_problem(name, 2 * x.nbytes, fns, diffs, note))
        del x, tx, x64
    common.print_table(rows, copy, json_path)
    print()
    print("== summary (device ms, best round; of copy = floor at the copy bandwidth / device ms)")
    for r in rows:
        best = {tag: min(abs(v) for v in t["device"]) for tag, t in r["ms"].items() if t["device"]}
        floor_ms = r["floor_bytes"] / copy / 1e6
        print(f"{r['problem']:26s} " + "  ".join(
            f"{tag} {ms:.4f} ({floor_ms / ms:.3f})" for tag, ms in best.items() if tag != "copy"))
    for line in FAILED:
        print(line)
    print("checks: " + ("all passed" if not FAILED else f"{len(FAILED)} FAILED"))


if __name__ == "__main__":
    main()
