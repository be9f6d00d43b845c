// Pointwise activations, forward and backward.
//
// Elementwise kernels move 16-byte packs (pack_width<T> values, packs.cuh):
// thread t of a block handles packs t, t + blockDim, ... U of them per
// grid-stride step (U below; UNROLL for bias_activation_forward), all
// loads issued before any math, so each thread keeps U (backward: 2 x U) 16-byte
// loads in flight.  Python passes the
// number of packs (0 when a pointer is not 16-byte aligned); the elements
// past the last pack take a scalar grid-stride loop.  The mode is a template
// parameter, so each specialisation is a branch-free elementwise kernel.
// Backward takes the forward *input* x.
//
// bias_activation (y = act(x + bias[c])) views x as (outer, C, inner): NCHW
// has inner = H*W, NHWC inner = 1.  A pack never straddles two channels in
// NCHW (Python packs only when inner % VEC == 0) and holds VEC consecutive
// channels in NHWC (only when C % VEC == 0).  Its backward writes dx and a
// per-block partial sum of dx per channel into a workspace, reduced over the
// blocks in a fixed order by bias_grad_reduce (deterministic, no atomics):
//   *_planes  (NCHW) one block per chunk of one (n, c) plane;
//   *_rows    (NHWC) blockDim (32, 8): 32 consecutive channels by 8 rows;
//   *_rows_packed  the same with 32 packs of VEC channels (C % VEC == 0).
// Python sizes the NHWC row chunks so that the grid is ~2048 blocks whatever N*H*W.
// Since session 10 (activations.py: PLANE_PACKS, NHWC_SWEEP) the packed cases take
//   *_plane_packs  (NCHW) one block per chunk of blockDim x SWEEP_UNROLL packs of a
//                  plane, every load issued before any math: one trip to memory;
//   *_rows_sweep   (NHWC) a grid the device holds at once sweeping slabs of rows,
//                  per-thread sums in registers to the end (notes/biasact.md).
//
// The math (modes, derivatives, PyTorch's conventions at the kinks) lives in
// activation_math.cuh, shared with the fused convolution epilogues; the
// backward kernels take derivative_for<T, MODE> (GELU on 16-bit storage: one
// exponential, notes/half16.md).
#include "activation_math.cuh"
#include "packs.cuh"

#define UNROLL 4  // bias_activation_forward's packs per thread per step
#define SWEEP_UNROLL 4  // packs (rows) per thread per trip of *_plane_packs / *_rows_sweep

// Packs per thread per grid-stride step: U, a template parameter of
// activation_forward (Python picks it per dtype and mode), one for
// activation_backward.  An H100 sweep (session 9, notes/actsweep_gpu.py: UNROLL
// 1/2/4/8 x blocks of 128/256/512 x streaming cache hints, 64x256x56x56) found one
// pack a thread in a one-shot grid fastest or tied for float forward and every
// backward (float relu backward 0.2055 -> 0.2040 ms, half gelu backward 0.1060 ->
// 0.1040), and for 16-bit forward four for gelu (0.0749 at 4, 0.0763 at 1) but
// one for relu (~1 %): math-heavy modes hide their math behind more loads.
template <typename T, typename index_t, int MODE, int U>
__global__ void activation_forward(const T* __restrict__ x, T* __restrict__ y, index_t n, index_t packs,
                                   acc_t<T> alpha) {
    constexpr int VEC = pack_width<T>::value;
    const index_t step = (index_t)blockDim.x;
    const index_t stride = (index_t)gridDim.x * step * U;
    for (index_t base = (index_t)blockIdx.x * step * U + (index_t)threadIdx.x; base < packs; base += stride) {
        Pack<T, VEC> in[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (base + u * step < packs) in[u] = load_pack<T, VEC>(x + (base + u * step) * VEC);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (base + u * step < packs) {
                Pack<T, VEC> out;
#pragma unroll
                for (int e = 0; e < VEC; ++e) out.v[e] = store<T>(activate<MODE>(load(in[u].v[e]), alpha));
                store_pack<T, VEC>(y + (base + u * step) * VEC, out);
            }
        }
    }
    const index_t flat_stride = (index_t)gridDim.x * step;
    for (index_t i = packs * VEC + (index_t)blockIdx.x * step + (index_t)threadIdx.x; i < n; i += flat_stride)
        y[i] = store<T>(activate<MODE>(load(x[i]), alpha));
}

