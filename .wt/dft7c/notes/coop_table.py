"""The before / after table of notes/coop_probe.py's two JSON outputs."""
import json
import sys

before, after = (json.load(open(p)) for p in sys.argv[1:3])
print(f"{'case':44s} {'host us before':>14s} {'after':>8s} {'event ms before':>16s} {'after':>8s} {'coop':>5s}")
for name, a in after["rows"].items():
    b = before["rows"].get(name, {})
    hb, ha = b.get("host_us"), a.get("host_us")
    fmt = lambda v, f: (f % v) if v is not None else "-"  # noqa: E731
    print(f"{name:44s} {fmt(hb, '%14.1f')} {fmt(ha, '%8.1f')} {fmt(b.get('event_ms'), '%16.4f')} "
          f"{fmt(a.get('event_ms'), '%8.4f')} {'yes' if a.get('cooperative_launches') else 'no':>5s}")
print(f"cooperative launches refused (after): {after.get('refusals')}")
