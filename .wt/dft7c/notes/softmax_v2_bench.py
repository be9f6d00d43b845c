"""Benchmark rows for the softmax v2 run (notes/softmax_v2_run.sh).

python notes/softmax_v2_bench.py new|old OUT_DIR
new: rows_65536x1024, channel_64x256x56x56 (all dtypes), act_64x256x56x56 with
     fp32 gelu only (fp32 activations are unchanged) plus the 16-bit modes, and
     bias_act_64x256x56x56.
old: the channel and bias rows with the new paths switched off (shared-memory
     channel tile, scalar NHWC bias backward): an A/B in the same run.
"""
import json
import pathlib
import sys

import dnnprims.activations as activations
import dnnprims.bench.__main__ as bench
import dnnprims.softmaxes as softmaxes

which, out = sys.argv[1], pathlib.Path(sys.argv[2])
problems = json.loads(bench.PROBLEMS.read_text())
for spec in problems["activation"]:
    spec["modes"] = ["gelu"]
path = out / "problems_v2.json"
path.write_text(json.dumps(problems))
bench.PROBLEMS = path
if which == "old":
    softmaxes._CHANNEL_VALUES = 0
    activations._NHWC_PACKED = False
    only = "channel_64x256x56x56,bias_act_64x256x56x56"
else:
    only = "rows_65536x1024,channel_64x256x56x56,act_64x256x56x56"
sys.exit(bench.main(["memory", "--repeat", "15", "--only", only, "--json", str(out / f"bench_{which}.json")]))