template <typename T, typename index_t, int MODE>
__global__ void activation_backward(const T* __restrict__ dy, const T* __restrict__ x, T* __restrict__ dx,
                                    index_t n, index_t packs, acc_t<T> alpha) {
    constexpr int VEC = pack_width<T>::value;
    constexpr int U = 1;
    const index_t step = (index_t)blockDim.x;
    const index_t stride = (index_t)gridDim.x * step * U;
    for (index_t base = (index_t)blockIdx.x * step * U + (index_t)threadIdx.x; base < packs; base += stride) {
        Pack<T, VEC> g[U], in[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (base + u * step < packs) {
                g[u] = load_pack<T, VEC>(dy + (base + u * step) * VEC);
                in[u] = load_pack<T, VEC>(x + (base + u * step) * VEC);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (base + u * step < packs) {
                Pack<T, VEC> out;
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                    out.v[e] = store<T>(load(g[u].v[e]) * derivative_for<T, MODE>(load(in[u].v[e]), alpha));
                store_pack<T, VEC>(dx + (base + u * step) * VEC, out);
            }
        }
    }
    const index_t flat_stride = (index_t)gridDim.x * step;
    for (index_t i = packs * VEC + (index_t)blockIdx.x * step + (index_t)threadIdx.x; i < n; i += flat_stride)
        dx[i] = store<T>(load(dy[i]) * derivative_for<T, MODE>(load(x[i]), alpha));
}

// ---- bias + activation ---------------------------------------------------------

template <typename T, typename index_t, int MODE>
__global__ void bias_activation_forward(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ y,
                                        index_t n, index_t packs, index_t inner, index_t channels,
                                        acc_t<T> alpha) {
    constexpr int VEC = pack_width<T>::value;
    const index_t step = (index_t)blockDim.x;
    const index_t stride = (index_t)gridDim.x * step * UNROLL;
    const int lane_step = inner == 1 ? 1 : 0;  // NHWC packs hold consecutive channels
    for (index_t base = (index_t)blockIdx.x * step * UNROLL + (index_t)threadIdx.x; base < packs; base += stride) {
        Pack<T, VEC> in[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
            if (base + u * step < packs) in[u] = load_pack<T, VEC>(x + (base + u * step) * VEC);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const index_t at = (base + u * step) * VEC;
            if (base + u * step < packs) {
                const index_t c0 = (at / inner) % channels;
                Pack<T, VEC> out;
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                    out.v[e] = store<T>(activate<MODE>(load(in[u].v[e]) + load(bias[c0 + e * lane_step]), alpha));
                store_pack<T, VEC>(y + at, out);
            }
        }
    }
    const index_t flat_stride = (index_t)gridDim.x * step;
    for (index_t i = packs * VEC + (index_t)blockIdx.x * step + (index_t)threadIdx.x; i < n; i += flat_stride)
        y[i] = store<T>(activate<MODE>(load(x[i]) + load(bias[(i / inner) % channels]), alpha));
}

// NCHW backward: block b owns chunk j of plane p = (n, c), elements
// [p * inner + j * chunk, min(.. + chunk, (p + 1) * inner)); partial[(n * chunks
// + j) * channels + c] gets the block's sum of dx.  `vector` is 1 when inner
// and chunk are multiples of VEC and the pointers are aligned.
template <typename T, typename index_t, int MODE>
__global__ void bias_activation_backward_planes(const T* __restrict__ dy, const T* __restrict__ x,
                                                const T* __restrict__ bias, T* __restrict__ dx,
                                                acc_t<T>* __restrict__ partial, index_t planes, index_t channels,
                                                index_t inner, index_t chunks, index_t chunk, int vector,
                                                acc_t<T> alpha) {
    typedef acc_t<T> A;
    constexpr int VEC = pack_width<T>::value;
    __shared__ A scratch[32];
    const index_t blocks = planes * chunks;
    for (index_t b = blockIdx.x; b < blocks; b += (index_t)gridDim.x) {
        const index_t p = b / chunks, j = b - p * chunks;
        const index_t c = p % channels;
        const A bc = load(bias[c]);
        const index_t start = p * inner + j * chunk;
        const index_t len = min(chunk, inner - j * chunk);
        A acc = A(0);
        if (vector) {
            const index_t plen = len / VEC;
            for (index_t q = threadIdx.x; q < plen; q += (index_t)blockDim.x * 2) {
                const index_t q2 = q + (index_t)blockDim.x;
                Pack<T, VEC> g0 = load_pack<T, VEC>(dy + start + q * VEC), x0 = load_pack<T, VEC>(x + start + q * VEC);
                Pack<T, VEC> g1, x1;
                if (q2 < plen) {
                    g1 = load_pack<T, VEC>(dy + start + q2 * VEC);
                    x1 = load_pack<T, VEC>(x + start + q2 * VEC);
                }
                Pack<T, VEC> out;
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const A d = load(g0.v[e]) * derivative_for<T, MODE>(load(x0.v[e]) + bc, alpha);
                    out.v[e] = store<T>(d);
                    acc += d;
                }
                store_pack<T, VEC>(dx + start + q * VEC, out);
                if (q2 < plen) {
#pragma unroll
                    for (int e = 0; e < VEC; ++e) {
                        const A d = load(g1.v[e]) * derivative_for<T, MODE>(load(x1.v[e]) + bc, alpha);
                        out.v[e] = store<T>(d);
                        acc += d;
                    }
                    store_pack<T, VEC>(dx + start + q2 * VEC, out);
                }
            }
        } else {
            for (index_t q = threadIdx.x; q < len; q += (index_t)blockDim.x) {
                const A d = load(dy[start + q]) * derivative_for<T, MODE>(load(x[start + q]) + bc, alpha);
                dx[start + q] = store<T>(d);
                acc += d;
            }
        }
        acc = block_sum(acc, scratch);
        if (threadIdx.x == 0) partial[((p / channels) * chunks + j) * channels + c] = acc;
    }
}

