// cuDNN's tensor operations: scaled (broadcast) add, scale, NCHW <-> NHWC
// layout transform, reduction over chosen axes.
//
// scale_add: out = alpha * a + beta * c, c broadcast to a's shape.  The host
// collapses the shapes to at most 4 dims (d0, d1, d2, d3) with c's element
// strides s0..s3 (0 on broadcast dims).  Thread t of block b handles vectors
// (b * UNROLL + u) * blockDim + t, u < UNROLL, of VEC values (16 bytes) of a and
// out: UNROLL independent loads in flight per thread, each warp touching 512
// consecutive bytes per load.  VEC > 1 only when d3 % VEC == 0 (a vector
// stays in one innermost run, so c's values for it are c[off + e * s3]) and
// the pointers are 16-byte aligned.  HAS_C = false is scale_tensor (c unread).
//
// transpose_batched: out[b][j][i] = in[b][i][j] for (B, R, C) -> (B, C, R) --
// NCHW -> NHWC is (N, C, S) -> (N, S, C) and the reverse (N, S, C) -> (N, C, S).
// One block of 32 x 8 threads per 32 x 32 tile: each thread reads 4 values
// down a column of the tile (a warp reads 32 consecutive values of one row),
// the tile goes through shared memory (33 columns: no bank conflicts on the
// transposed read), and each warp writes 32 consecutive values of one output
// row.  Reads and writes are both coalesced.  The grid is 1-D (tiles of all
// batches), so any B, R, C fit.
//
// reduce_rows: x viewed as (outputs, R) with each output's R values contiguous:
// one block (256 threads) per (output, split) reduces a contiguous range.
// reduce_planes: (R1, O, R2) with enough outputs O to fill the GPU, one block per
// output (one launch; see there).
// reduce_columns: x viewed as (O1, R, O2), output (o1, o2) reduces a column:
// one thread per (o1, o2, split), consecutive threads on consecutive o2
// (coalesced).  Either writes partials in A when the host splits R (then a
// second launch combines them, in order), or the final value in T.  A
// reduction of (R1, O, R2) -- NCHW over (0, 2, 3) -- is rows over R2 into
// partials (R1, O), then columns over R1: x is read once.  The map
// (identity, |x|, x^2), combine (sum, max, min) and finish (none, * scale,
// sqrt) are runtime arguments: uniform branches, cheap against the memory
// traffic, and 7 reductions without 7x the specialisations.
#include "common.cuh"

#define TENSOR_UNROLL 4
#define TILE 32
#define TILE_ROWS 8

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) TensorPack {
    T v[VEC];
};

template <typename T, typename index_t, int VEC, bool HAS_C>
__global__ void scale_add(const T* __restrict__ a, const T* __restrict__ c, T* __restrict__ out,
                          index_t vectors, index_t d1, index_t d2, index_t d3, index_t s0, index_t s1,
                          index_t s2, index_t s3, acc_t<T> alpha, acc_t<T> beta) {
    typedef acc_t<T> A;
    const index_t base = (index_t)blockIdx.x * TENSOR_UNROLL * blockDim.x + threadIdx.x;
    TensorPack<T, VEC> pk[TENSOR_UNROLL];
#pragma unroll
    for (int u = 0; u < TENSOR_UNROLL; ++u) {
        const index_t v = base + u * (index_t)blockDim.x;
        if (v < vectors) pk[u] = reinterpret_cast<const TensorPack<T, VEC>*>(a)[v];
    }
#pragma unroll
    for (int u = 0; u < TENSOR_UNROLL; ++u) {
        const index_t v = base + u * (index_t)blockDim.x;
        if (v >= vectors) continue;
        index_t coff = 0;
        if (HAS_C) {
            index_t i = v * VEC;
            const index_t i3 = i % d3;
            i /= d3;
            const index_t i2 = i % d2;
            i /= d2;
            const index_t i1 = i % d1;
            coff = (i / d1) * s0 + i1 * s1 + i2 * s2 + i3 * s3;
        }
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            A r = alpha * A(load(pk[u].v[e]));
            if (HAS_C) r += beta * A(load(c[coff + e * s3]));
            pk[u].v[e] = store<T>(r);
        }
        reinterpret_cast<TensorPack<T, VEC>*>(out)[v] = pk[u];
    }
}

