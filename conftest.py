"""pytest glue shared by tests/ and the nbval run over nbs/.

GPU cells: a notebook cell tagged `gpu` is skipped (and counted as skipped) unless
`coreinv.runtime.has_gpu()` is true. The book build applies the same rule in `_ext/coreinv_book.py`.

Chapters run once: nbval's cell-by-cell run of a chapter (`nbs/chapters/*.ipynb`) is the one execution
of that chapter in a test session. Its kernel writes the results under a folder of the session
(`$COREINV_RESULTS_DIR`) and draws figures inline, as the book's executor does; each cell's outputs
are recorded into a copy of the notebook. Tests that read a chapter's run (the fixtures named in
`READS_CHAPTERS`) are moved after every nbval item and get it from the `nbval_chapter` fixture: the
claim checks of tests/test_chapter_results.py, and the executed book of tests/test_book_build.py,
whose first build takes the Markov chapter from this run. When a session did not collect a chapter's
cells (e.g. `pytest tests/test_chapter_results.py`), `nbval_chapter` gives None and those tests
execute the chapter themselves; a session that collected some chapters checks only those chapters'
claims (`make test` runs its chapters in two such sessions side by side, `tools/side_by_side.py`).

Kernels: nbval's kernels are forked from a server that has imported PyTorch and TransformerLens
once per pytest process (`tools/preloaded_kernel.py`: 5-8 s less per notebook that uses them). A
kernel whose environment differs from the server's where an import could have read it is started plain;
`COREINV_PRELOADED_KERNELS=0` starts every kernel plain. The book's builds start plain kernels. Either
way a kernel listens on Unix sockets of its own, not on TCP ports (`_ext/coreinv_kernels.py`, as in the
book's builds).
"""
import copy
import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

from coreinv.presets import is_gpu_cell

sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))
from coreinv_kernels import UnixSocketKernelManager  # noqa: E402  every kernel on Unix sockets of its own

CHAPTERS = Path(__file__).resolve().parent / "nbs" / "chapters"
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"  # as _ext/coreinv_book.py
READS_CHAPTERS = {"chapter_run", "built_book", "regime_runs"}  # fixtures whose tests run after the chapters' nbval run
KERNEL_TOOL = Path(__file__).resolve().parent / "tools" / "preloaded_kernel.py"


def gpu_skip_marker(item, gpu_available: bool):
    "The skip marker for an nbval cell tagged `gpu` when no GPU is available, else None."
    cell = getattr(item, "cell", None)
    if cell is None or gpu_available:
        return None
    if is_gpu_cell(cell):
        return pytest.mark.skip(reason="needs a GPU (cell tagged 'gpu')")
    return None


def chapter_of(item) -> str | None:
    "The chapter whose cell an nbval item runs (`markov` for nbs/chapters/markov.ipynb), else None."
    if getattr(item, "cell", None) is None:
        return None
    path = Path(str(item.parent.fspath)).resolve()
    return path.stem if path.parent == CHAPTERS else None


class ChapterRun:
    "What nbval's run of one chapter left: the notebook with the outputs of this run, and its cells' fate."

    def __init__(self, nb, results: Path):
        self.notebook = copy.deepcopy(nb)
        for cell in self.notebook.cells:  # a skipped cell shows nothing, as in the book without a GPU
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        self.results = results  # the $COREINV_RESULTS_DIR of its kernel
        self.count = 0
        self.reported, self.failed = set(), []


def pytest_configure(config):
    config.coreinv_chapter_runs = {}
    config.coreinv_kernel_server = None
    import nbval.kernel
    nbval.kernel.KernelManager = UnixSocketKernelManager   # what nbval.kernel.start_new_kernel builds


def start_kernel_server(config) -> None:
    """Start this process's kernel server (`tools/preloaded_kernel.py`) and point nbval at its kernel spec.

    The server imports `coreinv.runtime.PRELOAD`; it ends with this pytest process."""
    from coreinv.runtime import PRELOAD
    spec = importlib.util.spec_from_file_location("preloaded_kernel", KERNEL_TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    server = tool.Server(list(PRELOAD))
    os.environ.update({k: server.env[k] for k in (tool.SERVER_ENV, "JUPYTER_PATH")})
    config.add_cleanup(server.stop)
    config.option.nbval_current_env = False
    config.option.nbval_kernel_name = tool.KERNEL_NAME
    config.coreinv_kernel_server = server


FILE_SECONDS: dict[str, float] = {}  # test file (nbval: notebook) → seconds of its setup, call and teardown


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    FILE_SECONDS[path] = FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, config):
    "Seconds per test file (nbval: per notebook), longest first, and their sum: where a run's time goes."
    totals = FILE_SECONDS
    if not totals: return
    tr = terminalreporter
    tr.section("seconds per file")
    for path, sec in sorted(totals.items(), key=lambda t: -t[1]):
        tr.write_line(f"{sec:8.1f}  {path}")
    tr.write_line(f"{sum(totals.values()):8.1f}  in all ({len(totals)} files)")


