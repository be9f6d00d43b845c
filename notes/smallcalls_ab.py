"""Old (main's unpatched dnnprims/ + kernels/, copied aside) against new (this tree,
notes/wip/smallcalls.patch applied) against PyTorch, in ONE process, on the small public
memory-bound problems of issue 5 (float32): global_avg_r50 pool avg forward / backward
[32,2048,7,7], bn_r50_late batchnorm train / infer / backward [32,2048,7,7],
classifier_256x1000 softmax / log_softmax forward / backward [256,1000]; plus float16
bn_r50_late with the strided batch-norm kernels forced on (`new+s16`: STRIDED_TYPES
widened) -- the evidence for widening STRIDED_TYPES.

Two timings of each callable, two rounds each (A B A B):
- eager: dnnprims.bench.timing.measure (CUDA events around each call, median of 20) --
  exactly what `python -m dnnprims.bench memory` reports: host launch time + kernel;
- graph: 20 calls captured into a CUDA graph (cupy Stream capture / torch.cuda.CUDAGraph),
  replays timed by the same events, / 20: the device time of one call (kernel + the
  GPU's gap between kernels), without the host.
Copy: a same-size device-to-device copy (the bench's copy_ms: floor / 2 bytes each way,
cudaMemcpyAsync) timed both ways.  Inputs are not rotated (they stay in L2, as in the
bench).  Table last: ms (eager, graph; best of the rounds), x torch, fraction of the copy
over the floor bytes (the bench's accounting: copy_same_size_ms / ms; and floor bytes at
the 1 GiB copy bandwidth measured here).
    python notes/smallcalls_ab.py OLD_ROOT [--json PATH]"""
import importlib.util
import json
import sys

import cupy as cp
import torch

import dnnprims as new
from dnnprims.bench import timing

OLD_ROOT = sys.argv[1]
spec = importlib.util.spec_from_file_location("dnnprims_old", f"{OLD_ROOT}/dnnprims/__init__.py",
                                              submodule_search_locations=[f"{OLD_ROOT}/dnnprims"])
old = importlib.util.module_from_spec(spec)
sys.modules["dnnprims_old"] = old
spec.loader.exec_module(old)
from dnnprims_old import normalization as old_norm  # noqa: E402
from dnnprims import normalization as new_norm  # noqa: E402
from dnnprims import _dtypes  # noqa: E402

assert old_norm.__file__ != new_norm.__file__
assert "batchnorm_train_strided" not in old_norm.FAMILY.source, "old must be unpatched"
assert "batchnorm_train_strided" in new_norm.FAMILY.source, "new must be patched"
print("old:", old_norm.__file__, "new:", new_norm.__file__, flush=True)

F = torch.nn.functional
REPEAT = 20
GRAPH_CALLS = 20


def eager_ms(fn):
    return timing.measure(fn, xp=cp, warmup=3, repeat=REPEAT).median_ms


