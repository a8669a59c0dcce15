"""tools/preloaded_kernel.py, the kernels nbval runs the notebooks in: forked from a server that has imported
the heavy packages, each runs as a fresh `python -m ipykernel_launcher` would, in its launcher's environment
and folder; jupyter_client's interrupt, shutdown and kill reach it; and where the environment differs from
the server's in a variable an import could have read, the kernel is started plain (the negative control of
each check that a kernel was forked: the same probe in a plain kernel). A kernel that fails to start ends
and says why; nbval's kernels, and the book's executor's, listen on Unix sockets, not TCP ports (_ext/coreinv_kernels.py)."""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

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
def server(tmp_path_factory):
    "A server that has imported packages ipykernel itself does not import; what it writes is in `server.said`."
    env = {k: v for k, v in os.environ.items() if k != "CONTROL_SETTING"}
    said = tmp_path_factory.mktemp("server") / "stderr.txt"
    with open(said, "w") as f:
        s = tool.Server(["numpy", "torch"], env=env, stderr=f)
    s.said = said
    yield s
    s.stop()


def unix_sockets() -> dict:
    "A KernelManager's settings for sockets of its own (no TCP port another pytest process could take)."
    return dict(transport="ipc", ip=f"{tempfile.gettempdir()}/coreinv-test-{uuid.uuid4().hex}")


def start(server, cwd, **extra):
    "A kernel started by jupyter_client, as nbval starts one, in the server's environment and `extra`."
    km = KernelManager(kernel_name=tool.KERNEL_NAME, **unix_sockets(),
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
    # stop_on_error=False: ipykernel sends the KeyboardInterrupt reply and only then stops aborting the queue,
    # so with the default a request sent as soon as that reply arrives can come back 'aborted' (CI saw it)
    msg_id = kc.execute("import time; time.sleep(60)", stop_on_error=False)
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
    km = KernelManager(kernel_name=tool.KERNEL_NAME, **unix_sockets(),
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


def test_a_kernel_that_cannot_start_ends_and_says_why(server, tmp_path):
    """A forked kernel told to listen on a TCP port that a zmq PUB socket holds (as when another pytest process's
    kernel took it) fails to bind: its launcher, what jupyter_client watches, ends, and the server's stderr says why.

    Its client (not started here) would be talking to the PUB socket: after its first send the next one blocks
    for good, and only a check that the kernel process has ended stops the wait. Whether a failed kernel ends
    before that check comes is a race, for plain kernels as for forked ones: with a client, on this loaded 2-core
    machine, the wait hung in 2 of 2 tries with the old forked kernel and in some tries with plain ones. So
    nbval's kernels use Unix sockets, which no other kernel can hold (the next test)."""
    import zmq
    from jupyter_client.connect import write_connection_file
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    try:
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        connection_file, _ = write_connection_file(str(tmp_path / "kernel.json"), shell_port=port)
        launcher = subprocess.Popen([sys.executable, str(tool.__file__), "-f", connection_file], cwd=tmp_path,
                                    env=server.env, start_new_session=True)
        try:
            assert launcher.wait(timeout=60) == 0
        finally:
            launcher.kill()
    finally:
        pub.close(linger=0)
        ctx.term()
    said = server.said.read_text()
    assert "preloaded_kernel: kernel" in said and "Address already in use" in said, said[-2000:]


def test_nbval_kernels_listen_on_unix_sockets(tmp_path):
    import nbval.kernel
    km, kc = nbval.kernel.start_new_kernel(kernel_name="python3", cwd=str(tmp_path))   # what nbval runs
    try:
        assert km.transport == "ipc" and type(km).__name__ == "UnixSocketKernelManager"
        assert len(list(Path(km.ip).parent.glob(Path(km.ip).name + "-*"))) == 5   # its five sockets
        text, content = run(kc, "import os; print(os.getcwd())")
        assert content["status"] == "ok" and text.strip() == str(tmp_path)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert not list(Path(km.ip).parent.glob(Path(km.ip).name + "-*"))               # removed with the kernel


TRANSPORT = "import json, ipykernel.connect as c; print(json.loads(c.get_connection_info())['transport'])"


def test_the_books_kernels_listen_on_unix_sockets(tmp_path):
    """The book's executor (`make book`: two kernels start side by side) starts its kernels on Unix sockets;
    the negative control, the same notebook under nbclient's own kernel manager, runs over TCP."""
    import nbformat
    from nbclient import NotebookClient
    sys.path.insert(0, str(REPO / "_ext"))
    from types import SimpleNamespace
    from coreinv_book import _execute
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(TRANSPORT)])
    control = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(TRANSPORT)])
    result = _execute(tmp_path / "page.ipynb", book,
                      SimpleNamespace(execution_timeout=120, execution_allow_errors=False))
    NotebookClient(control, timeout=120, kernel_name="python3").execute()
    assert result.err is None
    assert [nb.cells[0].outputs[0]["text"].strip() for nb in (book, control)] == ["ipc", "tcp"]
