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
