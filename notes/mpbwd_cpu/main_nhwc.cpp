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
    for (int b = 0; b < grid_blocks; ++b)
        for (int w = 0; w < 8; ++w) {
            std::vector<std::thread> lanes;
            for (int l = 0; l < 32; ++l)
                lanes.emplace_back([&, b, w, l] { blockIdx.x = b; threadIdx.x = w * 32 + l; kernel(); });
            for (auto& t : lanes) t.join();
        }
}

int main() {
    std::mt19937 rng(11);
    long long cases = 0, bad = 0;
    const int HW[][2] = {{1, 1}, {2, 3}, {3, 7}, {7, 13}, {14, 14}, {13, 20}, {6, 35}, {30, 9}, {17, 16}};
    for (int kind = 0; kind < 2; ++kind)
    for (auto& hw : HW) for (int C : {8, 16, 24, 32}) {
        const int N = 2, H = hw[0], W = hw[1], Ho = (H - 1) / 2 + 1, Wo = (W - 1) / 2 + 1;
        std::vector<float> x((size_t)N * H * W * C), dy((size_t)N * Ho * Wo * C);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        std::uniform_int_distribution<int> ui(-2, 2), pct(0, 99);
        for (auto& v : x) {
            if (kind == 0) v = u(rng);
            else { int r = pct(rng); v = r < 5 ? NAN : r < 10 ? INFINITY : r < 20 ? -INFINITY : r < 30 ? -0.0f : (float)ui(rng); }
        }
        for (auto& v : dy) v = u(rng);
        std::vector<float> ref(x.size());
        gather(x.data(), dy.data(), ref.data(), N, H, W, C);
        for (int variant = 0; variant < 6; ++variant) for (int cols : {3, 32}) for (int one = 0; one < 2; ++one) {
            // (slots, channels a lane, PF): 4 / 8 slots x 4 channels x PF off / on, 8 slots x 2 channels
            const int slots = variant == 0 || variant == 1 ? 4 : 8, vec = variant >= 4 ? 2 : 4, pf = variant & 1;
            const int lps = 32 / slots, segments = (Wo + cols - 1) / cols, groups = (Ho + slots - 2) / (slots - 1);
            if ((C / vec) % lps) continue;
            const long long items = (long long)N * segments * groups * (C / (vec * lps)) * 32;
            const int grid = one ? 1 : (int)((items + 255) / 256);
            std::vector<float> got(x.size(), 12345.0f);
            auto go = [&](auto kern) { run([&] { kern(x.data(), dy.data(), got.data(), (int)items, C, H, W, Ho, Wo,
                                                      groups, segments, cols); }, grid); };
            if (variant == 0) go(pool_nhwc_k3s2_backward_shfl<float, int, 4, 2, false>);
            if (variant == 1) go(pool_nhwc_k3s2_backward_shfl<float, int, 4, 2, true>);
            if (variant == 2) go(pool_nhwc_k3s2_backward_shfl<float, int, 8, 2, false>);
            if (variant == 3) go(pool_nhwc_k3s2_backward_shfl<float, int, 8, 2, true>);
            if (variant == 4) go(pool_nhwc_k3s2_backward_shfl<float, int, 8, 4, false, 8>);
            if (variant == 5) go(pool_nhwc_k3s2_backward_shfl<float, int, 8, 4, true, 8>);
            ++cases;
            if (memcmp(got.data(), ref.data(), got.size() * 4)) {
                ++bad;
                size_t k = 0;
                while (memcmp(&got[k], &ref[k], 4) == 0) ++k;
                printf("shfl variant %d SLOTS %d cols %d PF %d grid %d != gather: H %d W %d C %d kind %d at %zu (%g vs %g)\n",
                       variant, slots, cols, pf, grid, H, W, C, kind, k, got[k], ref[k]);
            }
        }
    }
    printf("%lld shfl cases, %lld mismatches\n", cases, bad);
    return bad != 0;
}
