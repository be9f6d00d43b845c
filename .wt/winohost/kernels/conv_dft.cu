// The one kernel of the DFT convolution (dnnprims/algos/dft.py): a transpose
// of a complex matrix, the layout change between the W-axis transforms (real
// GEMMs along the image rows, one row per (sample, channel, image row)) and
// the H-axis transforms / per-frequency products (complex GEMMs whose rows
// must be the channels, unit stride).  Everything else is cuBLAS.
//
// dft_transpose: out[c, r] = in[r, c] for a row-major (rows x cols) matrix of
// complex values stored as (re, im) pairs of T (cuComplex / cuDoubleComplex).
// Tile: 32 x 32 complex values staged in shared memory (a 33-column row pitch
// against bank conflicts on the column reads); block 32 x 8 threads, each
// thread moving 4 values in and 4 out, so both the global reads (along a row
// of in) and the global writes (along a row of out) are coalesced.  The grid
// covers column tiles in x and row tiles in y, y grid-strided past 65535.
#include "common.cuh"

template <typename T>
struct dft_complex {
    T re, im;
};

template <typename T, typename index_t>
__global__ void dft_transpose(const T* __restrict__ in, T* __restrict__ out, index_t rows, index_t cols) {
    __shared__ dft_complex<T> tile[32][33];
    const dft_complex<T>* src = reinterpret_cast<const dft_complex<T>*>(in);
    dft_complex<T>* dst = reinterpret_cast<dft_complex<T>*>(out);
    const index_t c0 = (index_t)blockIdx.x * 32;
    for (index_t r0 = (index_t)blockIdx.y * 32; r0 < rows; r0 += (index_t)gridDim.y * 32) {
        for (int i = threadIdx.y; i < 32; i += 8) {
            const index_t r = r0 + i, c = c0 + threadIdx.x;
            if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * cols + c];
        }
        __syncthreads();
        for (int i = threadIdx.y; i < 32; i += 8) {
            const index_t c = c0 + i, r = r0 + threadIdx.x;
            if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][i];
        }
        __syncthreads();
    }
}

// --- the fused kernels (dft.FUSED_ROWS, dft.FUSED_FILTER: on) --------------------
// The W-axis transforms fused with the transposes around them, replacing a
// skinny cuBLAS GEMM (inner dimension W ~ 27..64, measured at ~1/4 of the
// memory bandwidth on the H100) plus a transpose pass each.
//
// dft_rows_forward: out[(r, v), (nb, c)] = sum_col a[nb, c, r, col] * (dw[col, 2v]
// + i dw[col, 2v + 1]) -- the real W-axis DFT of every image row, written straight
// in the (Hi, h, NB, J) complex layout the H-axis GEMM reads.
// Block: R image rows r0 = R blockIdx.y .. + R - 1 (template R, 1 or 2) of one sample nb
// (grid.z) for 64 channels (grid.x); 256 threads = 8 warps x 32 lanes; lane l owns
// channels c0 + l and c0 + 32 + l of each row (so a warp's writes are 32 consecutive
// complex values), warp w the frequencies v0 = 4 g .. v0 + 3 of the groups g = w,
// w + 8, ..  A thread keeps R x 2 x 4 complex sums.  The DFT matrix (Wi x dpitch,
// dpitch = 2 * round_up(h, 4), zero-filled past 2h, so four frequencies are two
// aligned 16-byte loads, broadcast to the warp) is either staged in shared memory
// (L1 false) or read from a zero-padded copy in global memory through L1 (L1 true:
// one copy an SM serves all its blocks; helper dft7b).  Shared memory: the R 64
// image rows (R 64 x xpitch, xpitch = Wi | 1: odd, so the lanes' column reads hit
// distinct banks), after the matrix when it is staged.  Per column a thread does
// 2 R row loads + 2 vector loads for 16 R FMAs.  Staging has no divisions and 8
// independent loads in flight a thread.  (Helper dft7 tried ceil(h / 4) warps, up
// to 16, with __launch_bounds__(512): 0.084 ms against 0.055 on big_7x7_s1 on the
// H100, most likely the 128-register cap of the 512-thread bound; reverted.
// Helper dft7b: R = 2 with the matrix staged, 43.5 KB a block, measured 0.068 ms
// against 0.061 for R = 1.)
template <typename T>
__device__ __forceinline__ void dft_load4(const T* p, T (&r)[4]);
template <>
__device__ __forceinline__ void dft_load4<float>(const float* p, float (&r)[4]) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    r[0] = v.x; r[1] = v.y; r[2] = v.z; r[3] = v.w;
}
template <>
__device__ __forceinline__ void dft_load4<double>(const double* p, double (&r)[4]) {
    const double2 v = reinterpret_cast<const double2*>(p)[0], w = reinterpret_cast<const double2*>(p)[1];
    r[0] = v.x; r[1] = v.y; r[2] = w.x; r[3] = w.y;
}