template <typename T, typename index_t>
__global__ void transpose_batched(const T* __restrict__ in, T* __restrict__ out, index_t R, index_t C,
                                  index_t tiles_r, index_t tiles_c) {
    __shared__ T tile[TILE][TILE + 1];
    index_t id = blockIdx.x;
    const index_t tc = id % tiles_c;
    id /= tiles_c;
    const index_t tr = id % tiles_r;
    const index_t b = id / tiles_r;
    const T* src = in + b * R * C;
    T* dst = out + b * R * C;
    const index_t col = tc * TILE + threadIdx.x;
#pragma unroll
    for (int k = 0; k < TILE; k += TILE_ROWS) {
        const index_t row = tr * TILE + threadIdx.y + k;
        if (row < R && col < C) tile[threadIdx.y + k][threadIdx.x] = src[row * C + col];
    }
    __syncthreads();
    const index_t out_col = tr * TILE + threadIdx.x;  // an input row
#pragma unroll
    for (int k = 0; k < TILE; k += TILE_ROWS) {
        const index_t out_row = tc * TILE + threadIdx.y + k;  // an input column
        if (out_row < C && out_col < R) dst[out_row * R + out_col] = tile[threadIdx.x][threadIdx.y + k];
    }
}

// map: 0 identity, 1 |x|, 2 x^2.  combine: 0 sum, 1 max, 2 min.  finish: 0 none, 1 * scale, 2 sqrt.
template <typename A>
__device__ __forceinline__ A reduce_map(A v, int map) {
    return map == 0 ? v : (map == 1 ? (v < A(0) ? -v : v) : v * v);
}

template <typename A>
__device__ __forceinline__ A reduce_combine(A x, A y, int combine) {
    return combine == 0 ? x + y : (combine == 1 ? (y > x ? y : x) : (y < x ? y : x));
}

template <typename A>
__device__ __forceinline__ A reduce_identity(int combine) {
    return combine == 0 ? A(0) : (combine == 1 ? negative_infinity<A>() : -negative_infinity<A>());
}

template <typename A>
__device__ __forceinline__ A reduce_finish(A v, int finish, A scale) {
    return finish == 0 ? v : (finish == 1 ? v * scale : sqrt(v));
}

// The block's partials combined in a fixed order (warp shuffles, then warp 0 over
// the warps; deterministic), finished and stored by thread 0 to *out.
template <typename A, typename Tout>
__device__ __forceinline__ void reduce_block_and_store(A acc, A* scratch, Tout* out, int combine, int finish,
                                                       A scale) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc = reduce_combine(acc, __shfl_xor_sync(0xffffffffu, acc, off), combine);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = acc;
    __syncthreads();
    if (warp == 0) {
        acc = lane < (int)(blockDim.x >> 5) ? scratch[lane] : reduce_identity<A>(combine);
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc = reduce_combine(acc, __shfl_xor_sync(0xffffffffu, acc, off), combine);
        if (lane == 0) *out = store<Tout>(reduce_finish(acc, finish, scale));
    }
}

template <typename Tin, typename Tout, typename index_t>
__global__ void reduce_rows(const Tin* __restrict__ x, Tout* __restrict__ out, index_t R,
                            index_t per_split, int map, int combine, int finish, acc_t<Tin> scale) {
    typedef acc_t<Tin> A;
    __shared__ A scratch[32];
    const index_t block = blockIdx.x;  // output * splits + split
    const index_t splits = (R + per_split - 1) / per_split;
    const index_t o = block / splits, s = block - o * splits;
    const index_t r0 = s * per_split;
    const index_t r1 = r0 + per_split < R ? r0 + per_split : R;
    const Tin* row = x + o * R;
    A acc = reduce_identity<A>(combine);
    for (index_t r = r0 + threadIdx.x; r < r1; r += TENSOR_UNROLL * (index_t)blockDim.x) {
        A v[TENSOR_UNROLL];
#pragma unroll
        for (int u = 0; u < TENSOR_UNROLL; ++u) {
            const index_t rr = r + u * (index_t)blockDim.x;
            v[u] = rr < r1 ? reduce_map(A(load(row[rr])), map) : reduce_identity<A>(combine);
        }
#pragma unroll
        for (int u = 0; u < TENSOR_UNROLL; ++u) acc = reduce_combine(acc, v[u], combine);
    }
    reduce_block_and_store(acc, scratch, out + block, combine, finish, scale);
}

