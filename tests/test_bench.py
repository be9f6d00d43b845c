"""The benchmark command runs every family end to end (NumPy path, tiny problems):
each family records rows, and no row or family set-up records an error."""
import json

from dnnprims.bench.__main__ import main

TINY = {
    "conv2d": [{"name": "tiny_conv", "N": 1, "C": 3, "H": 7, "W": 7, "K": 4, "R": 3, "S": 3, "stride": 1,
                "pad": 1, "dilation": 1, "groups": 1}],
    "pool": [{"name": "tiny_pool", "N": 1, "C": 2, "H": 7, "W": 7, "mode": "max", "window": 3, "stride": 2,
              "pad": 1}],
    "batchnorm": [{"name": "tiny_bn", "N": 2, "C": 3, "H": 5, "W": 5}],
    "softmax": [{"name": "tiny_rows", "shape": [3, 13], "axis": 1}],
    "activation": [{"name": "tiny_act", "shape": [2, 3, 5, 5], "modes": ["relu", "gelu"]}],
    "bias_activation": [{"name": "tiny_bias_act", "shape": [2, 3, 5, 5], "modes": ["relu"],
                         "layouts": ["NCHW", "NHWC"]}],
    "layer_norm": [{"name": "tiny_ln", "shape": [3, 13]}],
    "rms_norm": [{"name": "tiny_rms", "shape": [3, 13]}],
    "group_norm": [{"name": "tiny_gn", "N": 2, "C": 4, "H": 3, "W": 3, "groups": 2}],
    "tensor_ops": [{"name": "tiny_tensor", "shape": [2, 3, 5, 5]}],
    "lstm": [{"hidden": 8, "batch": 2, "T": 2, "input": 8}],
}


def test_benchmark_runs_every_family_on_tiny_problems(tmp_path, capsys):
    problems = tmp_path / "problems.json"
    problems.write_text(json.dumps(TINY))
    out = tmp_path / "bench.json"
    main(["all", "--cpu", "--problems", str(problems), "--json", str(out), "--repeat", "1", "--quiet"])
    rows = json.loads(out.read_text())["rows"]
    errors = [r for r in rows if "error" in r]
    assert not errors, errors[:3]
    kinds = {r["kind"] for r in rows}
    assert {"conv", "memory"} <= kinds
    ops = {r["op"].split()[0] for r in rows if r["kind"] == "memory"}
    for op in ("pool_max", "batchnorm", "softmax", "activation", "layer_norm", "rms_norm", "group_norm",
               "transform", "add_tensor", "reduce_tensor", "bias_activation"):
        assert op in ops, f"no benchmark row for {op}: {sorted(ops)}"
    # Each memory row also says what a plain copy of its own floor bytes takes (timed the same way).
    memory = [r for r in rows if r["kind"] == "memory"]
    assert not [r for r in memory if "copy_error" in r]
    assert all(r["copy_same_size_ms"] > 0 and r["copy_same_size_GBps"] > 0 for r in memory)


def test_same_size_copy_is_timed_once_per_size():
    from dnnprims.bench.__main__ import Backend
    be = Backend(force_cpu=True)
    calls = []
    be.measure = lambda fn, inputs=None, repeat=20: calls.append(fn) or 0.5  # noqa: E731
    assert be.copy_ms(4096) == 0.5 and be.copy_ms(4096) == 0.5 and be.copy_ms(8192) == 0.5
    assert len(calls) == 2