// (re, im) as one 8- or 16-byte vector (complex values of the workspaces are
// aligned to their size: fresh allocations, whole-element offsets).
template <typename T>
struct dft_vec2;
template <>
struct dft_vec2<float> {
    typedef float2 type;
};
template <>
struct dft_vec2<double> {
    typedef double2 type;
};

template <typename T, typename index_t, int R, bool L1>
__global__ void __launch_bounds__(256) dft_rows_forward(const T* __restrict__ a, const T* __restrict__ dw,
                                                        T* __restrict__ out, int NB, int J, int Hi, int Wi,
                                                        int h, int dpitch, int xpitch) {
    typedef typename dft_vec2<T>::type V;
    extern __shared__ __align__(16) unsigned char dft_smem[];
    T* dws = reinterpret_cast<T*>(dft_smem);           // Wi x dpitch (not with L1)
    T* xs = L1 ? dws : dws + Wi * dpitch;               // R 64 x xpitch: (rr, cc) -> (64 rr + cc) xpitch
    const T* dm = L1 ? dw : dws;                        // the DFT matrix, Wi x dpitch
    const int c0 = blockIdx.x * 64, r0 = blockIdx.y * R, nb = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // Staging without divisions, 8 independent loads in flight a thread before their stores.
    for (int k0 = 0; k0 < (L1 ? 0 : dpitch); k0 += 32) {
        const int k = k0 + lane;
        for (int col0 = warp; col0 < Wi; col0 += 64) {
            T val[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const int col = col0 + 8 * q;
                val[q] = (col < Wi && k < 2 * h) ? dw[col * 2 * h + k] : T(0);
            }
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const int col = col0 + 8 * q;
                if (col < Wi && k < dpitch) dws[col * dpitch + k] = val[q];
            }
        }
    }
    for (int col0 = 0; col0 < Wi; col0 += 32) {
        const int col = col0 + lane;
        for (int row0 = warp; row0 < 64 * R; row0 += 64) {
            T val[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const int row = row0 + 8 * q, rr = row >> 6, c = c0 + (row & 63), r = r0 + rr;
                val[q] = (row < 64 * R && col < Wi && c < J && r < Hi)
                             ? a[(((index_t)nb * J + c) * Hi + r) * Wi + col] : T(0);
            }
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const int row = row0 + 8 * q;
                if (row < 64 * R && col < Wi) xs[row * xpitch + col] = val[q];
            }
        }
    }
    __syncthreads();
    const int groups = (h + 3) >> 2;
    for (int grp = warp; grp < groups; grp += 8) {
        const int v0 = 4 * grp;
        T re[R][2][4], im[R][2][4];
#pragma unroll
        for (int rr = 0; rr < R; ++rr)
#pragma unroll
            for (int half = 0; half < 2; ++half)
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    re[rr][half][u] = T(0);
                    im[rr][half][u] = T(0);
                }
        const T* xl = xs + lane * xpitch;
        for (int col = 0; col < Wi; ++col) {
            T d0[4], d1[4];
            dft_load4(dm + col * dpitch + 2 * v0, d0);
            dft_load4(dm + col * dpitch + 2 * v0 + 4, d1);
#pragma unroll
            for (int rr = 0; rr < R; ++rr)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const T x = xl[(64 * rr + 32 * half) * xpitch + col];
                    re[rr][half][0] += x * d0[0]; im[rr][half][0] += x * d0[1];
                    re[rr][half][1] += x * d0[2]; im[rr][half][1] += x * d0[3];
                    re[rr][half][2] += x * d1[0]; im[rr][half][2] += x * d1[1];
                    re[rr][half][3] += x * d1[2]; im[rr][half][3] += x * d1[3];
                }
        }
