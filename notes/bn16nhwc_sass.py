"""SASS figures of the channel-last resident batch-norm kernels, old tree against
new (notes/bn16nhwc.md): per specialisation, registers (nvdisasm's highest
register + 1), instructions, and the instruction kinds the 16-bit paths spend on
(PRMT byte moves, MUFU.RCP = IEEE divisions' fast path, HADD2.F32 / F2F / F2FP
conversions), for main's expressions and the new flags (ONE_COUNT, WORDS).
Built on notes/ab/sass_compare.py (the device's NVRTC 13.0 settings):
    LIBNVRTC=... python notes/bn16nhwc_sass.py OLD_ROOT NEW_ROOT"""
import collections
import sys

sys.path.insert(0, "notes/ab")
import sass_compare as sc  # noqa: E402

KINDS = ("PRMT", "MUFU.RCP", "HADD2.F32", "F2F", "F2FP", "LDG", "STG", "LDS", "STS", "CALL")


def figures(lines):
    ops = collections.Counter()
    for line in lines:
        op = line.split()[1] if line.startswith("@") else line.split()[0]
        for kind in KINDS:
            if op.startswith(kind):
                ops[kind] += 1
    first = next(i for i, line in enumerate(lines) if "LDG.E" in line and "STRONG" not in line)
    barrier = next(i for i, line in enumerate(lines) if "MEMBAR" in line)
    return (f"regs {sc.registers(lines):3d} instr {len(lines):5d} pass1 {barrier - first:4d} "
            + " ".join(f"{k} {ops[k]:3d}" for k in KINDS if k != "F2F"))


def main(old_root, new_root):
    print(sc.version(), "; pass1 = instructions from the first row load to the first MEMBAR (pass 1's code)")
    pairs = []
    for t in ("half_t", "bfloat16_t", "float"):
        v = 4 if t == "float" else 8
        base = f"batchnorm_rows_train_resident<{t}, float, int, {v}"
        pairs.append((base + ">", base + ", true>"))
        if v == 8:
            pairs.append((base + ">", base + ", false, true>"))
            pairs.append((base + ">", base + ", true, true>"))
            back = f"batchnorm_rows_backward_resident<{t}, float, int, {v}"
            pairs.append((back + ">", back + ", true>"))
    olds, news = zip(*pairs)
    for a, b, la, lb in sc.compare(old_root, new_root, "batchnorm.cu", list(olds), list(news)):
        print(f"{a}\n    old            {figures(la)}\n    new {b[b.index('int'):]:>10s} {figures(lb)}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
