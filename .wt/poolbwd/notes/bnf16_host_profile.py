"""Host time of channel-last (NHWC) batch-norm calls on a machine WITHOUT a GPU
(helper bnf16): notes/host_profile_cpu.py's fake CuPy, plus stubs for the
cooperative launch and the occupancy API.

    PYTHONPATH=$PWD python notes/bnf16_host_profile.py [--profile NAME]
"""
import sys
import timeit
import cProfile
import pstats

sys.argv, _argv = sys.argv[:1], sys.argv
sys.path.insert(0, "notes")
import host_profile_cpu as H  # noqa: E402  (installs the fakes)

sys.argv = _argv
import numpy as np  # noqa: E402
import cupy  # noqa: E402
from dnnprims import _kernels, normalization  # noqa: E402
import dnnprims as dp  # noqa: E402

H._FakeDevice.attributes = {"MultiProcessorCount": 132}
_kernels._launch_cooperative_kernel = lambda *args: None
_kernels.co_resident_blocks = lambda function, threads, shared=0: 4 * 132


def cases():
    x = H.fake((32, 7, 7, 256))
    dy = H.fake((32, 7, 7, 256))
    xc = H.fake((32, 256, 8, 8))
    g, b, rm, rv = (H.fake((256,)) for _ in range(4))
    mean, invstd = H.fake((256,)), H.fake((256,))
    return {
        "NHWC train 32x7x7x256": lambda: dp.batchnorm(x, g, b, rm, rv, training=True, layout="NHWC"),
        "NHWC infer 32x7x7x256": lambda: dp.batchnorm(x, g, b, rm, rv, training=False, layout="NHWC"),
        "NHWC backward 32x7x7x256": lambda: dp.batchnorm_backward(dy, x, g, mean=mean, invstd=invstd,
                                                                  layout="NHWC"),
        "NCHW train 32x256x8x8": lambda: dp.batchnorm(xc, g, b, rm, rv, training=True),
    }


def main():
    table = cases()
    if "--profile" in sys.argv:
        name = sys.argv[sys.argv.index("--profile") + 1]
        fn = next(f for k, f in table.items() if name in k)
        fn()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5000):
            fn()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
        return
    for name, fn in table.items():
        fn()
        best = min(timeit.repeat(fn, number=2000, repeat=3)) / 2000 * 1e6
        print(f"{name:30s} {best:7.2f} us (no driver launch)")


if __name__ == "__main__":
    main()