#pragma unroll
        for (int rr = 0; rr < R; ++rr) {
            const int r = r0 + rr;
            if (r >= Hi) continue;
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int v = v0 + u;
                if (v >= h) continue;
                V* o = reinterpret_cast<V*>(out) + (((index_t)r * h + v) * NB + nb) * J + c0 + lane;
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    if (c0 + 32 * half + lane < J) {
                        V val;
                        val.x = re[rr][half][u];
                        val.y = im[rr][half][u];
                        o[32 * half] = val;   // one 2-vector store a value, 32 consecutive a warp
                    }
                }
            }
        }
    }
}

// dft_rows_inverse: out[b, p, q] = sum_v Re(y[p, v, b]) dwi[2v, q] + Im(y[p, v, b]) dwi[2v + 1, q]
// -- the real W-axis inverse (C2R weights and scale inside dwi) of every kept
// row p, read from the (n0, h, B) complex output of the H-axis inverse GEMM and
// written straight into the (B, n0, n1) real output.
// Block: one row p (grid.y) for 32 consecutive b (grid.x); warp w owns b = b0 + w,
// + 8, + 16, + 24 and lane l the columns q = q0 + l and q0 + 32 + l (q0 = 0, 64,
// ..; consecutive lanes write consecutive q: coalesced rows of out), so a thread
// keeps 4 x 2 sums.  Shared memory: y for the block (h x 32 complex, loaded
// along b, coalesced) and dwi re-laid as h x n1 pairs (dwi[2v, q], dwi[2v + 1, q]):
// per frequency v a thread makes two 2-vector loads of dwi (q, q + 32) and four
// broadcast 2-vector loads of y for 16 FMAs.  (The first version, one q a
// thread and scalar loads, made 10 shared loads for 8 FMAs: the kernel was
// bound by the shared-memory pipe.)
template <typename T, typename index_t>
__global__ void __launch_bounds__(256) dft_rows_inverse(const T* __restrict__ y, const T* __restrict__ dwi,
                                                        T* __restrict__ out, int B, int n0, int n1, int h) {
    typedef typename dft_vec2<T>::type V;
    extern __shared__ __align__(16) unsigned char dft_smem[];
    V* ys = reinterpret_cast<V*>(dft_smem);            // h x 32: (v, bb) -> v * 32 + bb
    V* ds = ys + 32 * h;                                // h x n1: (v, q) -> v * n1 + q
    const V* yv = reinterpret_cast<const V*>(y);
    const int b0 = blockIdx.x * 32, p = blockIdx.y;
    const int tid = threadIdx.x;
    for (int i = tid; i < 32 * h; i += 256) {
        const int v = i >> 5, bb = i & 31, b = b0 + bb;
        V val;
        val.x = T(0);
        val.y = T(0);
        if (b < B) val = yv[((index_t)p * h + v) * B + b];
        ys[i] = val;
    }
    const int lane = tid & 31, warp = tid >> 5;
    for (int v = warp; v < h; v += 8) {   // a warp a frequency, its lanes along q (no divisions)
        for (int q = lane; q < n1; q += 32) {
            V val;
            val.x = dwi[(2 * v) * n1 + q];
            val.y = dwi[(2 * v + 1) * n1 + q];
            ds[v * n1 + q] = val;
        }
    }
    __syncthreads();
    for (int q0 = 0; q0 < n1; q0 += 64) {
        const int qa = q0 + lane, qb = q0 + 32 + lane;
        const int ca = qa < n1 ? qa : n1 - 1, cb = qb < n1 ? qb : n1 - 1;
        T acc_a[4] = {0, 0, 0, 0}, acc_b[4] = {0, 0, 0, 0};
        for (int v = 0; v < h; ++v) {
            const V da = ds[v * n1 + ca], db = ds[v * n1 + cb];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const V yy = ys[v * 32 + warp + 8 * u];
                acc_a[u] += yy.x * da.x + yy.y * da.y;
                acc_b[u] += yy.x * db.x + yy.y * db.y;
            }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int b = b0 + warp + 8 * u;
            if (b < B) {
                T* row = out + ((index_t)b * n0 + p) * n1;
                if (qa < n1) row[qa] = acc_a[u];
                if (qb < n1) row[qb] = acc_b[u];
            }
        }
    }
}