// NHWC backward: blockDim (32, 8); block (bx, by) owns channels [32 bx, 32 bx + 32)
// of rows [by * rows_per_chunk, ..); partial[by * channels + c] gets its column sums.
template <typename T, typename index_t, int MODE>
__global__ void bias_activation_backward_rows(const T* __restrict__ dy, const T* __restrict__ x,
                                              const T* __restrict__ bias, T* __restrict__ dx,
                                              acc_t<T>* __restrict__ partial, index_t rows, index_t channels,
                                              index_t rows_per_chunk, acc_t<T> alpha) {
    typedef acc_t<T> A;
    __shared__ A scratch[8][33];
    const index_t c = (index_t)blockIdx.x * 32 + threadIdx.x;
    const index_t first = (index_t)blockIdx.y * rows_per_chunk;
    const index_t last = min(first + rows_per_chunk, rows);
    A acc = A(0);
    if (c < channels) {
        const A bc = load(bias[c]);
#pragma unroll 4
        for (index_t r = first + threadIdx.y; r < last; r += blockDim.y) {
            const index_t at = r * channels + c;
            const A d = load(dy[at]) * derivative_for<T, MODE>(load(x[at]) + bc, alpha);
            dx[at] = store<T>(d);
            acc += d;
        }
    }
    scratch[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < channels) {
        for (int k = 1; k < 8; ++k) acc += scratch[k][threadIdx.x];
        partial[(index_t)blockIdx.y * channels + c] = acc;
    }
}

// The NHWC packed kernels' block column sums: the ROWS warps' VEC sums a thread
// meet in scratch, warp 0 adds them in warp order and writes partial[by * channels + c].
template <int ROWS, int VEC, typename A, typename index_t>
__device__ __forceinline__ void write_lane_partials(A (&scratch)[ROWS][32 * VEC], const A (&acc)[VEC],
                                                    A* __restrict__ partial, index_t channels, index_t c0) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) scratch[threadIdx.y][threadIdx.x * VEC + e] = acc[e];
    __syncthreads();
    if (threadIdx.y == 0 && c0 < channels) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            A s = acc[e];
            for (int k = 1; k < ROWS; ++k) s += scratch[k][threadIdx.x * VEC + e];
            partial[(index_t)blockIdx.y * channels + c0 + e] = s;
        }
    }
}

