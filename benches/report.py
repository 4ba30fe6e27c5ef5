#!/usr/bin/env python3
"""Render benches/compare.sh's results (JSON lines) as Markdown tables on stdout.

Usage: report.py RESULTS.jsonl

Record kinds: meta (run parameters), unit (one PBKDF run, several), rotation, overhead,
count (key derivations and benchmarks reported by cryptsetup --debug), enroll, plan.
"""

import json
import statistics
import sys



def kdf_text(meta):
    """How the new keyslots' PBKDF cost was set: forced iterations, or a time target."""
    if meta.get("iter_time_ms"):
        return (f"iter-time {meta['iter_time_ms']} ms: a time target, so each tool's cryptsetup "
                f"benchmarks as that tool makes it (keyplan once per run, the others on every "
                f"luksAddKey); the unit below is one derivation at that target")
    return f"iterations {meta['iterations']} (forced: nobody benchmarks)"

def cpu(r: dict) -> float:
    return r["cpu_user_s"] + r["cpu_sys_s"]


def mib(kib: int) -> str:
    return f"{kib / 1024:.0f}"


def main() -> int:
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    meta = next(r for r in rows if r["kind"] == "meta")
    n = meta["devices"]
    units = [r for r in rows if r["kind"] == "unit"]
    unit = statistics.median(cpu(r) for r in units)
    out = []
    p = out.append
    p(f"Run {meta['date']}; {meta['nproc']} CPUs, {meta['mem_total_gib']} GiB RAM "
      f"({meta['mem_available_gib']} GiB available at start); {meta['cryptsetup']}; "
      f"keyplan {meta['keyplan']}; load average {meta['load_start']} at start, "
      f"{open('/proc/loadavg').read().split()[0]} at end.")
    p("")
    p(f"PBKDF for every tool: argon2id, memory {meta['memory_kib']} KiB, parallel {meta['parallel']}, "
      f"{kdf_text(meta)}. One PBKDF run (`cryptsetup open --test-passphrase "
      f"--key-slot 0`, median of {len(units)} samples taken through the run, "
      f"{min(cpu(r) for r in units):.2f}-{max(cpu(r) for r in units):.2f} s): **{unit:.2f} s CPU**, "
      f"{statistics.median(r['wall_s'] for r in units):.2f} s wall, "
      f"{mib(max(r['maxrss_kib'] for r in units))} MiB peak RSS.")
    p("")
    p(f"### Rotation of one key shared by {n} devices")
    p("")
    p("| tool | child CPU s | PBKDF-equivalents | per device | PBKDF runs counted by the tool | wall s | peak RSS, largest process MiB | peak RSS, sum of processes MiB |")
    p("|---|---:|---:|---:|---:|---:|---:|---:|")
    rot = {r["label"]: r for r in rows if r["kind"] in ("rotation", "overhead")}
    for r in rot.values():
        eq = cpu(r) / unit
        counted = r.get("self_counted")
        counted = f"{counted} ({counted / n:.1f} per device)" if counted is not None else "-"
        p(f"| {r['label']} | {cpu(r):.2f} | {eq:.1f} | {eq / n:.2f} | {counted} | {r['wall_s']:.1f} | "
          f"{mib(r['maxrss_kib'])} | {mib(r['tree_rss_kib'])} |")
    ans = rot.get("Ansible luks_device")
    harness = next((r for r in rot.values() if r["kind"] == "overhead"), None)
    if ans and harness:
        d = cpu(ans) - cpu(harness)
        p(f"| Ansible luks_device less its harness (difference of the two rows above) | {d:.2f} | "
          f"{d / unit:.1f} | {d / unit / n:.2f} | - | {ans['wall_s'] - harness['wall_s']:.1f} | - | - |")
    kp = [r for r in rot.values() if r["label"].startswith("keyplan")]
    others = [r for r in rot.values() if r["kind"] == "rotation" and not r["label"].startswith("keyplan")]
    if kp and others:
        best = min(cpu(r) for r in kp)
        p("")
        p("Cost ratio (child CPU of the tool / keyplan's cheaper run): " + "; ".join(
            f"{r['label']} {cpu(r) / best:.2f}x" for r in others) + ".")
    seq = rot.get("keyplan, parallelism 1")
    par = rot.get("keyplan, parallelism 2")
    if seq and par:
        p(f"keyplan wall time, parallelism 2 vs 1: {par['wall_s']:.1f} s vs {seq['wall_s']:.1f} s "
          f"(speed-up {seq['wall_s'] / par['wall_s']:.2f}x); peak memory of all processes "
          f"{mib(par['tree_rss_kib'])} MiB vs {mib(seq['tree_rss_kib'])} MiB.")
    for r in rot.values():
        if r.get("budget_kib"):
            p(f"With `memory_budget_kib: {r['budget_kib']}` ({r['budget_kib'] // 1024} MiB, room for one "
              f"PBKDF run of {meta['memory_kib'] // 1024} MiB + 16 MiB, not two) and parallelism 2: "
              f"{r['wall_s']:.1f} s wall, peak memory of all processes {mib(r['tree_rss_kib'])} MiB.")

    counts = [r for r in rows if r["kind"] == "count"]
    if counts:
        p("")
        p("### PBKDF work as cryptsetup reports it (`--debug`, counting pass on pbkdf2 devices)")
        p("")
        p("| tool | devices | key derivations | per device | PBKDF benchmarks | per device |")
        p("|---|---:|---:|---:|---:|---:|")
        for r in counts:
            d = r.get("devices", n)
            p(f"| {r['label']} | {d} | {r['derive']} | {r['derive'] / d:.1f} | {r['benchmark']} | {r['benchmark'] / d:.1f} |")

    enroll = [r for r in rows if r["kind"] == "enroll"]
    plans = [r for r in rows if r["kind"] == "plan"]
    if plans:
        p("")
        p("### `keyplan plan` on unchanged enrolled devices (wall time)")
        p("")
        p("| devices in the plan | devices keyplan knows (plan + state directory registry) | median wall s | runs (s) | median child CPU s | peak RSS MiB |")
        p("|---:|---:|---:|---|---:|---:|")
        for size, reg in sorted({(r["devices"], r["registry"]) for r in plans}, key=lambda t: (t[1] != t[0], t)):
            rs = [r for r in plans if r["devices"] == size and r["registry"] == reg]
            p(f"| {size} | {reg} | {statistics.median(r['wall_s'] for r in rs):.2f} | "
              f"{', '.join('%.2f' % r['wall_s'] for r in rs)} | "
              f"{statistics.median(cpu(r) for r in rs):.2f} | {mib(max(r['tree_rss_kib'] for r in rs))} |")
        for r in enroll:
            p("")
            p(f"Set-up, not part of `plan`: {r['label']}: {r['wall_s']:.1f} s wall, {cpu(r):.1f} s CPU.")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