// dft_rows_inverse64 (helper dft7b): the same map as dft_rows_inverse with 64
// consecutive b a block and 8 consecutive b a warp (b = b0 + 8 w + 0..7), so a
// thread keeps 8 x 2 sums and reads the warp's 8 values of y as four broadcast
// 16-byte loads (float; eight 16-byte loads for double): per frequency 2 + 2
// wavefronts of dwi (q, q + 32) and 4 of y for 32 FMAs, against 8 for 16 in
// dft_rows_inverse (dft7: that kernel is bound by the shared-memory pipe).  The
// staging of dwi (as many bytes as the block's y on big_7x7_s1) is paid once for
// 64 b instead of 32.  Shared memory: y as h x 64 complex ((v, bb) -> 64 v + bb),
// then dwi as h x n1 pairs.  H100 stage times: 0.043 against 0.058 ms on big_7x7_s1,
// 0.031 against 0.041 on big_11x11_s1 (notes/dft7b.md).
template <typename T>
__device__ __forceinline__ void dft_load_pair(const typename dft_vec2<T>::type* p, typename dft_vec2<T>::type& a,
                                              typename dft_vec2<T>::type& b);
template <>
__device__ __forceinline__ void dft_load_pair<float>(const float2* p, float2& a, float2& b) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    a.x = v.x; a.y = v.y; b.x = v.z; b.y = v.w;
}
template <>
__device__ __forceinline__ void dft_load_pair<double>(const double2* p, double2& a, double2& b) {
    a = p[0];
    b = p[1];
}

template <typename T, typename index_t>
__global__ void __launch_bounds__(256) dft_rows_inverse64(const T* __restrict__ y, const T* __restrict__ dwi,
                                                          T* __restrict__ out, int B, int n0, int n1, int h) {
    typedef typename dft_vec2<T>::type V;
    extern __shared__ __align__(16) unsigned char dft_smem[];
    V* ys = reinterpret_cast<V*>(dft_smem);            // h x 64: (v, bb) -> v * 64 + bb
    V* ds = ys + 64 * h;                                // h x n1: (v, q) -> v * n1 + q
    const V* yv = reinterpret_cast<const V*>(y);
    const int b0 = blockIdx.x * 64, p = blockIdx.y;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int i0 = tid; i0 < 64 * h; i0 += 256 * 4) {   // 4 independent loads in flight a thread
        V val[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int i = i0 + 256 * q, v = i >> 6, b = b0 + (i & 63);
            val[q].x = T(0);
            val[q].y = T(0);
            if (i < 64 * h && b < B) val[q] = yv[((index_t)p * h + v) * B + b];
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int i = i0 + 256 * q;
            if (i < 64 * h) ys[i] = val[q];
        }
    }
    for (int q0 = 0; q0 < n1; q0 += 32) {              // a warp a frequency, its lanes along q
        const int q = q0 + lane;
        for (int v0 = warp; v0 < h; v0 += 32) {
            T re[4], im[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int v = v0 + 8 * u;
                re[u] = (v < h && q < n1) ? dwi[(2 * v) * n1 + q] : T(0);
                im[u] = (v < h && q < n1) ? dwi[(2 * v + 1) * n1 + q] : T(0);
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int v = v0 + 8 * u;
                if (v < h && q < n1) {
                    V val;
                    val.x = re[u];
                    val.y = im[u];
                    ds[v * n1 + q] = val;
                }
            }
        }
    }
    __syncthreads();
    for (int q0 = 0; q0 < n1; q0 += 64) {
        const int qa = q0 + lane, qb = q0 + 32 + lane;
        const int ca = qa < n1 ? qa : n1 - 1, cb = qb < n1 ? qb : n1 - 1;
        T acc_a[8], acc_b[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            acc_a[u] = T(0);
            acc_b[u] = T(0);
        }
        const V* yw = ys + 8 * warp;
        for (int v = 0; v < h; ++v) {
            const V da = ds[v * n1 + ca], db = ds[v * n1 + cb];
#pragma unroll
            for (int u = 0; u < 8; u += 2) {
                V y0, y1;
                dft_load_pair<T>(yw + v * 64 + u, y0, y1);
                acc_a[u] += y0.x * da.x;   // two FMAs a sum (no separate multiply and add)
                acc_a[u] += y0.y * da.y;
                acc_b[u] += y0.x * db.x;
                acc_b[u] += y0.y * db.y;
                acc_a[u + 1] += y1.x * da.x;
                acc_a[u + 1] += y1.y * da.y;
                acc_b[u + 1] += y1.x * db.x;
                acc_b[u + 1] += y1.y * db.y;
            }
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int b = b0 + 8 * warp + u;
            if (b < B) {
                T* row = out + ((index_t)b * n0 + p) * n1;
                if (qa < n1) row[qa] = acc_a[u];
                if (qb < n1) row[qb] = acc_b[u];
            }
        }
    }
}

