"""Where the register group-norm backward (gn_rows_backward_registers, REGISTER_BACKWARD)
wins in float32: the lead's sweep after call 3 (notes/gnbwd2.md "Result"), which measured
+8 % on 64x256x56x56 / 32 (K 8, 100 KB rows) and instance norm (12.5 KB), 2.6x on 4 KB rows,
but -7 % on 32x640x40x40 / 32 (K 20, 128 KB rows).  In ONE process on the library as it is
(no old tree): off = REGISTER_BACKWARD False (the shared-memory cluster kernel), on =
True with the shipped budget / items, 56K and i8 variants, and PyTorch.
    python notes/gnbwd2_sweep_ab.py [--json PATH]"""
import sys

sys.path.insert(0, "notes/ab")
import common  # noqa: E402

import cupy as cp  # noqa: E402
import torch  # noqa: E402

import dnnprims as dp  # noqa: E402
from dnnprims import row_normalization as rn  # noqa: E402

JSON = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
F = torch.nn.functional
SHAPES = [(32, 512, 40, 40), (32, 640, 40, 40), (32, 320, 64, 64), (16, 256, 80, 80), (64, 64, 56, 56),
          (32, 960, 28, 28), (8, 512, 64, 64), (64, 256, 56, 56)]


def problem(shape, G=32):
    rng = cp.random.default_rng(3)
    x = rng.random(shape, dtype=cp.float32) * 4 - 1
    dy = rng.random(shape, dtype=cp.float32) * 2 - 1
    gamma = rng.random(shape[1], dtype=cp.float32) + 0.5
    beta = rng.random(shape[1], dtype=cp.float32) - 0.5
    _, m, r = dp.group_norm(x, G, gamma, beta, return_stats=True)
    fn = lambda: dp.group_norm_backward(dy, x, G, gamma, mean=m, rstd=r)  # noqa: E731
    s = common.switched
    fns = {"old": s(rn, fn, REGISTER_BACKWARD=False),
           "on": s(rn, fn, REGISTER_BACKWARD=True),
           "on 56K": s(rn, fn, REGISTER_BACKWARD=True, REGISTER_BACKWARD_BYTES=56 * 1024),
           "on i8": s(rn, fn, REGISTER_BACKWARD=True, REGISTER_BACKWARD_ITEMS=8)}
    ref = fns["old"]()
    diffs = {}
    for tag in ("on", "on 56K", "on i8"):
        got = fns[tag]()
        diffs[tag] = max(common.max_abs(a, b) for a, b in zip(got, ref))
        scale = max(float(cp.abs(b).max()) for b in ref)
        assert diffs[tag] <= 1e-4 * max(scale, 1.0), (shape, tag, diffs[tag])
    tx, tdy = torch.as_tensor(x, device="cuda"), torch.as_tensor(dy, device="cuda")
    txg = tx.detach().clone().requires_grad_()
    tg = torch.as_tensor(gamma, device="cuda").requires_grad_()
    tb = torch.as_tensor(beta, device="cuda").requires_grad_()
    ty = F.group_norm(txg, G, tg, tb, 1e-5)
    fns["torch"] = lambda: torch.autograd.grad(ty, (txg, tg, tb), tdy, retain_graph=True)
    K, S = shape[1] // G, shape[2] * shape[3]
    name = f"gn_{'x'.join(map(str, shape))}_g{G} bwd"
    return common.ab_problem(name, 3 * x.nbytes, fns, diffs, f"K {K}, row {K * S * 4 // 1024} KB")


def main():
    copy = common.copy_gbps()
    rows = []
    for shape in SHAPES:
        rows.append(problem(shape))
        cp.get_default_memory_pool().free_all_blocks()
    common.print_table(rows, copy, JSON)


if __name__ == "__main__":
    main()
