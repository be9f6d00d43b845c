"""The scoreboards of batchnorm_train_queued's loads, as the device's NVRTC compiles it:
NVRTC (LIBNVRTC, e.g. 13.0) -> sm_90 cubin with CuPy's options -> nvdisasm -hex; each
instruction's control bits (Volta+ layout: bits 105-125 of the 128-bit word: stall 4,
yield 1, write scoreboard 3, read scoreboard 3, wait mask 6) printed for the global loads
(LDG), the async copies (LDGSTS), their commit / wait (LDGDEPBAR, DEPBAR), the barriers,
and every instruction that waits on a scoreboard, up to the first barrier after the
first wait on the x loads' scoreboard: shows which loads group 0's first sum waits for.
    python notes/smallbn_sass.py ROOT 'expr' [lines]"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "ab"))
import sass_compare  # noqa: E402


def main(argv):
    root, expression, *rest = argv
    limit = int(rest[0]) if rest else 400
    kdir = os.path.join(root, "kernels")
    binary, lowered = sass_compare.cubin_of(open(os.path.join(kdir, "batchnorm.cu")).read(), kdir, [expression],
                                            "batchnorm.cu")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        open(path, "wb").write(binary)
        lines = subprocess.run([sass_compare.NVDISASM, "-hex", "-c", path], capture_output=True, text=True,
                               check=True).stdout.splitlines()
    name, current, n = lowered[expression], None, 0
    for i, line in enumerate(lines):
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            current = m.group(1)
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);\s*/\* (0x[0-9a-f]+) \*/", line)
        if not (m and current == name):
            continue
        hi = int(re.search(r"/\* (0x[0-9a-f]+) \*/", lines[i + 1]).group(1), 16)
        c = hi >> 41
        wr, rd, wait = (c >> 5) & 7, (c >> 8) & 7, (c >> 11) & 0x3F
        ins = " ".join(m.group(2).split())
        if any(k in ins for k in ("LDG", "DEPBAR", "BAR.", "STG")) or wait:
            print(f"{n:4d} wr={'-' if wr == 7 else wr} rd={'-' if rd == 7 else rd} wait={wait:06b}  {ins[:80]}")
        n += 1
        if n > limit:
            break


if __name__ == "__main__":
    main(sys.argv[1:])