@pytest.hookimpl(trylast=True)  # after -k/-m deselection and pytest's own fixture ordering
def pytest_collection_modifyitems(config, items):
    if any(hasattr(i, "cell") for i in items):
        from coreinv.runtime import has_gpu
        gpu = has_gpu()
        for item in items:
            marker = gpu_skip_marker(item, gpu)
            if marker is not None:
                item.add_marker(marker)
    # A session that runs some chapters' cells checks those chapters' claims (`chapter_run[<chapter>]`), not
    # the others': `make test` runs its chapters in two sessions side by side, each with its claim checks.
    # A session that runs no chapter (e.g. `pytest tests/test_chapter_results.py`) executes each chapter it checks.
    ran = {chapter_of(i) for i in items} - {None}
    if ran:
        other = [i for i in items if getattr(getattr(i, "callspec", None), "params", {}).get("chapter_run", None)
                 not in (None, *ran)]
        if other:
            config.hook.pytest_deselected(items=other)
            items[:] = [i for i in items if i not in other]
    # Readers of the chapters' run go last (stable: their own order, and fixture grouping, stay).
    reads = [i for i in items if READS_CHAPTERS & set(getattr(i, "fixturenames", ()))]
    if reads:
        items[:] = [i for i in items if i not in reads] + reads


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """Before a notebook's first cell: the kernel server (once per process). Start a chapter's kernel (nbval
    does, at its first cell) with the session's results folder and inline figures."""
    if hasattr(item, "cell") and item.config.coreinv_kernel_server is None and \
            os.environ.get("COREINV_PRELOADED_KERNELS", "1") != "0":
        start_kernel_server(item.config)
    chapter = chapter_of(item)
    if chapter is None:
        yield
        return
    runs = item.config.coreinv_chapter_runs
    if chapter not in runs:
        results = item.config._tmp_path_factory.mktemp(f"results-{chapter}")
        runs[chapter] = ChapterRun(item.parent.nb, results)
    saved = {k: os.environ.get(k) for k in ("COREINV_RESULTS_DIR", "MPLBACKEND")}
    os.environ.update(COREINV_RESULTS_DIR=str(runs[chapter].results), MPLBACKEND=INLINE_BACKEND)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    "Record each chapter cell's outputs, and whether it failed. Under TransformerLens 4, skip what needs 3.9."
    outcome = yield
    _skip_what_needs_hooked(item, call, outcome.get_result())
    chapter = chapter_of(item)
    if chapter is None or chapter not in item.config.coreinv_chapter_runs:
        return
    run, report = item.config.coreinv_chapter_runs[chapter], outcome.get_result()
    if report.failed:
        run.failed.append(item.name)
    if call.when == "call" and report.passed:
        cell = run.notebook.cells[next(k for k, c in enumerate(item.parent.nb.cells) if c is item.cell)]
        run.count += 1
        cell.outputs, cell.execution_count = list(item.test_outputs or []), run.count
    if call.when == "teardown":
        run.reported.add(item.nodeid)


@pytest.fixture(scope="session")
def nbval_chapter(request):
    """`get(chapter)`: this session's nbval run of the chapter as a `ChapterRun` (fails the test if
    a cell failed), or None if the session did not collect the chapter's cells."""
    def get(chapter):
        items = [i for i in request.session.items if chapter_of(i) == chapter]
        if not items:
            return None
        run = request.config.coreinv_chapter_runs.get(chapter)
        missing = [i.nodeid for i in items if run is None or i.nodeid not in run.reported]
        if missing:
            pytest.fail(f"nbval has not run the {chapter} chapter's cells {missing[:3]}... yet")
        if run.failed:
            pytest.fail(f"the {chapter} chapter failed in nbval at {', '.join(run.failed)}: see those items")
        return run
    return get


# TransformerLens 4.0 removed `HookedTransformer`. Under 4.x (the library's second environment, `make test`'s
# .venv-tl4) a test that builds one, or reaches code documented to need one (`make_transformer`,
# `load_local(route='hooked')`), stops with the ImportError that names the removal; it is reported as skipped,
# with that message as its reason. Under 3.9 nothing changes. The report header names the version.
def _transformer_lens() -> tuple[str, bool]:
    from coreinv.train import HookedTransformer, _Removed, _transformer_lens_version
    return _transformer_lens_version(), not isinstance(HookedTransformer, _Removed)


def pytest_report_header(config):
    v, hooked = _transformer_lens()
    return f"transformer-lens {v} (HookedTransformer {'available' if hooked else 'removed: tests that need it are skipped'})"


_REMOVED = re.compile(r"removed in TransformerLens 4\.0|TransformerLens 4\.0 removed")   # its message, or coreinv's


def _needs_hooked(error: str) -> bool:
    return bool(_REMOVED.search(error)) and not _transformer_lens()[1]


def _skip_what_needs_hooked(item, call, report) -> None:
    "Report a test stopped by the ImportError that names HookedTransformer's removal as skipped, with that reason."
    if call.excinfo is None or not report.failed or not call.excinfo.errisinstance(ImportError):
        return
    if _needs_hooked(str(call.excinfo.value)):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {str(call.excinfo.value)[:160]}")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    "The same for a test module that imports HookedTransformer at its top."
    outcome = yield
    report = outcome.get_result()
    if report.failed and "ImportError" in str(report.longrepr) and _needs_hooked(str(report.longrepr)):
        report.outcome = "skipped"
        report.longrepr = (str(collector.path), 0, "Skipped: the module imports HookedTransformer, which "
                                                   "TransformerLens 4.0 removed")
