"""Jupyter kernels forked from a server that has imported the heavy packages once (the test suite's kernels).

nbval starts one kernel per notebook, and most kernels spent a good part of their life importing PyTorch
and TransformerLens (which pulls in transformers, datasets, pandas): 5-8 s of a notebook's 8-12 s on this
2-core machine, in 42 notebooks in `make test-fast`. Here a server imports those installed packages once
and forks a kernel for each request, so a kernel starts with them in `sys.modules`, as the map_processes
workers do (`coreinv.runtime.worker_context`). Never a module of coreinv's or the user's: a
kernel imports those from disk, so it reads the code as it is when the notebook runs.

    server = Server(modules)          # conftest.py starts one per pytest process; its kernel spec is KERNEL_NAME
    ...                               # kernels started with server.env use it
    server.stop()

`Server` runs `python tools/preloaded_kernel.py serve SOCKET MODULE...`; its kernel spec runs
`python tools/preloaded_kernel.py -f CONNECTION_FILE`.

The second is what jupyter_client starts as "the kernel": a small launcher (standard library only) that sends
the server its environment, working directory, arguments and standard streams, and stays alive as long as the
forked kernel does, passing it the signals jupyter_client sends (interrupt, terminate). When the launcher dies
(jupyter_client kills it), its kernel exits. When ipykernel ends, or fails to start, the forked kernel exits
at once (a failure is told on the server's standard error), and its launcher with it. A forked kernel starts
as `python -m ipykernel_launcher` would, in the launcher's environment and folder, with NumPy's and PyTorch's
global generators seeded from the OS (as a fresh interpreter's are), and the variables the imports set
(PyTorch's `TORCHINDUCTOR_CACHE_DIR`). The server refuses, and the launcher starts a plain kernel instead,
when the environment differs from the server's in a variable the preloaded packages may have read when they
were imported: only the names in `MAY_DIFFER` (read later, by coreinv, matplotlib, pytest and Jupyter) may
differ. So does a launcher that finds no server (`$COREINV_KERNEL_SERVER` unset or not listening).
"""
from __future__ import annotations

import json
import os
import runpy
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERVER_ENV = "COREINV_KERNEL_SERVER"  # the server's socket, for the launchers
KERNEL_NAME = "coreinv-preloaded"     # the kernel spec's name
MAY_DIFFER = ("COREINV_", "MPLBACKEND", "JPY_", "JUPYTER_", "IPY_", "PYTEST_", "PYDEVD_")  # name prefixes
_HEADER = struct.Struct("!q")


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"the peer closed the connection after {len(data)} of {n} bytes")
        data += chunk
    return data


def refusal(env: dict[str, str], before: dict[str, str], after: dict[str, str]) -> str | None:
    """Why a kernel in environment `env` may not be forked from a server whose imports ran in `before` (and
    left `after`: TransformerLens sets `TORCHINDUCTOR_CACHE_DIR`, for one), else None."""
    names = sorted(k for k in set(env) | set(before) | set(after)
                   if env.get(k) not in (before.get(k), after.get(k)) and not k.startswith(MAY_DIFFER))
    return f"the environment differs from the server's in {', '.join(names)}" if names else None


def kernel_environment(env: dict[str, str], before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    "`env` as the server's imports would have left it (they ran in `before` and left `after`)."
    env = dict(env)
    for k in set(before) | set(after):
        if before.get(k) != after.get(k) and env.get(k) == before.get(k):
            if k in after:
                env[k] = after[k]
            else:
                env.pop(k, None)
    return env


def write_kernel_spec(kernels: Path) -> Path:
    "Write the kernel spec `KERNEL_NAME` (this file's launcher) into the folder `kernels`; its kernel.json."
    path = Path(kernels) / KERNEL_NAME / "kernel.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "argv": [sys.executable, str(Path(__file__).resolve()), "-f", "{connection_file}"],
        "display_name": "Python 3 (forked from a preloaded server)", "language": "python",
        "interrupt_mode": "signal"}))
    return path


