"""The main job: a small network forward and backward through dnnprims.

    python -m dnnprims [--device cpu|gpu|auto] [--batch N] [--dtype float32]

conv -> batchnorm (training, running statistics) -> relu -> max pool
-> conv (+bias) -> global average pool -> one LSTM cell step -> linear (matmul of the
array library) -> log_softmax, then the backward pass through all of it.  (The bias sits on the second
convolution: a bias in front of batch norm has a zero gradient, which would
make a relative error meaningless.)

Every result is checked against the float64 reference: the same library
function called on the same inputs upcast to float64 NumPy arrays, which runs
``dnnprims.reference``.  Each stage is checked on the inputs it actually
received, so errors do not compound down the table.  The table says where each
operation ran, with which algorithm, its median time and its relative error
against the tolerance of ``dnnprims.testing``.  Exit status 1 if any check
fails, 2 if the requested device is missing.
"""
import argparse
import sys

import numpy as np

import dnnprims as dp
from dnnprims.bench.timing import measure
from dnnprims.testing import relative_error, tolerance
from dnnprims.testing.tolerances import assert_close


def _gpu_module():
    """(cupy, None) when a GPU is usable, else (None, reason)."""
    try:
        import cupy
    except ImportError:
        return None, "cupy not installed"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None, "no CUDA device"
    except Exception as e:  # no driver, or a driver CuPy cannot use
        return None, f"no usable CUDA device ({type(e).__name__})"
    return cupy, None


def _gpu_name(cp):
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _host64(a):
    """A float64 NumPy copy (never a view: references update running stats in
    place) of a NumPy or CuPy array; None stays None."""
    if a is None:
        return None
    if hasattr(a, "get"):
        a = a.get()
    return np.array(a, dtype=np.float64, copy=True)


class StageFailed(Exception):
    """A library call raised; the network stops there."""


class Network:
    """Runs every stage, checks it, and collects one table row per result."""

    def __init__(self, xp, where, dtype, repeat):
        self.xp, self.where, self.dtype, self.repeat = xp, where, np.dtype(dtype), repeat
        self.rows = []

    def run(self, op, direction, fn, reference, *, algorithm=None, family="default",
            names=None, timed=None):
        """Call ``fn`` (checked result), time ``timed`` (default ``fn``), compare each
        output with ``reference()`` (float64).  Returns fn's result."""
        try:
            result = fn()
        except Exception as e:  # report the failing stage; later stages lack its output
            self.rows.append((op, direction, self.where, algorithm or "", None,
                              float("nan"), tolerance(self.dtype, family), False))
            raise StageFailed(f"{op} {direction}: {type(e).__name__}: {e}") from e
        outputs = result if isinstance(result, tuple) else (result,)
        time_ms = measure(timed or fn, xp=self.xp, warmup=1, repeat=self.repeat).median_ms
        expected = reference()
        expected = expected if isinstance(expected, tuple) else (expected,)
        names = names or [""] * len(outputs)
        algorithm = algorithm or ("reference" if self.xp is np else "kernel")
        for name, got, want in zip(names, outputs, expected):
            if got is None and want is None:
                continue
            self.check(f"{op}{f' {name}' if name else ''}", direction, got, want, algorithm,
                       family, time_ms)
            time_ms = None  # one call produced all outputs: show its time once
        return result

    def check(self, op, direction, got, want, algorithm, family, time_ms):
        bound = tolerance(self.dtype, family)
        err = relative_error(got, want)
        try:
            assert_close(got, want, self.dtype, family, op)
            ok = True
        except AssertionError:
            ok = False
        self.rows.append((op, direction, self.where, algorithm, time_ms, err, bound, ok))

    def print_table(self):
        head = ("op", "direction", "ran on", "algorithm", "time ms", "rel. error", "bound", "check")
        lines = [(op, d, w, a, "" if t is None else f"{t:.3f}", f"{e:.2e}", f"{b:.0e}",
                  "pass" if ok else "FAIL") for op, d, w, a, t, e, b, ok in self.rows]
        widths = [max(len(str(r[i])) for r in [head, *lines]) for i in range(len(head))]
        fmt = "  ".join(f"{{:{'>' if i in (4, 5, 6) else '<'}{w}}}" for i, w in enumerate(widths))
        print(fmt.format(*head))
        print(fmt.format(*("-" * w for w in widths)))
        for line in lines:
            print(fmt.format(*line))


