#!/usr/bin/env python3
"""Run one command and report what it and all its descendants cost, as one JSON object.

Usage: measure.py LABEL LOG -- COMMAND [ARG...]

COMMAND's stdout and stderr go to the file LOG. One line of JSON goes to stdout:

  label          LABEL
  rc             COMMAND's exit status
  wall_s         wall-clock seconds from start to exit
  cpu_user_s     user CPU seconds of COMMAND and every descendant it waited for
  cpu_sys_s      system CPU seconds, likewise
  maxrss_kib     peak resident set size of the largest single descendant (getrusage
                 RUSAGE_CHILDREN ru_maxrss: the largest one process, not the sum)
  tree_rss_kib   peak of the summed resident set sizes of the whole process tree, sampled
                 every 50 ms from /proc (what runs at once, e.g. two cryptsetup children of a
                 parallel apply); a sample, so a peak shorter than 50 ms can be missed

The CPU figures come from getrusage(RUSAGE_CHILDREN) taken before and after, so they count a
process only once it has been waited for (every process of the tools measured here is).
The sampler's own CPU is this process's, not a child's, and is not counted.
"""

import json
import os
import resource
import subprocess
import sys
import threading
import time

PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def tree_rss_kib(root: int) -> int:
    """Summed resident memory (KiB) of `root` and all its descendants, read from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may contain spaces: split after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(name))
    total = 0
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                total += int(f.read().split()[1]) * PAGE_KIB
        except (OSError, IndexError, ValueError):
            pass
        todo.extend(children.get(pid, []))
    return total


def main() -> int:
    if len(sys.argv) < 5 or sys.argv[3] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    label, log = sys.argv[1], sys.argv[2]
    cmd = sys.argv[4:]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss_kib(proc.pid))
            done.wait(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rc = proc.wait()
    wall = time.monotonic() - start
    done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(
        json.dumps(
            {
                "label": label,
                "rc": rc,
                "wall_s": round(wall, 3),
                "cpu_user_s": round(after.ru_utime - before.ru_utime, 3),
                "cpu_sys_s": round(after.ru_stime - before.ru_stime, 3),
                "maxrss_kib": after.ru_maxrss,
                "tree_rss_kib": peak,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
