"""The benchmark command runs every family end to end (NumPy path, tiny problems):
each family records rows, and no row or family set-up records an error."""
import json

import numpy as np

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


# Floor bytes of every memory row, by hand from the shape (fp32: 4 bytes, fp16: 2), so that a change
# to a formula cannot drift silently.  x is the input, y the output; floors from the issue: each
# pass over a tensor counts once.
FLOOR_PROBLEMS = {
    "pool": [{"name": "p_max", "N": 1, "C": 2, "H": 7, "W": 7, "mode": "max", "window": 3, "stride": 2, "pad": 1},
             {"name": "p_avg", "N": 1, "C": 2, "H": 6, "W": 6, "mode": "avg", "window": 2, "stride": 2, "pad": 0},
             {"name": "p_global", "N": 1, "C": 3, "H": 4, "W": 4, "mode": "avg", "window": 4, "stride": 1,
              "pad": 0}],
    "batchnorm": [{"name": "bn", "N": 2, "C": 3, "H": 5, "W": 5},
                  {"name": "bn_nhwc_f16", "N": 2, "C": 3, "H": 5, "W": 5, "layout": "NHWC", "dtype": "float16"}],
    "softmax": [{"name": "sm_rows", "shape": [3, 13], "axis": 1, "dtypes": ["float32", "float16"]},
                {"name": "sm_channel", "shape": [2, 3, 4, 4], "axis": 1}],
    "activation": [{"name": "act", "shape": [2, 3, 5, 5], "modes": ["relu", "sigmoid"]}],
    "layer_norm": [{"name": "ln", "shape": [3, 13]}],
    "rms_norm": [{"name": "rms", "shape": [3, 13]}],
    "group_norm": [{"name": "gn", "N": 2, "C": 4, "H": 3, "W": 3, "groups": 2}],
    "tensor_ops": [{"name": "t", "shape": [2, 3, 5, 5]}],
    "bias_activation": [{"name": "ba", "shape": [2, 3, 5, 5], "modes": ["relu"], "layouts": ["NCHW", "NHWC"]}],
}
# x: 392 B (1x2x7x7), y: 128 B (1x2x4x4); avg x 288, y 72; global x 192, y 12; bn n = 600 (150 fp32),
# n = 300 (fp16); softmax rows n = 156 (fp16 78), channel n = 384; act/tensor/bias n = 600; ln/rms n = 156;
# gn n = 288.  Values are (floor when the tensors fit in L2, floor when they do not).
EXPECTED_FLOORS = {
    ("pool_max forward", "p_max"): 392 + 128,
    ("pool_max backward", "p_max"): 392 + 128 + 392,  # read x (winners) and dy, write dx
    ("pool_avg forward", "p_avg"): 288 + 72,
    ("pool_avg backward", "p_avg"): 72 + 288,  # read dy, write dx
    ("pool_avg forward", "p_global"): 192 + 12,
    ("pool_avg backward", "p_global"): 12 + 192,
    ("batchnorm train forward", "bn"): (2 * 600, 3 * 600),  # x once (or twice), y
    ("batchnorm infer forward", "bn"): 2 * 600,
    ("batchnorm backward", "bn"): (3 * 600, 5 * 600),  # x, dy once (or twice), dx
    ("batchnorm train forward", "bn_nhwc_f16"): (2 * 300, 3 * 300),
    ("batchnorm infer forward", "bn_nhwc_f16"): 2 * 300,
    ("batchnorm backward", "bn_nhwc_f16"): (3 * 300, 5 * 300),
    ("softmax forward", "sm_rows"): 2 * 156, ("softmax backward", "sm_rows"): 3 * 156,
    ("log_softmax forward", "sm_rows"): 2 * 156, ("log_softmax backward", "sm_rows"): 3 * 156,
    ("softmax forward fp16", "sm_rows"): 2 * 78, ("softmax backward fp16", "sm_rows"): 3 * 78,
    ("log_softmax forward fp16", "sm_rows"): 2 * 78, ("log_softmax backward fp16", "sm_rows"): 3 * 78,
    ("softmax forward", "sm_channel"): 2 * 384, ("softmax backward", "sm_channel"): 3 * 384,
    ("log_softmax forward", "sm_channel"): 2 * 384, ("log_softmax backward", "sm_channel"): 3 * 384,
    ("activation relu forward", "act"): 2 * 600, ("activation relu backward", "act"): 3 * 600,
    ("activation sigmoid forward", "act"): 2 * 600, ("activation sigmoid backward", "act"): 3 * 600,
    ("layer_norm forward", "ln"): 2 * 156, ("layer_norm backward", "ln"): 3 * 156,
    ("rms_norm forward", "rms"): 2 * 156, ("rms_norm backward", "rms"): 3 * 156,
    ("group_norm forward", "gn"): 2 * 288, ("group_norm backward", "gn"): 3 * 288,
    ("transform NCHW->NHWC", "t"): 2 * 600, ("transform NHWC->NCHW", "t"): 2 * 600,
    ("add_tensor bias", "t"): 2 * 600,  # read x, write y; the C bias values are not counted
    ("reduce_tensor sum (0,2,3)", "t"): 600,  # read x; C outputs not counted
    ("bias_activation relu forward NCHW", "ba"): 2 * 600, ("bias_activation relu backward NCHW", "ba"): 3 * 600,
    ("bias_activation relu forward NHWC", "ba"): 2 * 600, ("bias_activation relu backward NHWC", "ba"): 3 * 600,
}


