"""tools/side_by_side.py, which `make test` runs its two chapter sessions with: every line comes through, prefixed by
its command's name, the commands run at the same time, and the exit status is the first failed command's."""
import subprocess
import sys

from helpers import REPO

TOOL = [sys.executable, str(REPO / "tools" / "side_by_side.py")]


def test_lines_are_prefixed_and_the_commands_run_at_once(tmp_path):
    # each command marks its start, then waits (up to 30 s) for the other's mark: both see it only side by side
    wait = "touch {me}; for i in $(seq 300); do [ -e {other} ] && break; sleep 0.1; done; [ -e {other} ] && echo saw {other}"
    a = "a=echo one; " + wait.format(me="A", other="B") + "; echo two"
    b = "b=" + wait.format(me="B", other="A")
    r = subprocess.run(TOOL + [a, b], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert {"[a] one", "[a] saw B", "[a] two", "[b] saw A"} <= set(lines)
    assert lines.index("[a] one") < lines.index("[a] saw B") < lines.index("[a] two")
    assert [l.split(" after ")[0] for l in lines[-2:]] == ["[a] exit status 0", "[b] exit status 0"]


def test_the_first_failure_sets_the_status_and_nothing_is_lost():
    r = subprocess.run(TOOL + ["ok=echo fine", "bad=echo broken; exit 3", "worse=exit 5"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 3 and "[bad] broken" in r.stdout and "[worse] exit status 5" in r.stdout


def test_a_malformed_argument_is_refused_by_name():
    r = subprocess.run(TOOL + ["no-equals-sign"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "expected NAME=COMMAND, got 'no-equals-sign'" in r.stderr
