// notes/mpnhwc_cpu/gen.py's driver: the walk (K 8 / 4 slots, S 1 / 2 / 4, PF off / on, full
// and one-block grids) and main's shfl kernel against the scalar gather, bit for bit.
// Scalar NHWC gather (the pick: the last NaN, else the first maximum, row-major; sums from
// +0 in row-major window order).
static void gather(const float* x, const float* dy, float* dx, int N, int H, int W, int C) {
    const int Ho = (H - 1) / 2 + 1, Wo = (W - 1) / 2 + 1;
    for (int n = 0; n < N; ++n) for (int c = 0; c < C; ++c) {
        auto X = [&](int h, int w) { return x[(((size_t)n * H + h) * W + w) * C + c]; };
        std::vector<int> pick((size_t)Ho * Wo);
        for (int oh = 0; oh < Ho; ++oh) for (int ow = 0; ow < Wo; ++ow) {
            int best = -1; float bv = 0;
            for (int h = 2 * oh - 1; h <= 2 * oh + 1; ++h) for (int w = 2 * ow - 1; w <= 2 * ow + 1; ++w) {
                if (h < 0 || h >= H || w < 0 || w >= W) continue;
                float v = X(h, w);
                if (best < 0 || v > bv || v != v) { best = h * W + w; bv = v; }
            }
            pick[oh * Wo + ow] = best;
        }
        for (int h = 0; h < H; ++h) for (int w = 0; w < W; ++w) {
            float s = 0.0f;
            for (int oh = 0; oh < Ho; ++oh) for (int ow = 0; ow < Wo; ++ow)
                if (pick[oh * Wo + ow] == h * W + w) s += dy[(((size_t)n * Ho + oh) * Wo + ow) * C + c];
            dx[(((size_t)n * H + h) * W + w) * C + c] = s;
        }
    }
}

template <typename K>
static void run(K kernel, int grid_blocks) {
    blockDim.x = 256;
    gridDim.x = grid_blocks;
    std::barrier<> bar(32);
    warp_barrier = &bar;
    // 32 lane threads run every warp in turn (a warp's shuffles are collective: the lanes stay in step)
    std::vector<std::thread> lanes;
    for (int l = 0; l < 32; ++l)
        lanes.emplace_back([&, l] {
            for (int b = 0; b < grid_blocks; ++b)
                for (int w = 0; w < 8; ++w) {
                    blockIdx.x = b;
                    threadIdx.x = w * 32 + l;
                    kernel();
                }
        });
    for (auto& t : lanes) t.join();
}

int main(int argc, char** argv) {
    std::mt19937 rng(5);
    long long cases = 0, bad = 0, oob_seen = 0, oob_cases = 0;
    const int HW[][2] = {{1, 1}, {2, 2}, {1, 5}, {5, 1}, {2, 3}, {3, 7}, {7, 13}, {14, 14}, {13, 20},
                         {6, 35}, {30, 9}, {17, 16}, {4, 31}, {9, 32}};
    for (int kind = 0; kind < 3; ++kind)
    for (auto& hw : HW) for (int C : {16, 32, 48, 64}) {
        if ((C == 48 || C == 64) && kind) continue;
        const int N = 2, H = hw[0], W = hw[1], Ho = (H - 1) / 2 + 1, Wo = (W - 1) / 2 + 1;
        std::vector<float> x((size_t)N * H * W * C), dy((size_t)N * Ho * Wo * C);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        std::uniform_int_distribution<int> ui(-2, 2), pct(0, 99);
        for (auto& v : x) {
            if (kind == 0) v = u(rng);
            else if (kind == 1) { int r = pct(rng); v = r < 5 ? NAN : r < 10 ? INFINITY : r < 20 ? -INFINITY : r < 30 ? -0.0f : (float)ui(rng); }
            else { int r = pct(rng); v = r < 50 ? -INFINITY : r < 60 ? NAN : (float)ui(rng); }  // all -inf windows, NaN rows
        }
        for (auto& v : dy) { v = (float)ui(rng) * 0.5f; if (pct(rng) < 5) v = -0.0f; if (kind == 0) v = u(rng); }
        std::vector<float> ref(x.size());
        gather(x.data(), dy.data(), ref.data(), N, H, W, C);
        auto check = [&](const std::vector<float>& got, const char* what, int s, int pf, int grid) {
            ++cases;
            if (const long long o = oob_count.load() - oob_seen) {  // bounds checks (gen.py)
                ++oob_cases;
                printf("%s S %d PF %d grid %d: H %d W %d C %d kind %d: %lld out-of-bounds accesses\n", what, s, pf,
                       grid, H, W, C, kind, o);
            }
            oob_seen = oob_count.load();
            if (memcmp(got.data(), ref.data(), got.size() * 4)) {
                ++bad;
                size_t k = 0;
                while (memcmp(&got[k], &ref[k], 4) == 0) ++k;
                printf("%s S %d PF %d grid %d != gather: H %d W %d C %d kind %d at %zu (%g vs %g)\n",
                       what, s, pf, grid, H, W, C, kind, k, got[k], ref[k]);
            }
        };
        {   // main's shfl kernel (SLOTS 8, cols 32)
            const int cols = 32, segments = (Wo + cols - 1) / cols, groups = (Ho + 6) / 7;
            const long long items = (long long)N * segments * groups * (C / 16) * 32;
            std::vector<float> got(x.size(), 12345.0f);
            oob_set(x, dy, got);
            run([&] { pool_nhwc_k3s2_backward_shfl<float, int, 8, 2>(x.data(), dy.data(), got.data(), (int)items,
                                                                       C, H, W, Ho, Wo, groups, segments, cols); },
                (int)((items + 255) / 256));
            check(got, "shfl", 0, 0, 0);
        }
        for (int k : {8, 4}) for (int s : {1, 2, 4}) for (int pf = 0; pf < 2; ++pf) for (int one = 0; one < 2; ++one) {
            if ((one && (s != 2 || kind == 2)) || C % (128 / k)) continue;
            const int segments = (Ho + s - 1) / s, groups = (Wo + k - 2) / (k - 1);
            const long long items = (long long)N * segments * groups * (C / (128 / k)) * 32;
            const int grid = one ? 1 : (int)((items + 255) / 256);
            std::vector<float> got(x.size(), 12345.0f);
            oob_set(x, dy, got);
            auto go = [&](auto kern) { run([&] { kern(x.data(), dy.data(), got.data(), (int)items, C, H, W, Ho, Wo,
                                                      groups, segments); }, grid); };
#define WALK(K, S, PF) if (k == K && s == S && pf == PF) go(pool_nhwc_k3s2_backward_walk<float, int, K, S, 4, PF>);
            WALK(8, 1, 0) WALK(8, 1, 1) WALK(8, 2, 0) WALK(8, 2, 1) WALK(8, 4, 0) WALK(8, 4, 1)
            WALK(4, 1, 0) WALK(4, 1, 1) WALK(4, 2, 0) WALK(4, 2, 1) WALK(4, 4, 0) WALK(4, 4, 1)
            check(got, k == 8 ? "walk K 8" : "walk K 4", s, pf, grid);
        }
    }
    printf("%lld cases, %lld mismatches, %lld cases with out-of-bounds accesses (%lld accesses)\n", cases, bad,
           oob_cases, oob_count.load());
    return bad != 0 || oob_count.load() != 0;
}
