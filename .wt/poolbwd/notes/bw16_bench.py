"""Benchmark rows for the bw16 run (notes/bw16_run.sh), side by side with PyTorch.

python notes/bw16_bench.py OUT_DIR ONLY
Applies the choice of notes/bw16_probe.py (OUT/choice.json) to softmaxes.CHANNEL_PACKS
and normalization.TRAIN_CHUNKS_PER_BLOCK when present, then runs `python -m dnnprims.bench memory
--only ONLY` in this process.
"""
import json
import pathlib
import sys

import dnnprims.bench.__main__ as bench
import dnnprims.normalization as normalization
import dnnprims.softmaxes as softmaxes

out = pathlib.Path(sys.argv[1])
choice_path = out / "choice.json"
if choice_path.exists():
    for key, table in json.loads(choice_path.read_text()).items():  # "forward False" -> {ctype: [K, threads, MINB]}
        if key == "bn_chunks_per_block":
            normalization.TRAIN_CHUNKS_PER_BLOCK.update(table)
            continue
        direction, log = key.split()
        softmaxes.CHANNEL_PACKS[(direction, log == "True")].update({t: tuple(v) for t, v in table.items()})
print("CHANNEL_PACKS", softmaxes.CHANNEL_PACKS, "TRAIN_CHUNKS_PER_BLOCK", normalization.TRAIN_CHUNKS_PER_BLOCK,
      flush=True)
sys.exit(bench.main(["memory", "--repeat", "15", "--json", str(out / "bench.json"), "--only", sys.argv[2]]))
