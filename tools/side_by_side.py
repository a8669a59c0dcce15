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


def _echo(name: str, proc: subprocess.Popen, lock: threading.Lock, ends: dict, started: float) -> None:
    "Echo `proc`'s lines as they come, prefixed by `[name] `; then record its (exit status, seconds) in `ends`."
    for line in proc.stdout:
        with lock:
            sys.stdout.write(f"[{name}] {line}")
            sys.stdout.flush()
    ends[name] = (proc.wait(), time.time() - started)


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
    started, readers, ends = time.time(), [], {}
    for name, command in jobs:
        proc = subprocess.Popen(["bash", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1, env=env)
        reader = threading.Thread(target=_echo, args=(name, proc, lock, ends, started), daemon=True)
        reader.start()
        readers.append(reader)
    for reader in readers:
        reader.join()
    for name, _ in jobs:
        rc, sec = ends[name]
        print(f"[{name}] exit status {rc} after {sec:.0f} s")
    return next((ends[name][0] for name, _ in jobs if ends[name][0] != 0), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
