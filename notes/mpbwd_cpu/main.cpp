// Scalar gather: dx[h][w] = sum over covering windows (row-major) of dy where the window's
// pick (the last NaN, else the first maximum, row-major; padding never) is (h, w).
static void gather(const float* x, const float* dy, float* dx, int P, int H, int W) {
    const int Ho = (H - 1) / 2 + 1, Wo = (W - 1) / 2 + 1;
    for (int p = 0; p < P; ++p) {
        std::vector<int> pick((size_t)Ho * Wo);
        for (int oh = 0; oh < Ho; ++oh)
            for (int ow = 0; ow < Wo; ++ow) {
                int best = -1; float bv = 0;
                for (int h = 2 * oh - 1; h <= 2 * oh + 1; ++h)
                    for (int w = 2 * ow - 1; w <= 2 * ow + 1; ++w) {
                        if (h < 0 || h >= H || w < 0 || w >= W) continue;
                        float v = x[((size_t)p * H + h) * W + w];
                        if (best < 0 || v > bv || v != v) { best = h * W + w; bv = v; }
                    }
                pick[oh * Wo + ow] = best;
            }
        for (int h = 0; h < H; ++h)
            for (int w = 0; w < W; ++w) {
                float s = 0.0f;
                for (int oh = 0; oh < Ho; ++oh)
                    for (int ow = 0; ow < Wo; ++ow)
                        if (pick[oh * Wo + ow] == h * W + w) s += dy[((size_t)p * Ho + oh) * Wo + ow];
                dx[((size_t)p * H + h) * W + w] = s;
            }
    }
}

template <typename K>
static void run(K kernel, long long items, int grid_blocks) {
    blockDim.x = 256;
    gridDim.x = grid_blocks;
    for (unsigned b = 0; b < (unsigned)grid_blocks; ++b)
        for (unsigned t = 0; t < 256; ++t) {
            blockIdx.x = b; threadIdx.x = t;
            kernel();
        }
}

int main() {
    std::mt19937 rng(7);
    long long cases = 0, bad = 0;
    const int Hs[] = {1, 2, 3, 4, 5, 7, 8, 13, 14, 17, 20, 28, 30, 56, 57};
    const int Ws[] = {4, 8, 12, 16, 28, 56};
    for (int kind = 0; kind < 3; ++kind)
    for (int H : Hs) for (int W : Ws) {
        const int P = 3, Ho = (H - 1) / 2 + 1, Wo = W / 2, lanes = W / 4;
        std::vector<float> x((size_t)P * H * W), dy((size_t)P * Ho * Wo);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        std::uniform_int_distribution<int> ui(-2, 2), pct(0, 99);
        for (auto& v : x) {
            if (kind == 0) v = u(rng);
            else if (kind == 1) v = (float)ui(rng);  // ties
            else {  // ties, NaN, +-inf, -0.0
                int r = pct(rng);
                v = r < 5 ? NAN : r < 10 ? INFINITY : r < 20 ? -INFINITY : r < 30 ? -0.0f : (float)ui(rng);
            }
        }
        for (auto& v : dy) v = u(rng);
        std::vector<float> ref(x.size()), old(x.size(), 12345.0f), neu(x.size(), 12345.0f);
        gather(x.data(), dy.data(), ref.data(), P, H, W);
        {
            const int bands = (H + 3) / 4;
            long long items = (long long)P * bands * lanes;
            run([&] { pool_k3s2_backward<float, int, 2, 1>(x.data(), dy.data(), old.data(), (int)items, H, W, Ho, bands); },
                items, (int)((items + 255) / 256));
        }
        auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
            return memcmp(a.data(), b.data(), a.size() * 4) == 0; };
        if (!same(old, ref)) { printf("old kernel != gather H %d W %d kind %d\n", H, W, kind); ++bad; }
        for (int S : {2, 4, 8}) for (int pf = 0; pf < 2; ++pf) for (int oneblock = 0; oneblock < 2; ++oneblock) {
            const int segments = (Ho + S - 1) / S;
            long long items = (long long)P * segments * lanes;
            int grid = oneblock ? 1 : (int)((items + 255) / 256);
            std::fill(neu.begin(), neu.end(), 12345.0f);
            auto go = [&](auto kern) { run([&] { kern(x.data(), dy.data(), neu.data(), (int)items, H, W, Ho, segments); }, items, grid); };
            if (S == 2 && pf) go(pool_k3s2_backward_walk<float, int, 2, 4, true>);
            if (S == 2 && !pf) go(pool_k3s2_backward_walk<float, int, 2, 4, false>);
            if (S == 4 && pf) go(pool_k3s2_backward_walk<float, int, 4, 4, true>);
            if (S == 4 && !pf) go(pool_k3s2_backward_walk<float, int, 4, 4, false>);
            if (S == 8 && pf) go(pool_k3s2_backward_walk<float, int, 8, 4, true>);
            if (S == 8 && !pf) go(pool_k3s2_backward_walk<float, int, 8, 4, false>);
            ++cases;
            if (!same(neu, old)) {
                ++bad;
                size_t k = 0;
                while (memcmp(&neu[k], &old[k], 4) == 0) ++k;
                printf("walk S %d PF %d grid %d != old: H %d W %d kind %d first at %zu (%g vs %g)\n", S, pf, grid, H, W,
                       kind, k, neu[k], old[k]);
            }
        }
    }
    printf("%lld walk cases, %lld mismatches\n", cases, bad);
    return bad != 0;
}
