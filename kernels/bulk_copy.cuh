// Hopper (sm_90+) data movement shared by kernel families: bulk copies
// global -> shared memory (TMA, cp.async.bulk) completed on an mbarrier, and
// thread-block clusters (distributed shared memory, the cluster barrier).
// Below sm_90 the helpers compile to nothing; their callers either trap there
// or take another path (Python checks the compute capability first).
#pragma once

// Hopper bulk copies (TMA, cp.async.bulk): one thread asks the copy engine
// for whole row pieces, completion counted in bytes on an mbarrier in shared
// memory (no per-thread 16-byte requests).  sm_90+; the callers fall back to
// copy16_async below that.
__device__ __forceinline__ unsigned shared_address(const void* p) {
    unsigned s;
    asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(s) : "l"(p));
    return s;
}

__device__ __forceinline__ void mbarrier_init1(unsigned long long* bar) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Copy `bytes` (a multiple of 16, both addresses 16-byte aligned) from gmem to
// smem in 32 KB pieces, completion counted on `bar`.
// `expect` > 0: first arrive on `bar` expecting that many bytes (all the copies of the phase).
__device__ __forceinline__ void bulk_copy_expect(unsigned long long* bar, void* smem, const void* gmem,
                                                 unsigned bytes, unsigned expect) {
#if __CUDA_ARCH__ >= 900
    const unsigned b = shared_address(bar);
    if (expect) asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(expect) : "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // earlier generic accesses of smem first
    const unsigned d = shared_address(smem);
    const char* g = static_cast<const char*>(gmem);
    for (unsigned o = 0; o < bytes; o += 32768u) {
        const unsigned n = bytes - o < 32768u ? bytes - o : 32768u;
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     ::"r"(d + o), "l"(g + o), "r"(n), "r"(b) : "memory");
    }
#endif
}

__device__ __forceinline__ void mbarrier_wait(unsigned long long* bar, unsigned parity) {
#if __CUDA_ARCH__ >= 900
    const unsigned b = shared_address(bar);
    unsigned done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(b), "r"(parity) : "memory");
#endif
}


// ---- Thread-block clusters (a kernel declared __cluster_dims__(CL, 1, 1)).

// This block's rank in its cluster.
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r = 0;
#if __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
    return r;
}

// Every thread of every block of the cluster arrives (release: its earlier
// shared-memory writes become visible to the cluster) ...
__device__ __forceinline__ void cluster_arrive() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}

// ... and waits for all the others (acquire).
__device__ __forceinline__ void cluster_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// The float / double at `p` (this block's shared memory) in the shared memory
// of the cluster's block `rank` (distributed shared memory).
__device__ __forceinline__ float cluster_load(const float* p, unsigned rank) {
    float v = 0.f;
#if __CUDA_ARCH__ >= 900
    unsigned a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(shared_address(p)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
#endif
    return v;
}

__device__ __forceinline__ double cluster_load(const double* p, unsigned rank) {
    double v = 0.0;
#if __CUDA_ARCH__ >= 900
    unsigned a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(shared_address(p)), "r"(rank));
    asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(a) : "memory");
#endif
    return v;
}
