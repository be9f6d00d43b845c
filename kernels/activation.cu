// Pointwise activations, forward and backward.
//
// One thread per element in a grid-stride loop: consecutive threads touch
// consecutive elements, so every warp access is coalesced; the grid is capped
// by Python (dnnprims/activation.py) and each thread walks on by the grid's
// total width.  The mode is a template parameter, so each specialisation is a
// branch-free elementwise kernel.  Backward takes the forward *input* x.
// The math (modes, derivatives, PyTorch's conventions at the kinks) lives in
// activation_math.cuh, shared with the fused convolution epilogues.
#include "activation_math.cuh"

template <typename T, typename index_t, int MODE>
__global__ void activation_forward(const T* x, T* y, index_t n, acc_t<T> alpha) {
    const index_t stride = (index_t)gridDim.x * (index_t)blockDim.x;
    for (index_t i = (index_t)blockIdx.x * (index_t)blockDim.x + (index_t)threadIdx.x; i < n; i += stride)
        y[i] = store<T>(activate<MODE>(load(x[i]), alpha));
}

template <typename T, typename index_t, int MODE>
__global__ void activation_backward(const T* dy, const T* x, T* dx, index_t n, acc_t<T> alpha) {
    const index_t stride = (index_t)gridDim.x * (index_t)blockDim.x;
    for (index_t i = (index_t)blockIdx.x * (index_t)blockDim.x + (index_t)threadIdx.x; i < n; i += stride)
        dx[i] = store<T>(load(dy[i]) * derivative<MODE>(load(x[i]), alpha));
}