// NHWC backward with 16-byte packs (C % VEC == 0, aligned): thread tx of block bx owns
// the VEC channels of pack 32 bx + tx, so a warp reads 32 x 16 contiguous bytes of a row
// (the scalar kernel above moves 4 or 2 bytes a thread).
template <typename T, typename index_t, int MODE>
__global__ void bias_activation_backward_rows_packed(const T* __restrict__ dy, const T* __restrict__ x,
                                                     const T* __restrict__ bias, T* __restrict__ dx,
                                                     acc_t<T>* __restrict__ partial, index_t rows,
                                                     index_t channels, index_t rows_per_chunk, acc_t<T> alpha) {
    typedef acc_t<T> A;
    constexpr int VEC = pack_width<T>::value;
    __shared__ A scratch[8][32 * VEC];
    const index_t c0 = ((index_t)blockIdx.x * 32 + threadIdx.x) * VEC;
    const index_t first = (index_t)blockIdx.y * rows_per_chunk;
    const index_t last = min(first + rows_per_chunk, rows);
    A acc[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] = A(0);
    if (c0 < channels) {
        A bc[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) bc[e] = load(bias[c0 + e]);
#pragma unroll 4
        for (index_t r = first + threadIdx.y; r < last; r += blockDim.y) {
            const index_t at = r * channels + c0;
            const Pack<T, VEC> g = load_pack<T, VEC>(dy + at), in = load_pack<T, VEC>(x + at);
            Pack<T, VEC> out;
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const A d = load(g.v[e]) * derivative_for<T, MODE>(load(in.v[e]) + bc[e], alpha);
                out.v[e] = store<T>(d);
                acc[e] += d;
            }
            store_pack<T, VEC>(dx + at, out);
        }
    }
    write_lane_partials(scratch, acc, partial, channels, c0);
}

// NCHW backward with packs (inner % VEC == 0, aligned), all loads first: block b owns
// chunk j of plane p = (n, c), packs [j * blockDim * SWEEP_UNROLL, ..) of the plane's
// inner / VEC; thread t takes packs t, t + blockDim, ... (SWEEP_UNROLL of them) and
// issues their 2 x SWEEP_UNROLL loads of dy and x before any math, so a block makes one
// trip to memory (the planes kernel above makes one per two packs a thread: three on a
// 56 x 56 plane, with the math of the last in between -- GELU's erff + expf showed).
// partial[(n * chunks + j) * channels + c] gets the block's sum of dx.  Launch bounds:
// <= 64 registers, 4 blocks of 256 a SM (float gelu took 72 without: 3 a SM).
template <typename T, typename index_t, int MODE>
__global__ void __launch_bounds__(256, 4)
bias_activation_backward_plane_packs(const T* __restrict__ dy, const T* __restrict__ x,
                                     const T* __restrict__ bias, T* __restrict__ dx,
                                     acc_t<T>* __restrict__ partial, index_t planes,
                                     index_t channels, index_t inner, index_t chunks,
                                     acc_t<T> alpha) {
    typedef acc_t<T> A;
    constexpr int VEC = pack_width<T>::value, U = SWEEP_UNROLL;
    __shared__ A scratch[32];
    const index_t blocks = planes * chunks;
    const index_t chunk = (index_t)blockDim.x * U;  // packs
    const index_t plane_packs = inner / VEC;
    for (index_t b = blockIdx.x; b < blocks; b += (index_t)gridDim.x) {
        const index_t p = b / chunks, j = b - p * chunks;
        const index_t c = p % channels;
        const index_t start = p * inner + j * chunk * VEC;  // elements
        const index_t len = min(chunk, plane_packs - j * chunk);
        const A bc = load(bias[c]);
        Pack<T, VEC> g[U], in[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const index_t q = (index_t)threadIdx.x + u * (index_t)blockDim.x;
            if (q < len) {
                g[u] = load_pack<T, VEC>(dy + start + q * VEC);
                in[u] = load_pack<T, VEC>(x + start + q * VEC);
            }
        }
        A acc = A(0);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const index_t q = (index_t)threadIdx.x + u * (index_t)blockDim.x;
            if (q < len) {
                Pack<T, VEC> out;
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const A d = load(g[u].v[e]) * derivative_for<T, MODE>(load(in[u].v[e]) + bc, alpha);
                    out.v[e] = store<T>(d);
                    acc += d;
                }
                store_pack<T, VEC>(dx + start + q * VEC, out);
            }
        }
        acc = block_sum(acc, scratch);
        if (threadIdx.x == 0) partial[((p / channels) * chunks + j) * channels + c] = acc;
    }
}