# ---------------------------------------------------------------------------------------------- the server
class Server:
    """A kernel server that has imported `modules`, and its kernel spec (`KERNEL_NAME`), in a folder of its own.

    Parameters
    ----------
    modules : list of str
        Installed packages to import once (`coreinv.runtime.PRELOAD`).
    env : dict, optional
        The environment it starts in (default: `os.environ`).
    stderr : file, optional
        Where the server, and a forked kernel that fails, write (default: this process's standard error).

    Attributes
    ----------
    env : dict
        `env` with `$COREINV_KERNEL_SERVER` and `$JUPYTER_PATH` pointing at the server and its kernel spec: a
        kernel started in it, by the name `KERNEL_NAME`, is forked from this server. The server starts in it.
    process : subprocess.Popen
        The server; it listens when the constructor returns, and imports `modules` before its first fork.
    """

    def __init__(self, modules: list[str], env: dict[str, str] | None = None, stderr=None):
        self.folder = Path(tempfile.mkdtemp(prefix="coreinv-kernels-"))  # short: a socket's path has ~100 bytes
        write_kernel_spec(self.folder / "kernels")
        socket_path = self.folder / "server.sock"
        self.env = dict(os.environ if env is None else env)
        self.env[SERVER_ENV] = str(socket_path)
        self.env["JUPYTER_PATH"] = os.pathsep.join([str(self.folder), *filter(None, [self.env.get("JUPYTER_PATH")])])
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "serve", str(socket_path),
                                         *modules], stdin=subprocess.PIPE, start_new_session=True,
                                        env=self.env, stderr=stderr)    # not the C environment, which readline may have changed
        deadline = time.monotonic() + 30
        while not socket_path.exists():                   # it listens before it imports
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the kernel server did not start (exit status {self.process.returncode})")
            time.sleep(0.01)

    def stop(self) -> None:
        "End the server (its stdin closes) and remove its folder; kernels it forked end with their launchers."
        if self.process.stdin and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def serve(path: str, modules: list[str]) -> tuple[socket.socket, dict, list[int]] | None:
    """Import `modules`, then fork a kernel for each request on the socket `path` until stdin closes.

    Returns None in the server when it is done; in a forked child, the request it is to run as a kernel."""
    import importlib
    import select
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)                                     # launchers may connect while the imports run
    before = dict(os.environ)
    for name in modules:
        importlib.import_module(name)
    after = dict(os.environ)
    sys.stdout.flush(); sys.stderr.flush()
    while True:
        ready, _, _ = select.select([listener, sys.stdin], [], [], 0.5)   # reaps ended kernels twice a second
        _reap()
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 4096):
            listener.close()                                # whoever started the server has ended
            return None
        if listener not in ready:
            continue
        conn, _ = listener.accept()
        try:
            (size,), fds = _recv_header(conn)
            request = json.loads(_recv_exactly(conn, size))
        except (ConnectionError, ValueError, OSError) as e:
            print(f"preloaded_kernel: a bad request ({e}); ignored", file=sys.stderr)
            conn.close()
            continue
        why = refusal(request["env"], before, after)
        if why is not None:
            conn.sendall(_HEADER.pack(0) + why.encode())
            conn.close()
            for fd in fds: os.close(fd)
            continue
        if os.fork() == 0:
            listener.close()
            request["env"] = kernel_environment(request["env"], before, after)
            return conn, request, fds                       # the child leaves the loop to become the kernel
        conn.close()
        for fd in fds: os.close(fd)


def _recv_header(conn: socket.socket) -> tuple[tuple[int], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
    return _HEADER.unpack(data + _recv_exactly(conn, _HEADER.size - len(data))), fds


def _reap() -> None:
    "Collect the kernels that have exited."
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def become_kernel(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In a forked child: take the launcher's streams, environment and folder, and run `python -m ipykernel_launcher`.

    It never returns: when ipykernel ends, the child exits (`_exit`), and where ipykernel failed, it says why on
    the server's standard error (a launcher's is nbval's /dev/null)."""
    import threading
    import traceback
    server_stderr = os.dup(2)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]                          # as `python -m` sets it
    if "numpy.random" in sys.modules:                     # a fresh interpreter seeds the global generators
        sys.modules["numpy"].random.seed()                # from the OS (Python's `random` reseeds itself)
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    conn.sendall(_HEADER.pack(os.getpid()))

    def exit_with_launcher():                             # jupyter_client kills the launcher to kill the kernel
        while conn.recv(1):
            pass
        os._exit(1)
    threading.Thread(target=exit_with_launcher, daemon=True).start()
    sys.argv = ["ipykernel_launcher", *request["argv"]]
    code = 1
    try:
        runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:
        os.write(server_stderr, f"preloaded_kernel: kernel {os.getpid()} ({' '.join(request['argv'])}) failed:\n"
                                f"{traceback.format_exc()}".encode())
    _exit(code, grace=5.0 if code == 0 else 0.0)


def _exit(code: int, grace: float) -> None:
    """Exit now, with `code`, after the exit handlers (ipykernel's) have had `grace` seconds.

    A kernel that failed ends at once, without them: its client checks once a second that the process lives,
    and meanwhile sends again, and a send to a socket of the wrong kind (the kernel's port held by another
    kernel's PUB socket) blocks for good. Ending as Python does (exit handlers, then teardown) took over a
    second here after a failed start, and once never finished (stuck in zmq's `Context.term`)."""
    import atexit
    import threading
    if grace > 0:
        closing = threading.Thread(target=atexit._run_exitfuncs, daemon=True)
        closing.start()
        closing.join(grace)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


# ---------------------------------------------------------------------------------------------- the launcher
def launch(argv: list[str]) -> int:
    "Ask the server for a kernel with these arguments and wait for it to end; a plain kernel if it cannot."
    plain = [sys.executable, "-m", "ipykernel_launcher", *argv]
    path = os.environ.get(SERVER_ENV)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not path:
            raise OSError(f"${SERVER_ENV} is not set")
        conn.connect(path)
        body = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
        socket.send_fds(conn, [_HEADER.pack(len(body))], [0, 1, 2])
        conn.sendall(body)
        (pid,) = _HEADER.unpack(_recv_exactly(conn, _HEADER.size))
        if pid == 0:
            raise OSError(conn.recv(65536).decode())
    except OSError as e:
        print(f"preloaded_kernel: a plain kernel, not a forked one: {e}", file=sys.stderr)
        conn.close()
        os.execv(sys.executable, plain)
    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:                        # the kernel has just ended
            pass
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, forward)
    while conn.recv(1):                                   # the kernel's end closes the connection
        pass
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        forked = serve(sys.argv[2], sys.argv[3:])
        if forked is not None:
            become_kernel(*forked)
    else:
        sys.exit(launch(sys.argv[1:]))