def _conv_algorithm(xp, x_shape, w_shape, direction, dtype, padding):
    """The registry's choice for this problem on the GPU; 'reference' on NumPy."""
    if xp is np:
        return "reference"
    from dnnprims.algos import ConvProblem, choose

    N, C, H, W = x_shape
    _, _, P, Q = dp.conv2d_output_shape(x_shape, w_shape, padding=padding)
    problem = ConvProblem(N=N, C=C, H=H, W=W, K=w_shape[0], R=w_shape[2], S=w_shape[3], P=P, Q=Q,
                          stride=(1, 1), padding=(padding, padding), dilation=(1, 1), groups=1,
                          layout="NCHW", dtype=np.dtype(dtype).name)
    return choose(problem, direction, "auto").name


def run_network(net, batch, seed=0):
    """Forward and backward through the network, every stage checked into ``net``."""
    xp, dtype = net.xp, net.dtype
    rng = np.random.default_rng(seed)
    C0, C1, C2, HW, hidden, classes = 3, 16, 32, 32, 32, 10

    def param(*shape, scale=1.0):
        return xp.asarray((rng.standard_normal(shape) * scale).astype(dtype))

    x = param(batch, C0, HW, HW)
    w1 = param(C1, C0, 3, 3, scale=0.3)
    gamma, beta = xp.asarray(rng.uniform(0.5, 1.5, C1).astype(dtype)), param(C1, scale=0.1)
    running_mean, running_var = param(C1, scale=0.1), xp.asarray(rng.uniform(0.5, 1.5, C1).astype(dtype))
    w2, b2 = param(C2, C1, 3, 3, scale=0.1), param(C2, scale=0.1)
    w_ih, w_hh = param(4 * hidden, C2, scale=0.2), param(4 * hidden, hidden, scale=0.2)
    b_ih, b_hh = param(4 * hidden, scale=0.1), param(4 * hidden, scale=0.1)
    h0, c0 = param(batch, hidden, scale=0.5), param(batch, hidden, scale=0.5)
    w_fc, b_fc = param(classes, hidden, scale=0.3), param(classes, scale=0.1)
    labels = rng.integers(0, classes, batch)

    h = _host64

    # ---------------------------------------------------------------- forward
    y1 = net.run("conv1 3x3", "forward",
                 lambda: dp.conv2d_forward(x, w1, padding=1),
                 lambda: dp.conv2d_forward(h(x), h(w1), padding=1),
                 algorithm=_conv_algorithm(xp, x.shape, w1.shape, "forward", dtype, 1),
                 family=_conv_algorithm(xp, x.shape, w1.shape, "forward", dtype, 1))

    rm_before, rv_before = running_mean.copy(), running_var.copy()
    scratch = (running_mean.copy(), running_var.copy())  # timing repeats update these, not ours
    z1, mean, invstd = net.run(
        "batchnorm (training)", "forward",
        lambda: dp.batchnorm(y1, gamma, beta, running_mean, running_var, training=True,
                             return_stats=True),
        lambda: dp.batchnorm(h(y1), h(gamma), h(beta), h(rm_before), h(rv_before),
                             training=True, return_stats=True),
        names=["y", "mean", "invstd"],
        timed=lambda: dp.batchnorm(y1, gamma, beta, *scratch, training=True))
    rm64, rv64 = h(rm_before), h(rv_before)
    dp.batchnorm(h(y1), h(gamma), h(beta), rm64, rv64, training=True)
    net.check("batchnorm running_mean", "forward", running_mean, rm64,
              net.rows[-1][3], "default", None)
    net.check("batchnorm running_var", "forward", running_var, rv64, net.rows[-1][3], "default", None)

    a1 = net.run("activation relu", "forward", lambda: dp.activation(z1, "relu"),
                 lambda: dp.activation(h(z1), "relu"))
    p1 = net.run("pool max 2x2", "forward", lambda: dp.pool(a1, 2, mode="max"),
                 lambda: dp.pool(h(a1), 2, mode="max"))
    conv2_algo = _conv_algorithm(xp, p1.shape, w2.shape, "forward", dtype, 1)
    y2 = net.run("conv2 3x3 +bias", "forward", lambda: dp.conv2d_forward(p1, w2, b2, padding=1),
                 lambda: dp.conv2d_forward(h(p1), h(w2), h(b2), padding=1),
                 algorithm=conv2_algo, family=conv2_algo)
    gp_window = y2.shape[2:]
    g = net.run("pool avg (global)", "forward", lambda: dp.pool(y2, gp_window, mode="avg"),
                lambda: dp.pool(h(y2), gp_window, mode="avg"))
    feat = g.reshape(batch, C2)
    h1, c1 = net.run("lstm_cell", "forward",
                     lambda: dp.lstm_cell(feat, h0, c0, w_ih, w_hh, b_ih, b_hh),
                     lambda: dp.lstm_cell(h(feat), h(h0), h(c0), h(w_ih), h(w_hh), h(b_ih), h(b_hh)),
                     names=["h1", "c1"])
    logits = net.run("linear", "forward", lambda: (h1 @ w_fc.T + b_fc).astype(dtype),
                     lambda: h(h1) @ h(w_fc).T + h(b_fc), algorithm="matmul")
    logp = net.run("log_softmax", "forward", lambda: dp.log_softmax(logits, axis=1),
                   lambda: dp.log_softmax(h(logits), axis=1))

    # --------------------------------------------------------------- backward
    onehot = np.zeros((batch, classes))
    onehot[np.arange(batch), labels] = -1.0 / batch   # d(mean NLL)/d logp
    dlogp = xp.asarray(onehot.astype(dtype))
    dlogits = net.run("log_softmax", "backward", lambda: dp.log_softmax_backward(dlogp, logp, axis=1),
                      lambda: dp.log_softmax_backward(h(dlogp), h(logp), axis=1))
    dh1 = net.run("linear", "backward", lambda: (dlogits @ w_fc).astype(dtype),
                  lambda: h(dlogits) @ h(w_fc), algorithm="matmul")
    dfeat, *_ = net.run(
        "lstm_cell", "backward",
        lambda: dp.lstm_cell_backward(dh1, None, feat, h0, c0, w_ih, w_hh, b_ih, b_hh),
        lambda: dp.lstm_cell_backward(h(dh1), None, h(feat), h(h0), h(c0), h(w_ih), h(w_hh),
                                      h(b_ih), h(b_hh)),
        names=["dx", "dh", "dc", "dw_ih", "dw_hh", "db_ih", "db_hh"])
    dg = dfeat.reshape(g.shape)
    dy2 = net.run("pool avg (global)", "backward",
                  lambda: dp.pool_backward(dg, y2, g, gp_window, mode="avg"),
                  lambda: dp.pool_backward(h(dg), h(y2), h(g), gp_window, mode="avg"))
    algo = _conv_algorithm(xp, p1.shape, w2.shape, "backward_data", dtype, 1)
    dp1 = net.run("conv2 3x3", "backward data",
                  lambda: dp.conv2d_backward_data(dy2, w2, p1.shape, padding=1),
                  lambda: dp.conv2d_backward_data(h(dy2), h(w2), p1.shape, padding=1),
                  algorithm=algo, family=algo)
    algo = _conv_algorithm(xp, p1.shape, w2.shape, "backward_filter", dtype, 1)
    net.run("conv2 3x3", "backward filter",
            lambda: dp.conv2d_backward_filter(p1, dy2, w2.shape, padding=1),
            lambda: dp.conv2d_backward_filter(h(p1), h(dy2), w2.shape, padding=1),
            algorithm=algo, family=algo)
    net.run("conv2 bias", "backward", lambda: dp.conv2d_backward_bias(dy2),
            lambda: dp.conv2d_backward_bias(h(dy2)))
    da1 = net.run("pool max 2x2", "backward", lambda: dp.pool_backward(dp1, a1, p1, 2, mode="max"),
                  lambda: dp.pool_backward(h(dp1), h(a1), h(p1), 2, mode="max"))
    dz1 = net.run("activation relu", "backward", lambda: dp.activation_backward(da1, z1, "relu"),
                  lambda: dp.activation_backward(h(da1), h(z1), "relu"))
    dy1, _, _ = net.run(
        "batchnorm", "backward",
        lambda: dp.batchnorm_backward(dz1, y1, gamma, mean=mean, invstd=invstd),
        lambda: dp.batchnorm_backward(h(dz1), h(y1), h(gamma), mean=h(mean), invstd=h(invstd)),
        names=["dx", "dgamma", "dbeta"])
    algo = _conv_algorithm(xp, x.shape, w1.shape, "backward_data", dtype, 1)
    net.run("conv1 3x3", "backward data",
            lambda: dp.conv2d_backward_data(dy1, w1, x.shape, padding=1),
            lambda: dp.conv2d_backward_data(h(dy1), h(w1), x.shape, padding=1),
            algorithm=algo, family=algo)
    algo = _conv_algorithm(xp, x.shape, w1.shape, "backward_filter", dtype, 1)
    net.run("conv1 3x3", "backward filter",
            lambda: dp.conv2d_backward_filter(x, dy1, w1.shape, padding=1),
            lambda: dp.conv2d_backward_filter(h(x), h(dy1), w1.shape, padding=1),
            algorithm=algo, family=algo)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m dnnprims", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--dtype", default="float32", choices=("float16", "bfloat16", "float32", "float64"))
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed calls per operation (median); default 20 on GPU, 3 on CPU")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.batch < 2:
        parser.error("--batch must be at least 2 (batch norm in training needs 2 values per channel)")
    if args.repeat is not None and args.repeat < 1:
        parser.error("--repeat must be at least 1 (the median of no calls is no time)")

    cp, why_not = (None, "--device cpu") if args.device == "cpu" else _gpu_module()
    if cp is None and args.device == "gpu":
        print(f"dnnprims: --device gpu but {why_not}", file=sys.stderr)
        return 2
    from dnnprims import _dtypes
    if args.dtype == "bfloat16" and _dtypes.BFLOAT16 is None:
        parser.error("bfloat16 needs the ml_dtypes package")
    dtype = _dtypes.BFLOAT16 if args.dtype == "bfloat16" else np.dtype(args.dtype)

    if cp is not None:
        where = _gpu_name(cp)
        print(f"dnnprims {dp.__version__}: running on the GPU: {where} "
              f"(CuPy {cp.__version__}, NumPy {np.__version__})")
        xp, repeat = cp, args.repeat or 20
    else:
        where = "NumPy"
        print(f"dnnprims {dp.__version__}: NO GPU ({why_not}): running on NumPy "
              f"(the reference path, NumPy {np.__version__})")
        xp, repeat = np, args.repeat or 3
    print(f"network: batch {args.batch}, {dtype.name}, input 3x32x32 -> conv 16 -> batchnorm -> relu "
          f"-> max pool -> conv 32 +bias -> global avg pool -> LSTM cell 32 -> linear 10 -> log_softmax; "
          f"checked against float64 references; time = median of {repeat} calls\n")
    net = Network(xp, where, dtype, repeat)
    error = None
    try:
        run_network(net, args.batch, args.seed)
    except StageFailed as e:
        error = e
    net.print_table()
    if error is not None:
        print(f"\nstopped: {error}")
    failed = [row for row in net.rows if not row[-1]]
    print(f"\n{len(net.rows) - len(failed)} of {len(net.rows)} checks passed"
          + (f"; FAILED: {', '.join(f'{r[0]} {r[1]}' for r in failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
