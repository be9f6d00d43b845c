"""A/B of notes/wip/chsoft3x.patch (float32 channel softmax forward split over a thread-block
cluster, wider row pieces a tile; notes/chsoft3x.md): old (the tree before the patch:
softmax_forward_channels_floats, exact expf, 128-byte row pieces for 128 < n <= 256) vs the
cluster variants (CHANNEL_CLUSTER) vs PyTorch, in one process, float32 softmax / log_softmax
forward over dim 1 on
  64x256x56x56  the bench's channel_64x256x56x56 (the issue-5 row: 3x PyTorch <= 0.1396 ms)
  64x192x28x28  784 positions: partial last tiles for 128 / 256-position tiles, 192 channels
  32x256x29x31  899 positions (inner % 4 != 0): old = the shared-memory tile kernel, cl2 / cl4 =
                the cluster kernel's scalar variant, cl8 / *one = none (old's kernel)
Variants (CHANNEL_CLUSTER = (CL, TW, MINB, ONE)):  off = False (the patched tree without the
cluster: must be old, bitwise);  cl2 = (2, 16, 3, False): 256-byte row pieces;  cl4 =
(4, 32, 3, False) (the patch's default): 512 B, a warp access one 512-byte row piece;  cl8 =
(8, 64, 3, False): 1 KB;  cl2one / cl4one = cl2 / cl4 with one cluster exchange a tile
(offset-and-sum pairs) instead of two (max, then sum).  Checks before timing:
every variant's normwise error against float64 <= 2e-5 (tolerances.py float32 "default") and
<= 2 x old's + 1e-8; off bitwise old; failures print "CHECK FAILED" (again under the table)
and the timing goes on.  Floor: read x + write y = 2 x 4 bytes a value.
    python notes/chsoft3x_ab.py OLD_ROOT --json PATH
"""
import sys

sys.path.insert(0, "notes/ab")

import cupy as cp  # noqa: E402
import torch  # noqa: E402

import common  # noqa: E402
from dnnprims import softmaxes  # noqa: E402

SHAPES = {"64x256x56x56": (64, 256, 56, 56), "64x192x28x28": (64, 192, 28, 28), "32x256x29x31": (32, 256, 29, 31)}
VARIANTS = {"off": False, "cl2": (2, 16, 3, False), "cl4": (4, 32, 3, False), "cl8": (8, 64, 3, False),
            "cl2one": (2, 16, 3, True), "cl4one": (4, 32, 3, True)}
FAILED = []


def rel_err(out, ref64):
    """Normwise relative error against the float64 result."""
    d = torch.from_dlpack(out).double() - ref64
    return float(torch.linalg.vector_norm(d) / torch.linalg.vector_norm(ref64))


def main():
    old_root = sys.argv[1]
    json_path = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    old = common.load_old(old_root)
    assert "channels_cluster" not in open(f"{old_root}/kernels/softmax.cu").read(), "old must be unpatched"
    assert "softmax_forward_channels_cluster" in softmaxes.FAMILY.source, "new must be patched"
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
            exprs = {}
            for tag, switch in VARIANTS.items():
                fns[tag] = common.switched(softmaxes, lambda: ours_new(x, axis=1), CHANNEL_CLUSTER=switch)
                exprs[tag] = common.switched(softmaxes, lambda: softmaxes._plan("forward", log, shape, 1, x.dtype,
                                                                                 True)[0].split("<")[0][8:],
                                             CHANNEL_CLUSTER=switch)()
            fns["torch"] = lambda: tfwd(tx, 1)
            name = f"{op} fwd {label}"
            outs = {tag: fn() for tag, fn in fns.items()}
            errs = {tag: rel_err(v, want) for tag, v in outs.items()}
            diffs = {tag: common.max_abs(outs[tag], outs["old"]) for tag in VARIANTS}
            for tag in VARIANTS:
                if not (errs[tag] <= 2e-5 and errs[tag] <= 2 * errs["old"] + 1e-8):
                    FAILED.append(f"CHECK FAILED {name} {tag}: error {errs[tag]:.2e} (old {errs['old']:.2e})")
                    print(FAILED[-1], flush=True)
            if not cp.array_equal(outs["off"].view(cp.int32), outs["old"].view(cp.int32)):
                FAILED.append(f"CHECK FAILED {name} off: not bitwise old (max |diff| {diffs['off']:.2e})")
                print(FAILED[-1], flush=True)
            del outs
            note = ("err vs float64 (normwise): " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items())
                    + "; kernels: " + ", ".join(f"{k} {v}" for k, v in exprs.items()))
            rows.append(common.ab_problem(name, 2 * x.nbytes, fns, diffs, note))
        del x, tx, x64
    common.print_table(rows, copy, json_path)
    print()
    print("== summary (device ms, best round; (of copy) = floor at the copy bandwidth / device ms; x torch)")
    for r in rows:
        best = {tag: min(abs(v) for v in t["device"]) for tag, t in r["ms"].items() if t["device"]}
        floor_ms = r["floor_bytes"] / copy / 1e6
        print(f"{r['problem']:28s} " + "  ".join(
            f"{tag} {ms:.4f} ({floor_ms / ms:.3f})" for tag, ms in best.items() if tag != "copy"))
        if "torch" in best:
            print(f"{'':28s} x torch: " + "  ".join(f"{tag} {best['torch'] / ms:.3f}" for tag, ms in best.items()
                                                     if tag not in ("copy", "torch")))
    for line in FAILED:
        print(line)
    print("checks: " + ("all passed" if not FAILED else f"{len(FAILED)} FAILED"))


if __name__ == "__main__":
    main()
