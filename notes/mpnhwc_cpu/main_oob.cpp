// notes/mpnhwc_cpu/gen.py's out-of-bounds driver (gen.py KERNELS_DIR OUT.cpp main_oob.cpp):
// r50-sized NHWC shapes (C 32 / 64 / 128, H = W = 111 / 112 / 113, N 2, and the A/B's odd
// shape class), every walk variant (SLOTS 8 / 4 x S 1 / 2 / 4 x PF off / on; MINB changes no
// source) and main's shfl kernel, with the grid the dispatch computes (dnnprims/pooling.py
// _nhwc_walk_launch: min(ceil(items / 256), _MAX_ITEMS_BLOCKS = 2^20)) and a 5-block grid
// (grid-stride loop), every load / store bounds-checked (gen.py) and dx compared bit for bit
// with a scalar scatter in row-major window order (the gather's sums, the same order).
static void scatter(const float* x, const float* dy, float* dx, int N, int H, int W, int C) {
    const int Ho = (H - 1) / 2 + 1, Wo = (W - 1) / 2 + 1;
    std::fill(dx, dx + (size_t)N * H * W * C, 0.0f);
    for (int n = 0; n < N; ++n) for (int c = 0; c < C; ++c)
        for (int oh = 0; oh < Ho; ++oh) for (int ow = 0; ow < Wo; ++ow) {
            size_t best = 0; int any = 0; float bv = 0;
            for (int h = 2 * oh - 1; h <= 2 * oh + 1; ++h) for (int w = 2 * ow - 1; w <= 2 * ow + 1; ++w) {
                if (h < 0 || h >= H || w < 0 || w >= W) continue;
                const size_t k = (((size_t)n * H + h) * W + w) * C + c;
                if (!any || x[k] > bv || x[k] != x[k]) { best = k; bv = x[k]; any = 1; }
            }
            dx[best] += dy[(((size_t)n * Ho + oh) * Wo + ow) * C + c];
        }
}

template <typename K>
static void run(K kernel, int grid_blocks, long long items) {
    blockDim.x = 256;
    gridDim.x = grid_blocks;
    std::barrier<> bar(32);
    warp_barrier = &bar;
    // 32 lane threads run every warp in turn (a warp's shuffles are collective, so the lanes stay in
    // step); only warps that get an item run (the others exit at once on a GPU too)
    std::vector<std::thread> lanes;
    for (int l = 0; l < 32; ++l)
        lanes.emplace_back([&, l] {
            for (int b = 0; b < grid_blocks; ++b)
                for (int w = 0; w < 8; ++w) {
                    if ((long long)b * 256 + w * 32 >= items) continue;
                    blockIdx.x = b;
                    threadIdx.x = w * 32 + l;
                    kernel();
                }
        });
    for (auto& t : lanes) t.join();
}

int main(int argc, char** argv) {
    std::mt19937 rng(11);
    long long cases = 0, bad = 0, oob_cases = 0;
    struct Shape { int N, H, W, C; bool all; };
    std::vector<Shape> shapes = {{2, 112, 112, 64, true}, {2, 113, 113, 64, true}, {2, 111, 111, 64, true},
                                 {2, 112, 112, 32, false}, {2, 112, 112, 128, false}, {2, 113, 113, 32, false},
                                 {2, 111, 111, 128, false}, {2, 57, 45, 96, true}, {2, 56, 56, 256, false}};
    if (argc > 1) shapes.resize(atoi(argv[1]));
    for (const Shape& sh : shapes) {
        const int N = sh.N, H = sh.H, W = sh.W, C = sh.C, Ho = (H - 1) / 2 + 1, Wo = (W - 1) / 2 + 1;
        // x and dy with 64 KB of NaN slack after them, outside the checked spans: a read past x cannot
        // land in dy (and pass the check) wherever the allocator put the two
        const size_t xs = (size_t)N * H * W * C, dys = (size_t)N * Ho * Wo * C, slack = 16384;
        std::vector<float> x(xs + slack, NAN), dy(dys + slack, NAN), ref(xs);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (size_t k = 0; k < xs; ++k) x[k] = u(rng);
        for (size_t k = 0; k < dys; ++k) dy[k] = u(rng);
        auto checked = [&](const std::vector<float>& got) {  // the spans: x, dy without the slack; dx
            oob_set(x, dy, got);
            oob_load[0].hi = (const char*)(x.data() + xs);
            oob_load[1].hi = (const char*)(dy.data() + dys);
        };
        scatter(x.data(), dy.data(), ref.data(), N, H, W, C);
        auto check = [&](const std::vector<float>& got, const char* what, int k, int s, int pf, int grid,
                         long long oob) {
            ++cases;
            const bool diff = memcmp(got.data(), ref.data(), got.size() * 4) != 0;
            bad += diff;
            oob_cases += oob != 0;
            printf("[%d,%d,%d,%d] %s K %d S %d PF %d grid %d: %s, %lld out-of-bounds\n", N, H, W, C, what, k, s,
                   pf, grid, diff ? "dx DIFFERS" : "dx bitwise", oob);
            fflush(stdout);
        };
        {   // main's shfl kernel (SLOTS 8, cols 32; dnnprims/pooling.py's shfl launch)
            const int cols = 32, segments = (Wo + cols - 1) / cols, groups = (Ho + 6) / 7;
            const long long items = (long long)N * segments * groups * (C / 16) * 32;
            const int grid = (int)std::min<long long>((items + 255) / 256, 1 << 20);
            std::vector<float> got(xs, 12345.0f);
            checked(got);
            const long long before = oob_count.load();
            run([&] { pool_nhwc_k3s2_backward_shfl<float, int, 8, 2>(x.data(), dy.data(), got.data(), (int)items,
                                                                       C, H, W, Ho, Wo, groups, segments, cols); },
                grid, items);
            check(got, "shfl", 8, 0, 0, grid, oob_count.load() - before);
        }
        for (int k : {8, 4}) for (int s : {1, 2, 4}) for (int pf = 0; pf < 2; ++pf) for (int few = 0; few < 2; ++few) {
            if (C % (128 / k) || (!sh.all && (s == 1 || pf)) || (few && (s != 2 || pf))) continue;
            const int segments = (Ho + s - 1) / s, groups = (Wo + k - 2) / (k - 1);
            const long long items = (long long)N * segments * groups * (C / (128 / k)) * 32;
            const int grid = few ? 5 : (int)std::min<long long>((items + 255) / 256, 1 << 20);
            std::vector<float> got(xs, 12345.0f);
            checked(got);
            const long long before = oob_count.load();
            auto go = [&](auto kern) { run([&] { kern(x.data(), dy.data(), got.data(), (int)items, C, H, W, Ho, Wo,
                                                      groups, segments); }, grid, items); };
#define WALK(K, S, PF) if (k == K && s == S && pf == PF) go(pool_nhwc_k3s2_backward_walk<float, int, K, S, 4, PF>);
            WALK(8, 1, 0) WALK(8, 1, 1) WALK(8, 2, 0) WALK(8, 2, 1) WALK(8, 4, 0) WALK(8, 4, 1)
            WALK(4, 1, 0) WALK(4, 1, 1) WALK(4, 2, 0) WALK(4, 2, 1) WALK(4, 4, 0) WALK(4, 4, 1)
            check(got, "walk", k, s, pf, grid, oob_count.load() - before);
        }
    }
    printf("%lld cases, %lld mismatches, %lld cases with out-of-bounds accesses (%lld accesses)\n", cases, bad,
           oob_cases, oob_count.load());
    return bad != 0 || oob_cases != 0;
}