// NHWC backward with packs (C % VEC == 0, aligned), sweeping: blockDim (32, 8), grid
// (lanes, groups) with lanes x groups about the blocks the device holds at once (Python:
// the occupancy API).  Thread (tx, ty) of block (bx, by) owns the VEC channels of pack
// 32 bx + tx.  The grid takes slabs of groups x 8 x SWEEP_UNROLL consecutive rows; block
// by takes the by-th 8 x SWEEP_UNROLL rows of each slab, warp ty rows ty, ty + 8, ...,
// all SWEEP_UNROLL loads of dy and x issued before any math.  So the rows in flight are
// one band moving through the tensor in address order (as the flat kernels read), not
// ~2000 chunks read side by side, and every block lives the whole kernel: no tail of a
// second wave.  The VEC sums of dx stay in registers over all slabs; one partial row a
// block at the end (partial[by * channels + c]).  Launch bounds as *_plane_packs (16-bit
// gelu spills 8 bytes: L1).
template <typename T, typename index_t, int MODE>
__global__ void __launch_bounds__(256, 4)
bias_activation_backward_rows_sweep(const T* __restrict__ dy, const T* __restrict__ x,
                                    const T* __restrict__ bias, T* __restrict__ dx,
                                    acc_t<T>* __restrict__ partial, index_t rows,
                                    index_t channels, acc_t<T> alpha) {
    typedef acc_t<T> A;
    constexpr int VEC = pack_width<T>::value, U = SWEEP_UNROLL, ROWS = 8;  // ROWS = blockDim.y
    __shared__ A scratch[ROWS][32 * VEC];
    const index_t c0 = ((index_t)blockIdx.x * 32 + threadIdx.x) * VEC;
    A acc[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] = A(0);
    if (c0 < channels) {
        A bc[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) bc[e] = load(bias[c0 + e]);
        const index_t slab = (index_t)gridDim.y * (ROWS * U);
        for (index_t r0 = (index_t)blockIdx.y * (ROWS * U) + threadIdx.y; r0 < rows; r0 += slab) {
            Pack<T, VEC> g[U], in[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (r0 + u * ROWS < rows) {
                    const index_t at = (r0 + u * ROWS) * channels + c0;
                    g[u] = load_pack<T, VEC>(dy + at);
                    in[u] = load_pack<T, VEC>(x + at);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (r0 + u * ROWS < rows) {
                    const index_t at = (r0 + u * ROWS) * channels + c0;
                    // The pack loop of *_rows_packed, written out: as a shared helper it changes
                    // the SASS of both kernels (notes/dedupe.md), so the two stay apart.
                    Pack<T, VEC> out;
#pragma unroll
                    for (int e = 0; e < VEC; ++e) {
                        const A d = load(g[u].v[e]) * derivative_for<T, MODE>(load(in[u].v[e]) + bc[e], alpha);
                        out.v[e] = store<T>(d);
                        acc[e] += d;
                    }
                    store_pack<T, VEC>(dx + at, out);
                }
            }
        }
    }
    write_lane_partials(scratch, acc, partial, channels, c0);
}

// dbias[c] = sum over groups g of partial[g * channels + c]: blockDim (32, 32),
// thread (tx, ty) sums groups ty, ty + 32, ... of channel 32 bx + tx (a warp reads
// 32 consecutive channels), then ty == 0 adds the 32 slices in order: the same
// bits on every run.  (One thread a channel walking every group ran ~100 us on
// the 3136 groups of NHWC 64x56x56: a serial chain of L2 loads.)
template <typename T, typename index_t>
__global__ void bias_grad_reduce(const acc_t<T>* __restrict__ partial, T* __restrict__ dbias, index_t groups,
                                 index_t channels) {
    typedef acc_t<T> A;
    __shared__ A slices[32][33];
    for (index_t c0 = (index_t)blockIdx.x * 32; c0 < channels; c0 += (index_t)gridDim.x * 32) {
        const index_t c = c0 + threadIdx.x;
        A s = A(0);
        if (c < channels) {
#pragma unroll 4
            for (index_t g = threadIdx.y; g < groups; g += 32) s += partial[g * channels + c];
        }
        __syncthreads();  // the previous channel block's slices are read
        slices[threadIdx.y][threadIdx.x] = s;
        __syncthreads();
        if (threadIdx.y == 0 && c < channels) {
            for (int k = 1; k < 32; ++k) s += slices[k][threadIdx.x];
            dbias[c] = store<T>(s);
        }
    }
}
