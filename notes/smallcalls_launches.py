"""CPU: the launches (kernel, grid, block) that the small public problems plan, without a
GPU -- the batch-norm plan builders fed fake device arrays (the CPU tests' _FakeCupy), the pool
and softmax planners called directly.  Run in a tree with or without notes/wip/smallcalls.patch.
    PYTHONPATH=$PWD python notes/smallcalls_launches.py"""
import sys

import numpy as np

sys.path.insert(0, "tests")
import test_normalization as tn  # noqa: E402  (its _FakeCupy / _fake_device_array)
from dnnprims import normalization, pooling, softmaxes  # noqa: E402

captured = []


def capture(expression, grid, block, args, shared_mem=0, cooperative=False, fallback=None):
    captured.append((expression + (" [cooperative]" if cooperative else ""), grid, block))


normalization.FAMILY.prepare = capture
normalization.FAMILY.function = lambda expression: None
# The fused (cooperative) kernels size their grid by the resident blocks: a stand-in here.
normalization._resident_blocks = lambda cp, kernel: 2 * 132
for dtype in (np.float32, np.float16):
    pdtype = np.float32
    x = tn._fake_device_array((32, 2048, 49), dtype)
    for what, build in (
            ("train", lambda: normalization._build_forward_plan(tn._FakeCupy, x, x, pdtype, 2048, 32, 49, True, True,
                                                                0.1, 1e-5, False, False, True)),
            ("infer", lambda: normalization._build_forward_plan(tn._FakeCupy, x, x, pdtype, 2048, 32, 49, False,
                                                                False, 0.1, 1e-5, False, False, True)),
            ("backward", lambda: normalization._build_backward_plan(tn._FakeCupy, x, x, x, pdtype, 2048, 32, 49,
                                                                    False, 1e-5, False, True))):
        captured.clear()
        build()
        print(f"bn_r50_late {np.dtype(dtype).name:8s} {what:8s} {len(captured)} launch(es):",
              "; ".join(f"{e} grid {g} block {b}" for e, g, b in captured))
for direction in ("forward", "backward"):
    problem = pooling._check_problem(np.empty((32, 2048, 7, 7), np.float32), 7, "avg", 1, 0, True, "NCHW")
    plan = pooling._make_plan(problem, direction, True)
    print(f"global_avg_r50 float32 {direction}: {plan[0]} {plan[1]} grid {plan[2]} block ({pooling._BLOCK},)")
for direction in ("forward", "backward"):
    for log in (False, True):
        expr, grid, block, _, _ = softmaxes._plan(direction, log, (256, 1000), 1, np.dtype(np.float32), True)
        print(f"classifier_256x1000 {'log_softmax' if log else 'softmax'} {direction}: {expr} grid {grid} "
              f"block {block}")
