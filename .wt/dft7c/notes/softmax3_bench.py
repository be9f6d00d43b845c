"""Benchmark rows for the softmax3 run (notes/softmax3_run.sh), side by side with PyTorch.

python notes/softmax3_bench.py OUT_DIR
Takes the per-dtype *_channels_packs choice of notes/softmax3_probe.py (OUT/choice.json)
when present, then runs `python -m dnnprims.bench memory --only channel_64x256x56x56,
act_64x256x56x56,bias_act_64x256x56x56` on a copy of problems.json whose activation
problem lists only relu and gelu (the fp32 modes whose code or figures are in question).
"""
import json
import pathlib
import sys

import dnnprims.bench.__main__ as bench
import dnnprims.softmaxes as softmaxes

out = pathlib.Path(sys.argv[1])
choice_path = out / "choice.json"
if choice_path.exists():
    choice = json.loads(choice_path.read_text())
    for key, table in choice.items():  # "forward False" -> {ctype: [K, threads] or None}
        direction, log = key.split()
        packs = softmaxes.CHANNEL_PACKS[(direction, log == "True")]
        for ctype, shape in table.items():
            if shape is None:
                packs.pop(ctype, None)
            else:
                packs[ctype] = tuple(shape)
print("CHANNEL_PACKS", softmaxes.CHANNEL_PACKS, flush=True)
problems = json.loads(bench.PROBLEMS.read_text())
for spec in problems["activation"]:
    spec["modes"] = ["relu", "gelu"]
path = out / "problems_softmax3.json"
path.write_text(json.dumps(problems))
sys.exit(bench.main(["memory", "--repeat", "15", "--problems", str(path), "--json", str(out / "bench.json"),
                     "--only", "channel_64x256x56x56,act_64x256x56x56,bias_act_64x256x56x56"]))
