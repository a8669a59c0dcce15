"""tools/preloaded_kernel.py, the kernels nbval runs the notebooks in: forked from a server that has imported
the heavy packages, each runs as a fresh `python -m ipykernel_launcher` would, in its launcher's environment
and folder; jupyter_client's interrupt, shutdown and kill reach it; and where the environment differs from
the server's in a variable an import could have read, the kernel is started plain (the negative control of
each check that a kernel was forked: the same probe in a plain kernel)."""
import importlib.util
import json
import os
import time

import pytest
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

from helpers import REPO

_spec = importlib.util.spec_from_file_location("preloaded_kernel", REPO / "tools" / "preloaded_kernel.py")
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)

PROBE = ("import os, sys, json; print(json.dumps(dict(pid=os.getpid(), numpy='numpy' in sys.modules, "
         "threads=__import__('torch').get_num_threads(), "
         "cwd=os.getcwd(), path0=sys.path[0], argv0=sys.argv[0], "
         "preset=os.environ.get('COREINV_PRESET'), other=os.environ.get('CONTROL_SETTING'))))")


@pytest.fixture(scope="module")
def server():
    env = {k: v for k, v in os.environ.items() if k != "CONTROL_SETTING"}
    s = tool.Server(["numpy", "torch"], env=env)          # packages ipykernel itself does not import
    yield s
    s.stop()


def start(server, cwd, **extra):
    "A kernel started by jupyter_client, as nbval starts one, in the server's environment and `extra`."
    km = KernelManager(kernel_name=tool.KERNEL_NAME,
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(server.folder / "kernels")]))
    km.start_kernel(cwd=str(cwd), env={**server.env, **extra})
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    return km, kc


def run(kc, code, timeout=60):
    "The text the cell printed, and its reply's content."
    out = []
    reply = kc.execute_interactive(code, timeout=timeout, output_hook=lambda m: out.append(
        m["content"].get("text", "")) if m["msg_type"] == "stream" else None)
    return "".join(out), reply["content"]


def probe(kc):
    "What the kernel says of itself (`PROBE`)."
    text, content = run(kc, PROBE)
    assert content["status"] == "ok", content
    return json.loads(text)


def gone(pid, within=15.0) -> bool:
    "Whether the process `pid` has ended within `within` seconds."
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_forked_kernel_runs_as_a_plain_one_would(server, tmp_path):
    # the control: a kernel whose environment differs from the server's in a name not in MAY_DIFFER is plain
    km0, kc0 = start(server, tmp_path, CONTROL_SETTING="x")
    km, kc = start(server, tmp_path, COREINV_PRESET="set-after-the-server-started")
    km2, kc2 = start(server, tmp_path)
    try:
        plain, forked = probe(kc0), probe(kc)
        assert not plain["numpy"] and plain["other"] == "x"
        assert plain["pid"] == km0.provisioner.process.pid  # the launcher became the kernel
        assert forked["numpy"], "not forked from the server: numpy was not preloaded"
        assert forked["pid"] != km.provisioner.process.pid  # the launcher is not the kernel
        assert forked["preset"] == "set-after-the-server-started" and forked["other"] is None
        for key in ("cwd", "path0", "argv0", "threads"):     # as `python -m ipykernel_launcher` in that folder
            assert forked[key] == plain[key], key
        assert forked["cwd"] == str(tmp_path)
        # the global generators are seeded afresh in each kernel, as in fresh interpreters
        draw = "import numpy, torch; print(numpy.random.randint(2**62), torch.randint(2**62, ()).item())"
        draws = [run(c, draw)[0].split() for c in (kc, kc2)]
        assert probe(kc2)["numpy"] and all(a != b for a, b in zip(*draws)), draws
    finally:
        for c, m in ((kc0, km0), (kc, km), (kc2, km2)):
            c.stop_channels()
            m.shutdown_kernel(now=True)


def test_interrupt_shutdown_and_kill_reach_the_kernel(server, tmp_path):
    km, kc = start(server, tmp_path)
    pid = probe(kc)["pid"]
    msg_id = kc.execute("import time; time.sleep(60)")
    time.sleep(1.0)
    t = time.monotonic()
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg_id and reply["content"]["ename"] == "KeyboardInterrupt"
    assert time.monotonic() - t < 20
    assert probe(kc)["pid"] == pid                         # the kernel lives on after the interrupt
    kc.stop_channels()
    km.shutdown_kernel()                                    # asked to end, it ends with its launcher
    assert gone(pid) and not km.is_alive()

    km, kc = start(server, tmp_path)
    pid = probe(kc)["pid"]
    kc.stop_channels()
    km.shutdown_kernel(now=True)                            # SIGKILL to the launcher: its kernel ends too
    assert gone(pid)


def test_the_environment_rules():
    before, after = {"A": "1", "PATH": "/bin"}, {"A": "1", "PATH": "/bin", "SET_BY_IMPORT": "v"}
    assert tool.refusal({"A": "1", "PATH": "/bin"}, before, after) is None
    assert tool.refusal({"A": "1", "PATH": "/bin", "SET_BY_IMPORT": "v", "COREINV_X": "y", "MPLBACKEND": "agg"},
                        before, after) is None
    assert "A" in tool.refusal({"A": "2", "PATH": "/bin"}, before, after)
    assert "PATH" in tool.refusal({"A": "1"}, before, after)
    assert "SET_BY_IMPORT" in tool.refusal({"A": "1", "PATH": "/bin", "SET_BY_IMPORT": "w"}, before, after)
    # what the imports set is set in the kernel too, unless the kernel had its own value
    assert tool.kernel_environment({"A": "1", "PATH": "/bin"}, before, after)["SET_BY_IMPORT"] == "v"
    assert tool.kernel_environment({"A": "1", "PATH": "/bin", "COREINV_X": "y"}, before, after) == \
        {"A": "1", "PATH": "/bin", "COREINV_X": "y", "SET_BY_IMPORT": "v"}


def test_without_a_server_the_kernel_is_plain(tmp_path):
    s = tool.Server(["numpy"])
    env = dict(s.env)
    s.stop()                                               # its socket is gone
    tool.write_kernel_spec(tmp_path / "kernels")
    km = KernelManager(kernel_name=tool.KERNEL_NAME,
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")]))
    km.start_kernel(cwd=str(tmp_path), env=env)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    try:
        seen = probe(kc)
        assert not seen["numpy"] and seen["pid"] == km.provisioner.process.pid
        assert seen["argv0"].endswith("ipykernel_launcher.py")
    finally:
        kc.stop_channels(); km.shutdown_kernel(now=True)
