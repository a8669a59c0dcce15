"""Kernels that listen on Unix sockets of their own: the one rule for every kernel this project starts.

nbval's kernels in the tests (`conftest.py`), the book build's executor (`coreinv_book.py`, two kernels
side by side) and `tools/notebooks.py run` all start their kernels through these managers.

Why not TCP: jupyter_client picks a kernel's five ports by binding port 0 and letting go, and the kernel
binds them a moment later. When kernels start side by side, another kernel can take one of those ports in
between. The kernel then fails to start, and its client, connected to a socket of another kind (a PUB,
say), blocks in a send for good if the kernel is slow to end: the run hangs instead of failing (see
tests/test_preloaded_kernel.py). A socket path named by a fresh UUID cannot be taken. (It also silences
ipykernel's "running over TCP without encryption" warning in the build log.)
"""
from __future__ import annotations

import atexit
import shutil
import tempfile
import uuid
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager, KernelManager

_FOLDER: Path | None = None


def socket_folder() -> Path:
    "This process's folder for kernel sockets: made on first use, removed when the process ends (short: ~100 bytes a path)."
    global _FOLDER
    if _FOLDER is None:
        _FOLDER = Path(tempfile.mkdtemp(prefix="coreinv-kernels-"))
        atexit.register(shutil.rmtree, _FOLDER, ignore_errors=True)
    return _FOLDER


class _OnUnixSockets:
    "Transport `ipc`; the sockets are the files `<ip>-1` ... `<ip>-5` in `socket_folder()`."

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.transport = "ipc"
        self.ip = str(socket_folder() / uuid.uuid4().hex)


class UnixSocketKernelManager(_OnUnixSockets, KernelManager):
    "A synchronous KernelManager on Unix sockets (nbval's: `nbval.kernel.start_new_kernel` builds one)."


class AsyncUnixSocketKernelManager(_OnUnixSockets, AsyncKernelManager):
    "nbclient's kind of KernelManager on Unix sockets (the book's executor and `tools/notebooks.py run`)."
