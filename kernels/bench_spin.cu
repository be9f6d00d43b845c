// Busy wait for the host-overhead benchmark (dnnprims/bench/overhead.py).
//
// One thread reads the GPU's global nanosecond timer until `ns` have passed.
// Launched right before a timed burst of calls, it holds the stream: every
// launch of the burst queues behind it, so the burst's wall-clock time is the
// host's work alone -- it cannot include GPU time, nor a wait for the GPU (a
// hidden synchronisation would wait for the spin, and the burst would then
// last as long as the spin: the benchmark flags that).
__global__ void spin_wait_ns(long long ns)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (static_cast<long long>(now - start) < ns);
}
