// LSTM and GRU cells: the fused pointwise part of one time step.
//
// The GEMMs (x @ w_ih^T, h @ w_hh^T, and the data/weight gradients) run in
// cuBLAS through cupy.matmul in acc_t<T> (dnnprims/recurrent.py); these
// kernels do everything between them in one pass: bias add, gate
// nonlinearities and the cell update (forward), and the gate gradients
// (backward).  Gate pre-activations and gate gradients are therefore acc_t<T>
// arrays (float for the half types): they never round to 16 bits.
//
// Mapping: one thread per (batch row b, hidden unit j), grid-stride.  Gate k of
// unit j lives at [b, k*hidden + j] (PyTorch's layout: LSTM gates i, f, g, o;
// GRU r, z, n), so neighbouring threads read neighbouring addresses of every
// gate block: coalesced.  The backward kernels recompute the gates from the
// saved GEMM outputs instead of storing them in forward.
#include "common.cuh"

__device__ __forceinline__ float exp_acc(float v) { return expf(v); }
__device__ __forceinline__ double exp_acc(double v) { return exp(v); }
__device__ __forceinline__ float tanh_acc(float v) { return tanhf(v); }
__device__ __forceinline__ double tanh_acc(double v) { return tanh(v); }

// exp(-|v|) never overflows, so neither branch does.
template <typename A> __device__ __forceinline__ A sigmoid_acc(A v) {
    const A e = exp_acc(-fabs(v));
    return v >= A(0) ? A(1) / (A(1) + e) : e / (A(1) + e);
}

// gates[b, k*hidden + j] = gx + gh + b_ih + b_hh for gate k of unit j.
template <typename T, typename index_t>
__device__ __forceinline__ acc_t<T> gate_preactivation(const acc_t<T>* gx, const acc_t<T>* gh, const T* b_ih,
                                                       const T* b_hh, index_t row, index_t col) {
    return gx[row + col] + gh[row + col] + load(b_ih[col]) + load(b_hh[col]);
}

// The four LSTM gates of unit j in the batch row starting at `row` (forward and
// backward recompute them from the saved GEMM outputs instead of storing them).
template <typename A>
struct LstmGates { A i, f, g, o; };

template <typename T, typename index_t>
__device__ __forceinline__ LstmGates<acc_t<T>> lstm_gates(const acc_t<T>* gx, const acc_t<T>* gh, const T* b_ih,
                                                          const T* b_hh, index_t row, index_t j, index_t hidden) {
    return {sigmoid_acc(gate_preactivation<T>(gx, gh, b_ih, b_hh, row, j)),
            sigmoid_acc(gate_preactivation<T>(gx, gh, b_ih, b_hh, row, hidden + j)),
            tanh_acc(gate_preactivation<T>(gx, gh, b_ih, b_hh, row, 2 * hidden + j)),
            sigmoid_acc(gate_preactivation<T>(gx, gh, b_ih, b_hh, row, 3 * hidden + j))};
}

// The GRU's r and z gates, the hidden part of n's pre-activation hn = gh_n + b_hn
// (r scales it), and n = tanh(gx_n + b_in + r * hn).
template <typename A>
struct GruGates { A r, z, hn, n; };

template <typename T, typename index_t>
__device__ __forceinline__ GruGates<acc_t<T>> gru_gates(const acc_t<T>* gx, const acc_t<T>* gh, const T* b_ih,
                                                        const T* b_hh, index_t row, index_t j, index_t hidden) {
    typedef acc_t<T> A;
    const A r = sigmoid_acc(gate_preactivation<T>(gx, gh, b_ih, b_hh, row, j));
    const A z = sigmoid_acc(gate_preactivation<T>(gx, gh, b_ih, b_hh, row, hidden + j));
    const index_t nj = 2 * hidden + j;
    const A hn = gh[row + nj] + load(b_hh[nj]);
    return {r, z, hn, tanh_acc(gx[row + nj] + load(b_ih[nj]) + r * hn)};
}

// h1 = o * tanh(c1), c1 = f * c + i * g.
template <typename T, typename index_t>
__global__ void lstm_cell_forward(const acc_t<T>* gx, const acc_t<T>* gh, const T* b_ih, const T* b_hh,
                                  const T* c, T* h1, T* c1, index_t batch, index_t hidden) {
    typedef acc_t<T> A;
    const index_t total = batch * hidden;
    const index_t stride = (index_t)gridDim.x * (index_t)blockDim.x;
    for (index_t t = (index_t)blockIdx.x * (index_t)blockDim.x + (index_t)threadIdx.x; t < total; t += stride) {
        const index_t b = t / hidden, j = t - b * hidden;
        const index_t row = b * 4 * hidden;
        const LstmGates<A> q = lstm_gates<T>(gx, gh, b_ih, b_hh, row, j, hidden);
        const A i = q.i, f = q.f, g = q.g, o = q.o;
        const A cn = f * load(c[t]) + i * g;
        c1[t] = store<T>(cn);
        h1[t] = store<T>(o * tanh_acc(cn));
    }
}

