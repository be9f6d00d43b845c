"""The short table printed last by notes/norms3_gpu.sh: the benchmark rows
(ours vs PyTorch, fraction of copy) and the A/B probe rows.
    python notes/norms3_table.py BENCH.json PROBE.json"""
import json
import sys


def main(bench_path, probe_path):
    try:
        bench = json.load(open(bench_path))
        copy = bench.get("ceilings", {}).get("copy_GBps") or float("nan")
        print(f"\n== bench (copy {copy:.0f} GB/s): op | problem | ours ms | torch ms | torch/ours | of copy")
        for r in bench["rows"]:
            if r.get("kind") != "memory":
                continue
            if "error" in r:
                print(f"{r.get('op')} | {r.get('name')} | ERROR {r['error'][:120]}")
                continue
            frac = r.get("GBps", float("nan")) / copy
            print(f"{r['op']} | {r['name']} | {r['ms']:.4f} | {r.get('torch_ms', float('nan')):.4f} | "
                  f"{r.get('ratio', float('nan')):.2f} | {frac:.2f}")
    except Exception as e:  # noqa: BLE001
        print(f"(no bench table: {type(e).__name__}: {e})")
    try:
        probe = json.load(open(probe_path))
        print(f"\n== A/B probe (copy {probe['copy_GBps']:.0f} GB/s): case | path ms (of copy) ... | torch ms (of copy) x torch/first path | max diff")
        for r in probe["rows"]:
            if "error" in r:
                print(f"{r['case']} | ERROR {r['error']}")
                continue
            paths = [k for k in r if k + "_of_copy" in r and k != "torch"]
            parts = [f"{k} {r[k]:.4f} ({r[k + '_of_copy']:.2f})" for k in paths]
            if "torch" in r and paths:
                parts.append(f"torch {r['torch']:.4f} ({r['torch_of_copy']:.2f}) x{r['torch'] / r[paths[0]]:.2f}")
            print(f"{r['case']} | " + " | ".join(parts) + f" | {r.get('max_diff', 0):.2g}")
    except Exception as e:  # noqa: BLE001
        print(f"(no probe table: {type(e).__name__}: {e})")


if __name__ == "__main__":
    main(*sys.argv[1:3])
