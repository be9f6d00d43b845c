
// ---- reference gather (exact rule) and the driver
template <typename T>
void reference(const std::vector<unsigned short>& x, const std::vector<unsigned short>& dy, std::vector<unsigned short>& dx,
               int planes, int H, int W) {
    int Ho = (H - 1) / 2 + 1, Wo = (W - 1) / 2 + 1;
    std::vector<int> arg((size_t)planes * Ho * Wo);
    for (int p = 0; p < planes; ++p)
        for (int oh = 0; oh < Ho; ++oh)
            for (int ow = 0; ow < Wo; ++ow) {
                int pos = -1; float best = 0;
                for (int h = 2 * oh - 1; h <= 2 * oh + 1; ++h)
                    for (int w = 2 * ow - 1; w <= 2 * ow + 1; ++w) {
                        if (h < 0 || h >= H || w < 0 || w >= W) continue;
                        float e = tof<T>(x[((size_t)p * H + h) * W + w]);
                        if (pos < 0 || e > best || e != e) { best = e; pos = h * W + w; }
                    }
                arg[((size_t)p * Ho + oh) * Wo + ow] = pos;
            }
    for (int p = 0; p < planes; ++p)
        for (int h = 0; h < H; ++h)
            for (int w = 0; w < W; ++w) {
                float s = 0.0f;
                for (int oh = std::max(0, (h - 1 + 1) / 2 - 0); oh < Ho; ++oh) {
                    if (2 * oh - 1 > h) break;
                    if (2 * oh + 1 < h) continue;
                    for (int ow = 0; ow < Wo; ++ow) {
                        if (2 * ow - 1 > w) break;
                        if (2 * ow + 1 < w) continue;
                        if (arg[((size_t)p * Ho + oh) * Wo + ow] == h * W + w) s += tof<T>(dy[((size_t)p * Ho + oh) * Wo + ow]);
                    }
                }
                dx[((size_t)p * H + h) * W + w] = fromf<T>(s);
            }
}

template <typename T, int S, bool HINT>
int run(int planes, int H, int W, std::mt19937& g, int kind, int max_blocks) {
    int Ho = (H - 1) / 2 + 1, Wo = W / 2;
    std::vector<unsigned short> x((size_t)planes * H * W), dy((size_t)planes * Ho * Wo), dx(x.size(), 0x1234), want(x.size());
    std::uniform_int_distribution<int> small(-2, 2), u(0, 1000);
    for (auto& v : x) {
        float f = kind == 0 ? (float)(u(g) - 500) / 64.0f : (float)small(g);
        int r = u(g);
        if (kind == 1 && r < 8) f = NAN;
        else if (kind == 1 && r < 30) f = -INFINITY;
        else if (kind == 1 && r < 40) f = INFINITY;
        else if (kind == 1 && r < 60) f = -0.0f;
        v = fromf<T>(f);
    }
    if (kind == 2)  // planes of -inf with few values, NaN rows
        for (int p = 0; p < planes; ++p) for (int h = 0; h < H; ++h) for (int w = 0; w < W; ++w) {
            auto& v = x[((size_t)p * H + h) * W + w];
            if (p % 3 == 0) v = fromf<T>(u(g) < 20 ? 0.0f : -INFINITY);
            if (p % 3 == 1 && h % 4 == 1 + (p % 2) * 2) v = fromf<T>(NAN);
        }
    for (auto& v : dy) v = fromf<T>((float)(u(g) % 17 - 8) * (kind == 0 ? 0.37f : 1.0f));
    int lanes = W / 8, segments = (Ho + 2 * S - 1) / (2 * S);
    long long items = (long long)planes * segments * lanes;
    int blocks = (int)((items + 255) / 256);
    if (max_blocks && blocks > max_blocks) blocks = max_blocks;
    blockDim.x = 256; gridDim.x = blocks;
    for (unsigned b = 0; b < (unsigned)blocks; ++b)
        for (unsigned t = 0; t < 256; ++t) {
            blockIdx.x = b; threadIdx.x = t;
            pool_k3s2_backward_rolled<T, int, S, 2 KARG>((const T*)x.data(), (const T*)dy.data(), (T*)dx.data(),
                                                       (int)items, H, W, Ho, segments);
        }
    reference<T>(x, dy, want, planes, H, W);
    int bad = 0;
    for (size_t i = 0; i < x.size(); ++i)
        if (dx[i] != want[i]) {
            if (bad < 3) printf("  mismatch S%d H%d W%d kind%d at %zu: got %04x want %04x\n", S, H, W, kind, i, dx[i], want[i]);
            ++bad;
        }
    return bad;
}

int main() {
    std::mt19937 g(1);
    int total = 0, cases = 0;
    int Hs[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 14, 17, 20, 29, 30, 31, 57, 60};
    int Ws[] = {8, 16, 24, 56};
    for (int H : Hs) for (int W : Ws) for (int kind = 0; kind < 3; ++kind) {
        int planes = 5;
        total += run<half_t, 1, false>(planes, H, W, g, kind, 0);
        total += run<half_t, 2, false>(planes, H, W, g, kind, 0);
        total += run<bfloat16_t, 4, false>(planes, H, W, g, kind, 0);
        total += run<bfloat16_t, 2, false>(planes, H, W, g, kind, 1);
        total += run<half_t, 1, true>(planes, H, W, g, kind, 1);
        cases += 5;
    }
    printf("%d cases, %d mismatching elements\n", cases, total);
    return total != 0;
}