// Gate gradients dgates (batch, 4*hidden) with respect to the pre-activations
// (shared by both biases and both GEMMs), and dc = dc_total * f.
template <typename T, typename index_t>
__global__ void lstm_cell_backward(const acc_t<T>* gx, const acc_t<T>* gh, const T* b_ih, const T* b_hh,
                                   const T* c, const T* dh1, const T* dc1, acc_t<T>* dgates, T* dc,
                                   index_t batch, index_t hidden) {
    typedef acc_t<T> A;
    const index_t total = batch * hidden;
    const index_t stride = (index_t)gridDim.x * (index_t)blockDim.x;
    for (index_t t = (index_t)blockIdx.x * (index_t)blockDim.x + (index_t)threadIdx.x; t < total; t += stride) {
        const index_t b = t / hidden, j = t - b * hidden;
        const index_t row = b * 4 * hidden;
        const LstmGates<A> q = lstm_gates<T>(gx, gh, b_ih, b_hh, row, j, hidden);
        const A i = q.i, f = q.f, g = q.g, o = q.o;
        const A cp = load(c[t]);
        const A tc = tanh_acc(f * cp + i * g);
        const A dh = load(dh1[t]);
        const A dct = load(dc1[t]) + dh * o * (A(1) - tc * tc);
        dgates[row + j] = dct * g * i * (A(1) - i);
        dgates[row + hidden + j] = dct * cp * f * (A(1) - f);
        dgates[row + 2 * hidden + j] = dct * i * (A(1) - g * g);
        dgates[row + 3 * hidden + j] = dh * tc * o * (A(1) - o);
        dc[t] = store<T>(dct * f);
    }
}

// r = sigmoid(.), z = sigmoid(.), n = tanh(gx_n + b_in + r * (gh_n + b_hn)),
// h1 = (1 - z) * n + z * h.
template <typename T, typename index_t>
__global__ void gru_cell_forward(const acc_t<T>* gx, const acc_t<T>* gh, const T* b_ih, const T* b_hh,
                                 const T* h, T* h1, index_t batch, index_t hidden) {
    typedef acc_t<T> A;
    const index_t total = batch * hidden;
    const index_t stride = (index_t)gridDim.x * (index_t)blockDim.x;
    for (index_t t = (index_t)blockIdx.x * (index_t)blockDim.x + (index_t)threadIdx.x; t < total; t += stride) {
        const index_t b = t / hidden, j = t - b * hidden;
        const index_t row = b * 3 * hidden;
        const GruGates<A> q = gru_gates<T>(gx, gh, b_ih, b_hh, row, j, hidden);
        h1[t] = store<T>((A(1) - q.z) * q.n + q.z * load(h[t]));
    }
}

// Gradients of the input-side pre-activations dgx, of the hidden-side ones dgh
// (they differ in the n block: the hidden part is scaled by r), and the direct
// part of dh (dh1 * z; the GEMM part dgh @ w_hh is added in Python).
template <typename T, typename index_t>
__global__ void gru_cell_backward(const acc_t<T>* gx, const acc_t<T>* gh, const T* b_ih, const T* b_hh,
                                  const T* h, const T* dh1, acc_t<T>* dgx, acc_t<T>* dgh, acc_t<T>* dh_direct,
                                  index_t batch, index_t hidden) {
    typedef acc_t<T> A;
    const index_t total = batch * hidden;
    const index_t stride = (index_t)gridDim.x * (index_t)blockDim.x;
    for (index_t t = (index_t)blockIdx.x * (index_t)blockDim.x + (index_t)threadIdx.x; t < total; t += stride) {
        const index_t b = t / hidden, j = t - b * hidden;
        const index_t row = b * 3 * hidden;
        const GruGates<A> q = gru_gates<T>(gx, gh, b_ih, b_hh, row, j, hidden);
        const A r = q.r, z = q.z, hn = q.hn, n = q.n;
        const index_t nj = 2 * hidden + j;
        const A dh = load(dh1[t]);
        const A dn = dh * (A(1) - z) * (A(1) - n * n);
        const A dr = dn * hn * r * (A(1) - r);
        const A dz = dh * (load(h[t]) - n) * z * (A(1) - z);
        dgx[row + j] = dr;
        dgh[row + j] = dr;
        dgx[row + hidden + j] = dz;
        dgh[row + hidden + j] = dz;
        dgx[row + nj] = dn;
        dgh[row + nj] = dn * r;
        dh_direct[t] = dh * z;
    }
}