// dft_filter_spectrum (dft.FUSED_FILTER): the filter spectrum
// G[(u, v), j, k] = sum_r dr[u, r] sum_s ds[v, s] g[r, s] of the (dilated; for
// flip rotated, channel-swapped) filter, in one pass instead of a
// complex-conversion kernel and two cuBLAS GEMMs with inner dimension E
// (on the H100, big_7x7_s1: 0.015 + 0.034 + 0.054 ms for 58 MB of output,
// notes/large2.md; the floor is the 58 MB write, ~0.02 ms).
// g[r, s] = f[k, j, r', s'] as in fft_filter_complex (conv_fft.cu): r' = (flip ?
// E0 - 1 - r : r) / d0 when that divides, else 0.  dr (T0 x E0) and ds
// (h x E1) are complex (re, im) pairs, 1 / (T0 T1) folded into dr.
// Block: blockDim.x (128, 64 or 32: what fits the shared memory) consecutive pairs
// jk = j * Ko + k (k fastest: coalesced writes of G) for the rows u = blockIdx.y,
// + gridDim.y, .. < T0 (T0: the rows of this launch; dr and G start at its first).
// Staging (once a block, whatever its rows): the flip / dilation index arithmetic
// is done once a tap into a shared offset table (offs[tap] = element offset in a
// filter, or -1 for a zero tap of the dilation), and once a pair into bases[pair]
// (the filter's start); then the lanes of a warp take consecutive taps (coalesced
// reads of one filter) of 8 pairs at a time: 8 independent loads in flight
// before their shared stores, pitch (E0 E1) | 1 (odd: the per-thread reads below
// hit distinct banks).  Helper dft7, H100: a version whose loop made one load and
// its store per iteration (each store waits for its load: a memory latency an
// iteration, 64-128 iterations a warp) took 0.060 ms on big_7x7_s1 and 0.178 ms on
// big_11x11_s1 for 58 / 20 MB of output; the one before (large2) also did ~10
// runtime integer divisions per tap and staged again for every row u.
// Compute: thread t folds the rows, b[s] = sum_r dr[u, r] g[r, s] (E1 <= SMAX
// complex values in registers: SMAX a template parameter, the smallest of 8, 12,
// 16, 32 that holds E1, so the unrolled, guarded loops waste at most a few
// slots), then writes the h frequencies G[u, v] = sum_s ds[v, s] b[s] as 2-vector
// stores, two frequencies an iteration (4 independent sums), a warp writing 32
// consecutive pairs (256 / 512 bytes).  ds sits in shared memory (broadcast
// 2-vector reads); dr's row u is read through the read-only path (one address a
// warp).
// Shared memory: blockDim.x ((E0 E1) | 1) + 2 h E1 values of T, then
// E0 E1 + blockDim.x index_t.
template <typename T, int SMAX>
__device__ __forceinline__ void dft_filter_frequency(const typename dft_vec2<T>::type* d, const T (&bre)[SMAX],
                                                     const T (&bim)[SMAX], int E1, T& gre, T& gim) {
    gre = T(0);
    gim = T(0);
#pragma unroll
    for (int s = 0; s < SMAX; ++s) {
        if (s < E1) {
            const typename dft_vec2<T>::type w = d[s];
            gre += w.x * bre[s] - w.y * bim[s];
            gim += w.x * bim[s] + w.y * bre[s];
        }
    }
}

