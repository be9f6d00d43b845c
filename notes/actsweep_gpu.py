"""Activations tie PyTorch at copy speed (0.98-1.00x; ours 0.2-0.6 % slower on most
rows, session 9 bench).  Sweep of the elementwise launch shape on the H100: UNROLL
(16-byte packs per thread per step) x block size x cache hints on the 16-byte accesses
(.cs streaming loads / stores: evict-first, so the output does not push inputs out of
L2), for relu / gelu forward and backward in float32 and float16 (64x256x56x56, the
bench problem), torch side by side, two rounds, one process.  Kernels are built from
kernels/activation.cu with the variant substituted (not the library's cache).
    PYTHONPATH=. python notes/actsweep_gpu.py     (GPU machine, ~60 s)"""
import pathlib

import cupy as cp
import numpy as np
import torch

from dnnprims import _kernels
from dnnprims.bench import timing

SRC = (pathlib.Path(_kernels.KERNEL_DIR) / "activation.cu").read_text()
HINTS = {
    "none": "",
    "cs": r'''
template <typename T, int VEC> __device__ __forceinline__ Pack<T, VEC> load_pack_hint(const T* p) {
    Pack<T, VEC> out;
    asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(out.raw.a), "=r"(out.raw.b), "=r"(out.raw.c), "=r"(out.raw.d) : "l"(p));
    return out;
}
template <typename T, int VEC> __device__ __forceinline__ void store_pack_hint(T* p, const Pack<T, VEC>& v) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "r"(v.raw.a), "r"(v.raw.b), "r"(v.raw.c), "r"(v.raw.d) : "memory");
}
''',
    "ld_nc_st_cs": r'''
template <typename T, int VEC> __device__ __forceinline__ Pack<T, VEC> load_pack_hint(const T* p) {
    Pack<T, VEC> out;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(out.raw.a), "=r"(out.raw.b), "=r"(out.raw.c), "=r"(out.raw.d) : "l"(p));
    return out;
}
template <typename T, int VEC> __device__ __forceinline__ void store_pack_hint(T* p, const Pack<T, VEC>& v) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "r"(v.raw.a), "r"(v.raw.b), "r"(v.raw.c), "r"(v.raw.d) : "memory");
}
''',
}
MODES = {"relu": 0, "gelu": 4}


def build(unroll, hint):
    src = SRC.replace("#define UNROLL 4", f"#define UNROLL {unroll}")
    assert f"#define UNROLL {unroll}" in src
    if hint != "none":
        head, tail = src.split("#define UNROLL", 1)
        tail = tail.replace("load_pack<T, VEC>(", "load_pack_hint<T, VEC>(").replace(
            "store_pack<T, VEC>(", "store_pack_hint<T, VEC>(")
        src = head + HINTS[hint] + "#define UNROLL" + tail
    names = [f"activation_{d}<{t}, int, {m}>" for d in ("forward", "backward")
             for t in ("float", "half_t") for m in MODES.values()]
    module = cp.RawModule(code=src, options=_kernels.COMPILE_OPTIONS, name_expressions=names)
    return {name: module.get_function(name) for name in names}


def main():
    rng = np.random.default_rng(0)
    shape = (64, 256, 56, 56)
    n = int(np.prod(shape))
    arrays = {}
    for dt, ct in ((np.float32, "float"), (np.float16, "half_t")):
        x = cp.asarray(rng.standard_normal(shape).astype(dt))
        dy = cp.asarray(rng.standard_normal(shape).astype(dt))
        arrays[ct] = (x, dy, cp.empty_like(x), dt)
    variants = [(u, b, h) for u in (1, 2, 4, 8) for b in (128, 256, 512) for h in ("none",)] + \
               [(u, b, h) for u in (2, 4) for b in (256,) for h in ("cs", "ld_nc_st_cs")]
    modules = {(u, h): build(u, h) for u, h in {(u, h) for u, _, h in variants}}
    F = torch.nn.functional
    results = {}
    for rnd in range(2):
        for ct, (x, dy, out, dt) in arrays.items():
            vec = 16 // np.dtype(dt).itemsize
            packs = n // vec
            tx, tdy = torch.from_dlpack(x), torch.from_dlpack(dy)
            txg = tx.detach().clone().requires_grad_(True)
            for mode, mid in MODES.items():
                tf = (lambda: F.relu(tx)) if mode == "relu" else (lambda: F.gelu(tx))
                ty = (F.relu if mode == "relu" else F.gelu)(txg)
                tb = lambda: torch.autograd.grad(ty, txg, tdy, retain_graph=True)  # noqa: E731
                for direction, torch_fn in (("forward", tf), ("backward", tb)):
                    key = (ct, mode, direction)
                    t = timing.measure(torch_fn, xp=cp, warmup=3, repeat=20).median_ms
                    results.setdefault(key, {}).setdefault("torch", []).append(t)
                    for u, b, h in variants:
                        fn = modules[(u, h)][f"activation_{direction}<{ct}, int, {mid}>"]
                        grid = (min(max(-(-packs // (b * u)), 1), 65536),)
                        args = (x, out, np.int32(n), np.int32(packs), np.float32(0)) if direction == "forward" \
                            else (dy, x, out, np.int32(n), np.int32(packs), np.float32(0))
                        call = lambda: fn(grid, (b,), args)  # noqa: E731
                        t = timing.measure(call, xp=cp, warmup=3, repeat=20).median_ms
                        results[key].setdefault(f"U{u} B{b} {h}", []).append(t)
    print("ms (round 1 / round 2); x torch from the better round; main = U4 B256 none")
    for key, rows in results.items():
        best_torch = min(rows["torch"])
        print(f"== {key}: torch {rows['torch'][0]:.4f}/{rows['torch'][1]:.4f}")
        for name, ts in sorted(rows.items(), key=lambda kv: min(kv[1])):
            if name != "torch":
                print(f"   {name:18s} {ts[0]:.4f}/{ts[1]:.4f}  {best_torch / min(ts):.3f}x")


main()
