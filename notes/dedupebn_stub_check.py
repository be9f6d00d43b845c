"""Old vs new channel-last (rows) plan builders of dnnprims/normalization.py, no GPU: with the
device, the kernels and the workspace stubbed, _build_rows_forward_plan / _build_rows_backward_plan
give the same launches (expression, grid, block, argument list, shared bytes, cooperative,
fallback) in every combination of ROWS_FUSED, ROWS_RESIDENT, fused_allowed, resident fits,
fused fits, training / inference / backward, dtype, ROWS_16BIT_WORDS and recompute; and the
real _rows_resident_launch (occupancy and device facts stubbed) the same (grid, lanes, workspace,
cached, window, shared bytes) and the same arrive counter resizing.  helper dedupebn, notes/dedupebn.md.
    python notes/dedupebn_stub_check.py OLD_ROOT NEW_ROOT     (e.g. /work/main .)"""
import itertools, sys, types
import numpy as np
import importlib
import importlib.util
def load(root, name):
    spec = importlib.util.spec_from_file_location(name, f"{root}/dnnprims/__init__.py",
                                                  submodule_search_locations=[f"{root}/dnnprims"])
    m = importlib.util.module_from_spec(spec); sys.modules[name] = m; spec.loader.exec_module(m)
    return importlib.import_module(name + ".normalization")
old = load(sys.argv[1], "dp_old"); new = load(sys.argv[2], "dp_new")
ORIG = {m: (m._rows_resident_launch, m._rows_fused_grid) for m in (old, new)}

class Arr:
    def __init__(self, tag, dtype=np.float32, size=1): self.tag, self.dtype, self.size = tag, np.dtype(dtype), size
    def __getitem__(self, sl): return ("slice", self.tag, sl.start, sl.stop)
    def __repr__(self): return f"Arr({self.tag})"
    def __eq__(self, o): return isinstance(o, Arr) and o.tag == self.tag
class CP:
    class cuda:
        class runtime:
            @staticmethod
            def getDevice(): return 0
    def __init__(self): self.n = 0
    def empty(self, n, dt): self.n += 1; return Arr(f"empty{self.n}", dt, n)
    def zeros(self, n, dt): self.n += 1; return Arr(f"zeros{self.n}", dt, n)
class Work:
    def __init__(self): self.arrive = Arr("arrive", np.uint32, 8)
    def scratch(self, cp, acc, count, slot): return Arr(("scratch", np.dtype(acc).name, count, slot))
class Fam:
    def prepare(self, spec, grid, block, args, shared_mem=0, cooperative=False, fallback=None):
        return ("prepare", spec, grid, block, tuple(repr(a) if not isinstance(a, np.generic) else (type(a), a.item()) for a in args), shared_mem, cooperative, fallback)
    def function(self, spec): return ("fn", spec)