def _memory_floors(tmp_path, tag):
    problems = tmp_path / f"floors_{tag}.json"
    problems.write_text(json.dumps(FLOOR_PROBLEMS))
    out = tmp_path / f"floors_{tag}_out.json"
    main(["memory", "--cpu", "--problems", str(problems), "--json", str(out), "--repeat", "1", "--quiet"])
    rows = json.loads(out.read_text())["rows"]
    assert not [r for r in rows if "error" in r], [r for r in rows if "error" in r][:3]
    return rows


def test_memory_floor_bytes_match_the_hand_count(tmp_path, monkeypatch):
    from dnnprims.bench import timing
    for fits, tag in ((True, "fits"), (False, "too_big")):
        if not fits:  # the tiny tensors play a tensor too big for the cache: two passes for batchnorm
            monkeypatch.setattr(timing, "L2_BYTES", 0)
        rows = _memory_floors(tmp_path, tag)
        got = {(r["op"], r["name"]): r["bytes"] for r in rows}
        want = {k: (v[0] if fits else v[1]) if isinstance(v, tuple) else v for k, v in EXPECTED_FLOORS.items()}
        assert got == want
        # The same-size copy moves the row's floor bytes (half read, half written).
        for r in rows:
            assert r["copy_same_size_GBps"] == timing.gbps(r["bytes"], r["copy_same_size_ms"])
        # bytes_once (each input read once, each output written once) equals the floor wherever the
        # floor is one pass with no input that only the accounting of ANCHORS.md counts (max pooling's y).
        for r in rows:
            if not r["op"].startswith(("batchnorm train", "batchnorm backward", "pool_max backward")):
                assert r["bytes_once"] == r["bytes"], r["op"]


def test_conv_flops_and_bytes_by_hand():
    from dnnprims.bench import timing
    # N1 C4 H7 W7 -> K6, 3x3, pad 1, groups 2: P = Q = 7; each output sums over C/groups * R * S = 18.
    p = {"N": 1, "C": 4, "H": 7, "W": 7, "K": 6, "R": 3, "S": 3, "P": 7, "Q": 7, "groups": 2}
    assert timing.conv_flops(p) == 2 * (6 * 49) * 18
    x, w, y = 4 * 49, 6 * 2 * 9, 6 * 49
    for direction in ("forward", "backward_data", "backward_filter"):
        assert timing.conv_bytes(p, direction) == 4 * (x + w + y)  # read two operands, write the third
    assert timing.conv_bytes(p, "forward", itemsize=2) == 2 * (x + w + y)


def test_geometric_mean_skips_missing_and_summary_flags_errors():
    from dnnprims.bench import timing
    from dnnprims.bench.__main__ import _conv_means, summary
    assert abs(timing.geometric_mean([2.0, 0.5, None, float("nan")]) - 1.0) < 1e-12
    conv = [{"kind": "conv", "name": "a", "N": 1, "direction": "forward", "algo": "auto", "ratio": 2.0},
            {"kind": "conv", "name": "b", "N": 1, "direction": "forward", "algo": "auto", "ratio": 0.5},
            {"kind": "conv", "name": "c", "N": 1, "direction": "forward", "algo": "auto", "error": "E: x"}]
    line = _conv_means(conv)[0]
    assert "1.000 over 2 problems (min 0.50)" in line, line
    memory = [{"kind": "memory", "op": "softmax forward", "name": "m", "ms": 1.0, "torch_ms": 2.0, "ratio": 2.0,
               "GBps": 1.0, "error": "check: E"}]
    text = summary({"rows": conv + memory, "device": "cpu"})
    assert "ERROR" in text and "2 rows recorded an error" in text


def test_queued_timing_runs_every_call_behind_the_hold(gpu):
    """GPU: measure_queued holds the stream with the busy-wait kernel, queues `calls`
    calls (rotating among the input sets) behind it and times them; every call runs,
    and a burst issued within the hold is reported covered."""
    from dnnprims.bench import timing
    from dnnprims.bench.overhead import SPIN
    counts = [gpu.zeros(4, gpu.float32), gpu.zeros(4, gpu.float32)]

    def bump(a):
        a += 1

    def hold(ns):
        SPIN.launch("spin_wait_ns", (1,), (1,), (np.int64(ns),))

    t, covered = timing.measure_queued(bump, [(counts[0],), (counts[1],)], xp=gpu, hold=hold, calls=4,
                                       warmup=2, repeat=5, hold_s=0.2)
    gpu.cuda.Device().synchronize()
    assert t.median_ms > 0 and t.min_ms > 0 and t.repeats == 5 and covered
    # 2 warm-up calls (sets 0, 1), then 5 bursts of 4 calls (sets 0, 1, 0, 1)
    assert counts[0].get().tolist() == [1 + 5 * 2] * 4
    assert counts[1].get().tolist() == [1 + 5 * 2] * 4
