"""Run shell commands side by side, one process each, and wait for them all (`make test` runs its chapters so).

    python tools/side_by_side.py NAME=COMMAND [NAME=COMMAND ...]

Each COMMAND runs in bash, in this directory and environment. Every line it prints is echoed as it comes,
prefixed by `[NAME] `, so two logs interleave line by line and each line says whose it is. The exit status is
0 when every command succeeded, else that of the first one (in argument order) that failed; the end of the
output names each command's status and seconds.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time


def _echo(name: str, proc: subprocess.Popen, lock: threading.Lock) -> None:
    for line in proc.stdout:
        with lock:
            sys.stdout.write(f"[{name}] {line}")
            sys.stdout.flush()


def main(argv: list[str]) -> int:
    jobs = []
    for arg in argv:
        name, sep, command = arg.partition("=")
        if not sep or not name or not command.strip():
            sys.exit(f"side_by_side.py: expected NAME=COMMAND, got {arg!r}")
        jobs.append((name, command))
    if not jobs:
        sys.exit(__doc__)
    lock, env = threading.Lock(), {**os.environ, "PYTHONUNBUFFERED": "1"}
    started, procs, readers = time.time(), [], []
    for name, command in jobs:
        proc = subprocess.Popen(["bash", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1, env=env)
        reader = threading.Thread(target=_echo, args=(name, proc, lock), daemon=True)
        reader.start()
        procs.append(proc); readers.append(reader)
    ends = {}
    for (name, _), proc, reader in zip(jobs, procs, readers):
        proc.wait(); reader.join()
        ends[name] = (proc.returncode, time.time() - started)
    for name, (rc, sec) in ends.items():
        print(f"[{name}] exit status {rc} after {sec:.0f} s")
    return next((rc for rc, _ in ends.values() if rc != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