def results(mod, cfg):
    (fused_sw, resident_sw, allowed, res_fits, fus_fits, training, dtype, words, recompute) = cfg
    work = Work()
    mod.ROWS_FUSED, mod.ROWS_RESIDENT, mod.ROWS_16BIT_WORDS = fused_sw, resident_sw, words
    mod.FAMILY = Fam()
    mod._stream_workspace = lambda cp: work
    mod._constant = lambda cp, v, c, dt: ("const", v)
    mod._rows_packs_launch = lambda *a: None
    mod._rows_refused = lambda cp, spec, grid, build: ("fallback", spec, grid)
    mod._rows_statistics_launches = lambda *a: [("stats",) + tuple(repr(x) for x in a[3:])]
    mod._rows_resident_launch = lambda cp, rows, spec, ch, tensors, isz: ((7, rows.groups), 7 * rows.block_lanes, work, 3, 5, 3 * 1024 * tensors) if res_fits else None
    mod._rows_fused_grid = lambda cp, rows, spec, ch: ((9, rows.groups), 9 * rows.block_lanes, work) if fus_fits else None
    mod._Plan = lambda launches, aligned, stats=None: (tuple(launches), aligned, None if stats is None else tuple(map(repr, stats)))
    x = types.SimpleNamespace(dtype=np.dtype(dtype), itemsize=np.dtype(dtype).itemsize, size=4096 * 64, shape=(64, 8, 8, 64))
    class Rows:
        def __init__(self, cp, x, channels, rows, aligned=None):
            self.t = mod._dtypes.cuda_type(x.dtype); self.vec = mod._VECTOR[self.t]; self.index_t = "int"
            self.groups, self.block_lanes, self.rows, self.sms = 1, 4, rows, 132
            self.shape = (np.int32(rows), np.int32(64), np.int32(64 // self.vec)); self.merge_grid = (8,)
        spec = mod._Rows.spec
        grid = lambda self, cp, spec, r: ((11, 1), 44)
    mod._Rows = Rows
    if training is None:
        return mod._build_rows_backward_plan(CP(), x, np.float32, 64, 4096, recompute, 1e-5, False, True, fused_allowed=allowed)
    return mod._build_rows_forward_plan(CP(), x, np.float32, 64, 4096, training, True, 0.1, 1e-5, False, False, True, fused_allowed=allowed)
n, seen = 0, set()
for cfg in itertools.product([False, True], [False, True], [False, True], [False, True], [False, True],
                             [True, False, None], ["float32", "float16", "float64"], [False, True], [False, True]):
    a, b = results(old, cfg), results(new, cfg)
    assert a == b, (cfg, a, b)
    n += 1
    seen.add(repr(b))
print("plan builders:", n, "combinations identical,", len(seen), "distinct plans")

# _rows_resident_launch: real function, stubbed device facts
def resident(mod, cfg):
    blocks, refused, cache_bytes, l2w, tensors, isz, rows_n = cfg
    mod._rows_resident_launch, mod._rows_fused_grid = ORIG[mod]
    mod._RESIDENT.clear(); mod._REFUSED.clear()
    work = Work(); work.arrive = Arr("arrive", np.uint32, 2)
    mod._stream_workspace = lambda cp: work
    mod._resident_blocks = lambda cp, k: blocks
    mod.FAMILY = Fam()
    mod._device_facts = lambda cp, d: (None, 227 * 1024, 50 * 2**20)
    mod._shared_per_sm = lambda cp, d, o: 228 * 1024
    mod._resident_with_shared = lambda k, sh: blocks if sh <= 60000 else blocks - 1
    mod.ROWS_CACHE_BYTES, mod.ROWS_L2_WINDOW = cache_bytes, l2w
    rows = types.SimpleNamespace(groups=1, rows=rows_n, block_lanes=4, t="float" if isz == 4 else "half_t", vec=4 if isz == 4 else 8, sms=132)
    spec = "batchnorm_rows_train_resident<float, int, 4>"
    if refused:
        gx = min(blocks // 1, -(-rows_n // (4 * mod.ROWS_FUSED_MIN_ROWS)))
        mod._REFUSED.add((0, spec, (gx, 1)))
    cp = CP()
    r = mod._rows_resident_launch(cp, rows, spec, 64, tensors, isz)
    return (None if r is None else (r[0], r[1], r[2] is work, r[3:]), repr(work.arrive), dict(mod._RESIDENT))
m = 0
for cfg in itertools.product([0, 132, 264], [False, True], [None, 0, 20000], [None, 0.25, (("train", 2, 0.25),)],
                             [1, 2], [2, 4], [7, 5000, 10**6]):
    a, b = resident(old, cfg), resident(new, cfg)
    assert a == b, (cfg, a, b)
    m += 1
print("_rows_resident_launch:", m, "combinations identical")
print(len({repr(resident(new, c)[0]) for c in itertools.product([0, 132, 264], [False, True], [None, 0, 20000], [None, 0.25], [1, 2], [2, 4], [7, 5000, 10**6])}), "distinct resident launches")
