"""SASS figures of the 16-bit channel-last resident batch-norm kernels and their AHEAD
versions batchnorm_rows_{train,backward}_ahead (notes/bn16nhwc2.md), compiled as the
device compiles them (notes/ab/sass_compare.py: NVRTC 13.0 with LIBNVRTC, sm_90, CuPy's
options): registers (nvdisasm's highest + 1),
local-memory traffic (LDL / STL: spills under the 2-blocks-an-SM cap of 128), global
loads (LDG) and instructions; then main's expressions compiled from both trees must be
identical (the switch off is main's code).
    LIBNVRTC=/tmp/nvrtc130/x/nvidia/cu13/lib/libnvrtc.so.13 python notes/bn16nhwc2_sass.py OLD_ROOT NEW_ROOT"""
import collections
import sys

sys.path.insert(0, "notes/ab")
import sass_compare as sc  # noqa: E402


def figures(lines):
    ops = collections.Counter()
    for line in lines:
        op = (line.split()[1] if line.startswith("@") else line.split()[0]).split(".")[0]
        ops[op] += 1
    return (f"regs {sc.registers(lines):3d}  LDL {ops['LDL']:3d}  STL {ops['STL']:3d}  LDG {ops['LDG']:3d}"
            f"  instr {len(lines):5d}")


def main(old_root, new_root):
    print(sc.version(), "sm_90")
    news = []
    for t, p in (("half_t", "float"), ("bfloat16_t", "float")):
        for i in ("int",):
            news.append(f"batchnorm_rows_train_resident<{t}, {p}, {i}, 8, true>")
            news.append(f"batchnorm_rows_train_resident<{t}, {p}, {i}, 8, true, true>")
            news += [f"batchnorm_rows_train_ahead<{t}, {p}, int, 8, {w}>" for w in ("false", "true") if i == "int"]
            news.append(f"batchnorm_rows_backward_resident<{t}, {p}, {i}, 8>")
            news += [f"batchnorm_rows_backward_ahead<{t}, {p}, int, 8, {w}>" for w in ("false", "true") if i == "int"]
    kernel_dir = f"{new_root}/kernels"
    listing = sc.listings(*sc.cubin_of(open(f"{kernel_dir}/batchnorm.cu").read(), kernel_dir, news, "batchnorm.cu"))
    for e in news:
        print(f"{figures(listing[e])}  {e}")
    olds = [e for t, v in (("half_t", 8), ("bfloat16_t", 8), ("float", 4), ("float", 1), ("half_t", 1))
            for e in (f"batchnorm_rows_train_resident<{t}, float, int, {v}>",
                      f"batchnorm_rows_train_resident<{t}, float, int, {v}, true>",
                      f"batchnorm_rows_backward_resident<{t}, float, int, {v}>",
                      f"batchnorm_rows_train_resident<{t}, float, long long, {v}, true>",
                      f"batchnorm_rows_backward_resident<{t}, float, long long, {v}>")]
    olds.append("batchnorm_rows_train_resident<double, double, int, 2>")
    olds.append("batchnorm_rows_backward_resident<double, double, int, 2>")
    olds.append("batchnorm_rows_train_resident<half_t, float, int, 8, true, true>")
    olds.append("batchnorm_rows_backward_resident<half_t, float, int, 8, true>")
    same = True
    for e, _, a, b in sc.compare(old_root, new_root, "batchnorm.cu", olds):
        differ = sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))
        same &= differ == 0
        print(f"{'identical' if not differ else f'{differ} of {len(a)} lines differ':>26}  regs {sc.registers(a)} / "
              f"{sc.registers(b)}  {e}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