template <typename T, typename index_t, int SMAX>
__global__ void __launch_bounds__(128) dft_filter_spectrum(const T* __restrict__ f, const T* __restrict__ ds,
                                                           const T* __restrict__ dr, T* __restrict__ G,
                                                           int T0, int h, int E0, int E1, int J, int Ko, int d0,
                                                           int d1, int flip, long long sk, long long sj,
                                                           long long sr, long long ss) {
    typedef typename dft_vec2<T>::type V;
    extern __shared__ __align__(16) unsigned char dft_smem[];
    const int taps = E0 * E1, pitch = taps | 1;
    const int npairs = blockDim.x, warps = npairs >> 5;
    T* gs = reinterpret_cast<T*>(dft_smem);                             // npairs x pitch
    V* dss = reinterpret_cast<V*>(gs + npairs * pitch);                 // h x E1 complex
    index_t* offs = reinterpret_cast<index_t*>(dss + h * E1);           // taps
    index_t* bases = offs + taps;                                       // npairs
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const index_t jk0 = (index_t)blockIdx.x * npairs;
    const index_t pairs = (index_t)J * Ko;
    const index_t jk = jk0 + tid;
    const V* dsv = reinterpret_cast<const V*>(ds);
    for (int i = tid; i < h * E1; i += npairs) dss[i] = dsv[i];
    for (int tap = tid; tap < taps; tap += npairs) {
        const int r = tap / E1, s = tap - r * E1;
        const int rr = flip ? E0 - 1 - r : r, sv = flip ? E1 - 1 - s : s;
        offs[tap] = (rr % d0 == 0 && sv % d1 == 0) ? (index_t)(rr / d0) * sr + (index_t)(sv / d1) * ss
                                                   : (index_t)-1;
    }
    bases[tid] = jk < pairs ? (jk % Ko) * (index_t)sk + (jk / Ko) * (index_t)sj : (index_t)-1;
    __syncthreads();
    for (int tap0 = 0; tap0 < taps; tap0 += 32) {
        const int tap = tap0 + lane;
        const index_t o = tap < taps ? offs[tap] : (index_t)-1;
        for (int p0 = warp; p0 < npairs; p0 += 8 * warps) {
            T val[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const int pair = p0 + q * warps;
                const index_t base = pair < npairs ? bases[pair] : (index_t)-1;
                val[q] = (base >= 0 && o >= 0) ? __ldg(f + base + o) : T(0);
            }
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const int pair = p0 + q * warps;
                if (pair < npairs && tap < taps) gs[pair * pitch + tap] = val[q];
            }
        }
    }
    __syncthreads();
    if (jk >= pairs) return;
    const T* g = gs + tid * pitch;
    const V* drv = reinterpret_cast<const V*>(dr);
    V* Gv = reinterpret_cast<V*>(G);
    for (int u = blockIdx.y; u < T0; u += gridDim.y) {
        T bre[SMAX], bim[SMAX];
#pragma unroll
        for (int s = 0; s < SMAX; ++s) {
            bre[s] = T(0);
            bim[s] = T(0);
        }
        for (int r = 0; r < E0; ++r) {
            const V c = __ldg(drv + (index_t)u * E0 + r);
#pragma unroll
            for (int s = 0; s < SMAX; ++s) {
                if (s < E1) {
                    const T gv = g[r * E1 + s];
                    bre[s] += c.x * gv;
                    bim[s] += c.y * gv;
                }
            }
        }
        V* out = Gv + (index_t)u * h * pairs + jk;
        int v = 0;
        for (; v + 1 < h; v += 2) {
            V a, b;
            dft_filter_frequency<T, SMAX>(dss + v * E1, bre, bim, E1, a.x, a.y);
            dft_filter_frequency<T, SMAX>(dss + (v + 1) * E1, bre, bim, E1, b.x, b.y);
            out[(index_t)v * pairs] = a;
            out[(index_t)(v + 1) * pairs] = b;
        }
        if (v < h) {
            V a;
            dft_filter_frequency<T, SMAX>(dss + v * E1, bre, bim, E1, a.x, a.y);
            out[(index_t)v * pairs] = a;
        }
    }
}