// reduce_planes: x viewed as (R1, O, R2), one block per output o reduces its
// R1 planes of R2 contiguous values -- NCHW over (0, 2, 3) in one launch, no
// partials.  The block's values are R1 * R2 / VEC vectors, taken flat: thread t
// loads vectors t + u * blockDim (u < TENSOR_UNROLL in flight) of 16 bytes
// when R2 % VEC == 0 and x is aligned; the block then combines in a fixed
// order (warp shuffles, then warp 0 over the warps).
template <typename Tin, typename Tout, typename index_t, int VEC>
__global__ void reduce_planes(const Tin* __restrict__ x, Tout* __restrict__ out, index_t R1, index_t O,
                              index_t R2, int map, int combine, int finish, acc_t<Tin> scale) {
    typedef acc_t<Tin> A;
    __shared__ A scratch[32];
    const index_t o = blockIdx.x;
    const index_t R2v = R2 / VEC;
    const index_t total = R1 * R2v;
    const index_t T_ = blockDim.x;
    A acc = reduce_identity<A>(combine);
    for (index_t v0 = threadIdx.x; v0 < total; v0 += TENSOR_UNROLL * T_) {
        TensorPack<Tin, VEC> pk[TENSOR_UNROLL];
#pragma unroll
        for (int u = 0; u < TENSOR_UNROLL; ++u) {
            const index_t v = v0 + u * T_;
            if (v < total) {
                const index_t r1 = v / R2v, k = v - r1 * R2v;
                pk[u] = *reinterpret_cast<const TensorPack<Tin, VEC>*>(x + (r1 * O + o) * R2 + k * VEC);
            }
        }
#pragma unroll
        for (int u = 0; u < TENSOR_UNROLL; ++u)
            if (v0 + u * T_ < total)
#pragma unroll
                for (int e = 0; e < VEC; ++e) acc = reduce_combine(acc, reduce_map(A(load(pk[u].v[e])), map), combine);
    }
    reduce_block_and_store(acc, scratch, out + o, combine, finish, scale);
}

// Output (split, o1, o2) at (split * O1 + o1) * O2 + o2.
template <typename Tin, typename Tout, typename index_t>
__global__ void reduce_columns(const Tin* __restrict__ x, Tout* __restrict__ out, index_t O1, index_t R,
                               index_t O2, index_t per_split, int map, int combine, int finish,
                               acc_t<Tin> scale) {
    typedef acc_t<Tin> A;
    const index_t tiles = (O2 + blockDim.x - 1) / blockDim.x;
    index_t id = blockIdx.x;
    const index_t tile = id % tiles;
    id /= tiles;
    const index_t o1 = id % O1;
    const index_t s = id / O1;
    const index_t o2 = tile * blockDim.x + threadIdx.x;
    if (o2 >= O2) return;
    const index_t r0 = s * per_split;
    const index_t r1 = r0 + per_split < R ? r0 + per_split : R;
    const Tin* col = x + o1 * R * O2 + o2;
    A acc = reduce_identity<A>(combine);
    for (index_t r = r0; r < r1; r += TENSOR_UNROLL) {
        A v[TENSOR_UNROLL];
#pragma unroll
        for (int u = 0; u < TENSOR_UNROLL; ++u)
            v[u] = r + u < r1 ? reduce_map(A(load(col[(r + u) * O2])), map) : reduce_identity<A>(combine);
#pragma unroll
        for (int u = 0; u < TENSOR_UNROLL; ++u) acc = reduce_combine(acc, v[u], combine);
    }
    out[(s * O1 + o1) * O2 + o2] = store<Tout>(reduce_finish(acc, finish, scale));
}