def graph_ms_cupy(fn):
    """Device time of one call: GRAPH_CALLS calls captured on a side stream."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for _ in range(3):
            fn()  # plans, outputs and memos for this stream
        stream.synchronize()
        stream.begin_capture()
        try:
            for _ in range(GRAPH_CALLS):
                fn()
        finally:
            graph = stream.end_capture()
        graph.upload(stream)
        t = timing.measure(lambda: graph.launch(stream), xp=cp, warmup=2, repeat=REPEAT).median_ms
    return t / GRAPH_CALLS


def graph_ms_torch(fn):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(GRAPH_CALLS):
            fn()
    torch.cuda.synchronize()
    return timing.measure(lambda: g.replay(), xp=cp, warmup=2, repeat=REPEAT).median_ms / GRAPH_CALLS


def copy_fns(floor):
    each = max(int(floor) // 2, 1)
    src, dst = cp.empty(each, cp.uint8), cp.empty(each, cp.uint8)
    src[...] = 1
    return lambda: dst.data.copy_from_device_async(src.data, each)


def copy_gbps():
    src = cp.random.random(2**28, dtype=cp.float32)
    dst = cp.empty_like(src)
    t = timing.measure(lambda: dst.__setitem__(Ellipsis, src), xp=cp, warmup=3, repeat=10)
    return 2 * src.nbytes / (t.median_ms * 1e-3) / 1e9


def as_torch(a):
    if a.dtype.name == "bfloat16":
        return torch.from_dlpack(a.view(cp.int16)).view(torch.bfloat16)
    return torch.from_dlpack(a)


def rel_diff(a, b):
    """max |a - b| / max |b| of two results (new vs old), 0 when bitwise equal."""
    a, b = as_torch(a).double(), as_torch(b).double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


rows = []


def run(problem, op, floor, fns, torch_fn, torch_graph_fn, diffs):
    """fns: {variant: callable on cupy}; diffs: {variant: new-vs-old relative difference}."""
    copy = copy_fns(floor)
    got = {tag: {"eager": [], "graph": []} for tag in (*fns, "torch", "copy")}
    for _ in range(2):  # A B A B
        for tag, fn in fns.items():
            got[tag]["eager"].append(eager_ms(fn))
        try:
            got["torch"]["eager"].append(eager_ms(torch_fn))
        except Exception as e:  # noqa: BLE001
            print(f"{problem} {op} torch: {type(e).__name__}: {e}", flush=True)
        got["copy"]["eager"].append(eager_ms(copy))
        for tag, fn in fns.items():
            try:
                got[tag]["graph"].append(graph_ms_cupy(fn))
            except Exception as e:  # noqa: BLE001 -- report and go on
                print(f"{problem} {op} {tag}: graph capture failed: {type(e).__name__}: {e}", flush=True)
        try:
            got["torch"]["graph"].append(graph_ms_torch(torch_graph_fn))
        except Exception as e:  # noqa: BLE001
            print(f"{problem} {op} torch: graph capture failed: {type(e).__name__}: {e}", flush=True)
        try:
            got["copy"]["graph"].append(graph_ms_cupy(copy))
        except Exception as e:  # noqa: BLE001
            print(f"{problem} {op} copy: graph capture failed: {type(e).__name__}: {e}", flush=True)
    row = {"problem": problem, "op": op, "floor_bytes": floor, "ms": got, "rel_diff_vs_old": diffs}
    rows.append(row)
    print(json.dumps(row), flush=True)


COPY = copy_gbps()
print(f"copy {COPY:.0f} GB/s (1 GiB)", flush=True)

# ---- global_avg_r50: pool avg 7x7 stride 1 over [32, 2048, 7, 7]
x = cp.random.random((32, 2048, 7, 7), dtype=cp.float32) * 2 - 1
y_new, y_old = new.pool(x, 7, mode="avg", stride=1), old.pool(x, 7, mode="avg", stride=1)
dy = cp.random.random(y_new.shape, dtype=cp.float32) * 2 - 1
tx, tdy = torch.from_dlpack(x), torch.from_dlpack(dy)
txg = tx.detach().clone().requires_grad_()
ty = F.avg_pool2d(txg, 7, 1, 0, count_include_pad=True)
run("global_avg_r50", "pool_avg forward", x.nbytes + y_new.nbytes,
    {"old": lambda: old.pool(x, 7, mode="avg", stride=1), "new": lambda: new.pool(x, 7, mode="avg", stride=1)},
    lambda: F.avg_pool2d(tx, 7, 1, 0, count_include_pad=True),
    lambda: F.avg_pool2d(tx, 7, 1, 0, count_include_pad=True),
    {"new": rel_diff(y_new, y_old)})
dx_new = new.pool_backward(dy, x, y_new, 7, mode="avg", stride=1)
dx_old = old.pool_backward(dy, x, y_old, 7, mode="avg", stride=1)
run("global_avg_r50", "pool_avg backward", dy.nbytes + x.nbytes,
    {"old": lambda: old.pool_backward(dy, x, y_old, 7, mode="avg", stride=1),
     "new": lambda: new.pool_backward(dy, x, y_new, 7, mode="avg", stride=1)},
    lambda: torch.autograd.grad(ty, txg, tdy, retain_graph=True),
    lambda: torch.ops.aten.avg_pool2d_backward(tdy, tx, [7, 7], [1, 1], [0, 0], False, True, None),
    {"new": rel_diff(dx_new, dx_old)})
del x, dy, tx, tdy, txg, ty, y_new, y_old, dx_new, dx_old

# ---- bn_r50_late: batchnorm [32, 2048, 7, 7] (float32, then float16 with the strided kernels forced)
for dtype in ("float32", "float16"):
    shape, C = (32, 2048, 7, 7), 2048
    x = (cp.random.random(shape, dtype=cp.float32) * 4 - 1).astype(dtype)
    dy = (cp.random.random(shape, dtype=cp.float32) * 2 - 1).astype(dtype)
    gamma = cp.random.random(C, dtype=cp.float32) + 0.5
    beta = cp.random.random(C, dtype=cp.float32) - 0.5
    rm, rv = cp.random.random(C, dtype=cp.float32) * 0.2 - 0.1, cp.random.random(C, dtype=cp.float32) + 0.5
    scratch_old, scratch_new = (rm.copy(), rv.copy()), (rm.copy(), rv.copy())
    n = x.nbytes
    saved = new_norm.STRIDED_TYPES

    def widened(fn):
        """fn with the strided kernels for every storage type (a plan key: no stale plan)."""
        def call():
            new_norm.STRIDED_TYPES = _dtypes.CUDA_TYPES
            try:
                return fn()
            finally:
                new_norm.STRIDED_TYPES = saved
        return call

    y_old, m_old, s_old = old.batchnorm(x, gamma, beta, training=True, return_stats=True)
    y_new, m_new, s_new = new.batchnorm(x, gamma, beta, training=True, return_stats=True)
    train = {"old": lambda: old.batchnorm(x, gamma, beta, *scratch_old, training=True),
             "new": lambda: new.batchnorm(x, gamma, beta, *scratch_new, training=True)}
    infer = {"old": lambda: old.batchnorm(x, gamma, beta, rm, rv, training=False),
             "new": lambda: new.batchnorm(x, gamma, beta, rm, rv, training=False)}
    back = {"old": lambda: old.batchnorm_backward(dy, x, gamma, mean=m_old, invstd=s_old),
            "new": lambda: new.batchnorm_backward(dy, x, gamma, mean=m_new, invstd=s_new)}
    d_train = {"new": rel_diff(y_new, y_old), "new_mean": rel_diff(m_new, m_old), "new_invstd": rel_diff(s_new, s_old)}
    g_old = old.batchnorm_backward(dy, x, gamma, mean=m_old, invstd=s_old)
    g_new = new.batchnorm_backward(dy, x, gamma, mean=m_new, invstd=s_new)
    d_back = {"new": rel_diff(g_new[0], g_old[0]), "new_dgamma": rel_diff(g_new[1], g_old[1]),
              "new_dbeta": rel_diff(g_new[2], g_old[2])}
    if dtype == "float16":
        train["new+s16"] = widened(train["new"])
        back["new+s16"] = widened(back["new"])
        y_s, m_s, s_s = widened(lambda: new.batchnorm(x, gamma, beta, training=True, return_stats=True))()
        g_s = widened(lambda: new.batchnorm_backward(dy, x, gamma, mean=m_old, invstd=s_old))()
        d_train["new+s16"] = rel_diff(y_s, y_old)
        d_train["new+s16_invstd"] = rel_diff(s_s, s_old)
        d_back["new+s16"] = rel_diff(g_s[0], g_old[0])
        d_back["new+s16_dgamma"] = rel_diff(g_s[1], g_old[1])
    tx, tg, tb = torch.from_dlpack(x), torch.from_dlpack(gamma), torch.from_dlpack(beta)
    trm, trv, tdy = torch.from_dlpack(rm.copy()), torch.from_dlpack(rv.copy()), torch.from_dlpack(dy)
    txg, tgg, tbg = (t.detach().clone().requires_grad_() for t in (tx, tg, tb))
    ty = F.batch_norm(txg, None, None, tgg, tbg, training=True)
    try:  # the saved statistics of torch's backward in the graph timing
        _, t_mean, t_invstd = torch.ops.aten.native_batch_norm(tx, tg, tb, None, None, True, 0.1, 1e-5)
    except Exception as e:  # noqa: BLE001 -- the graph timing of torch's backward then fails, reported
        print(f"{dtype} native_batch_norm: {type(e).__name__}: {e}", flush=True)
        t_mean = t_invstd = None
    label = "" if dtype == "float32" else " fp16"
    run("bn_r50_late", "batchnorm train forward" + label, 2 * n, train,
        lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True),
        lambda: F.batch_norm(tx, trm, trv, tg, tb, training=True), d_train)
    run("bn_r50_late", "batchnorm infer forward" + label, 2 * n, infer,
        lambda: F.batch_norm(tx, trm, trv, tg, tb, training=False),
        lambda: F.batch_norm(tx, trm, trv, tg, tb, training=False), {})
    run("bn_r50_late", "batchnorm backward" + label, 3 * n, back,
        lambda: torch.autograd.grad(ty, (txg, tgg, tbg), tdy, retain_graph=True),
        lambda: torch.ops.aten.native_batch_norm_backward(tdy, tx, tg, None, None, t_mean, t_invstd, True, 1e-5,
                                                          [True, True, True]), d_back)
    del x, dy, tx, tdy, txg, ty, train, infer, back
    cp.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()

# ---- classifier_256x1000: softmax / log_softmax over axis 1
x = cp.random.random((256, 1000), dtype=cp.float32) * 8 - 4
tx = torch.from_dlpack(x)
for log in (False, True):
    fo, fn_ = (old.log_softmax, new.log_softmax) if log else (old.softmax, new.softmax)
    bo, bn_ = (old.log_softmax_backward, new.log_softmax_backward) if log else (old.softmax_backward,
                                                                                new.softmax_backward)
    label = "log_softmax" if log else "softmax"
    y = fn_(x, axis=1)
    dy = cp.random.random(x.shape, dtype=cp.float32) * 2 - 1
    ty, tdy = torch.from_dlpack(y), torch.from_dlpack(dy)
    tf = (lambda: torch.log_softmax(tx, 1)) if log else (lambda: torch.softmax(tx, 1))
    tb = ((lambda: torch._log_softmax_backward_data(tdy, ty, 1, ty.dtype)) if log else
          (lambda: torch._softmax_backward_data(tdy, ty, 1, ty.dtype)))
    run("classifier_256x1000", f"{label} forward", 2 * x.nbytes,
        {"old": lambda f=fo: f(x, axis=1), "new": lambda f=fn_: f(x, axis=1)}, tf, tf,
        {"new": rel_diff(fn_(x, axis=1), fo(x, axis=1))})
    run("classifier_256x1000", f"{label} backward", 3 * x.nbytes,
        {"old": lambda f=bo: f(dy, y, axis=1), "new": lambda f=bn_: f(dy, y, axis=1)}, tb, tb,
        {"new": rel_diff(bn_(dy, y, axis=1), bo(dy, y, axis=1))})

# ---- the table
print()
print(f"copy {COPY:.0f} GB/s (1 GiB); ms = best of 2 rounds (both rounds in the JSON lines above);"
      " eager = the bench's timing (events around each call), graph = device time of one call"
      " (20 captured calls / 20); x torch = torch ms / ms (same timing); of copy = same-size copy ms / ms"
      " (the bench's 'of copy' for small tensors: copy timed the same way); diff = max |new - old| / max |old|")
print(f"{'problem':20s} {'op':29s} {'variant':8s} {'eager ms':>9s} {'graph ms':>9s} {'x torch e':>9s}"
      f" {'x torch g':>9s} {'of copy e':>9s} {'of copy g':>9s}  diff")
for r in rows:
    best = {tag: {k: (min(v) if v else float("nan")) for k, v in t.items()} for tag, t in r["ms"].items()}
    for tag in r["ms"]:
        if tag == "copy":
            continue
        b = best[tag]
        d = r["rel_diff_vs_old"].get(tag, "")
        print(f"{r['problem']:20s} {r['op']:29s} {tag:8s} {b['eager']:9.4f} {b['graph']:9.4f}"
              f" {best['torch']['eager'] / b['eager']:9.2f} {best['torch']['graph'] / b['graph']:9.2f}"
              f" {best['copy']['eager'] / b['eager']:9.2f} {best['copy']['graph'] / b['graph']:9.2f}"
              f"  {d if d == '' else f'{d:.1e}'}")
    c = best["copy"]
    print(f"{'':20s} {'(same-size copy)':29s} {'copy':8s} {c['eager']:9.4f} {c['graph']:9.4f}"
          f"   floor {r['floor_bytes'] / 1e6:.1f} MB = {r['floor_bytes'] / COPY / 1e3:.2f} us at {COPY:.0f} GB/s")
if len(sys.argv) > 3 and sys.argv[2] == "--json":
    json.dump(rows, open(sys.argv[3], "w"), indent=1)
