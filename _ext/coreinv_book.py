"""Sphinx glue for the coreinv book (Jupyter Book 1 loads it as a local extension).

This module is the one home of the book's notebook rules. `tools/notebooks.py` and the tests import
its public functions; nothing else re-implements them.

1. nbdev directives. Notebook cells start with nbdev's `#| ...` lines. The book shows cells
   without them, and drops cells marked `#| hide` (and cells left empty, such as
   `#| default_exp`), so the notebooks need no Jupyter Book `remove-*` tags of their own.
   A cell that only calls `show_doc(...)` shows its output (the signature) alone.
2. GPU cells. A code cell tagged `gpu` (`coreinv.presets.GPU_TAG`) runs only when
   `coreinv.runtime.has_gpu()` is true. Otherwise the notebook reader gives it nbclient's own
   skip tag (`skip-execution`), so the executor passes over it, and any `gpu` cell without outputs
   gets a visible "needs a GPU" note. nbval's side of the same rule is in `conftest.py`.
3. Outputs as a reader sees them. Progress bars write `\\r` updates; the book shows what a terminal
   would show (the final state), not one line per update. Figures: the kernels that execute the
   book always draw with the inline backend, whatever `MPLBACKEND` the caller exported.
4. Re-execution when the code changes. Jupyter Book's cache keys a notebook on its own cells only.
   Here each cached notebook is also keyed on the code it runs (`execution_key`): a chapter
   (`nbs/chapters/X.ipynb`) on `coreinv.results.provenance(X)` (the modules it imports, its preset
   table, the installed packages), any other page on the whole package's `provenance()`, each with
   the device. The keys of the cached notebooks are kept beside the cache (`KEY_FILE`); a notebook
   whose key changed is dropped from the cache and re-executed, the others are read from it.
5. The scorecard. The `{scorecard}` directive renders `coreinv.results.scorecard_rows` at
   build time, after every chapter has been read (and so executed), so no measured number
   is typed into a page by hand. The `{reproduces}` directive (the landing page's "What reproduces"
   table) does the same for each chapter's verdict counts, with the figure its run saved beside its
   results (`write_results(figure=...)`) as a thumbnail. The `{regimes}` directive sets each claim's
   verdict beside its verdict under a second set of CPU float kernels (`coreinv.results.regime_rows`,
   from the records `tools/regimes.py` writes).
6. Notebooks executed side by side. myst-nb executes a notebook when Sphinx reads it, one after
   another. Before Sphinx reads, this extension executes the notebooks about to be read that the
   cache does not hold, `book_workers()` at a time (default: one per CPU core), each exactly as
   myst-nb would (jupyter-cache's `single_nb_execution`, in the notebook's folder, same kernel
   environment; each kernel on Unix sockets of its own, `coreinv_kernels.py`, since two kernels
   that start side by side over TCP can take each other's ports), and caches them; myst-nb then
   reads them from the cache. Results do not depend on it: every kernel runs on one thread
   (`OMP_NUM_THREADS=1` in `KERNEL_ENV`, set in `setup`; the chapters also pin PyTorch to one). A
   notebook that fails is not cached, so myst-nb executes it again when it reads it and reports the
   error as always.
"""
from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path, PurePosixPath

import nbformat
from docutils import nodes
from docutils.transforms import Transform
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from coreinv.presets import is_gpu_cell
from coreinv.runtime import has_gpu
from coreinv_kernels import AsyncUnixSocketKernelManager

LOGGER = logging.getLogger(__name__)
SKIP_TAG = "skip-execution"  # nbclient's default `skip_cells_with_tag`
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"
# What every kernel that executes a page inherits (the book's, and `tools/notebooks.py run`'s): figures drawn
# into the notebook, and one thread (PyTorch's and OpenBLAS's pools), as notebooks execute side by side, one
# per core, and a chapter's results must not depend on what runs beside it.
KERNEL_ENV = {"MPLBACKEND": INLINE_BACKEND, "OMP_NUM_THREADS": "1"}
KEY_FILE = "coreinv-code-keys.json"
_DIRECTIVE = re.compile(r"^\s*#\|")
_HIDE = re.compile(r"^\s*#\|\s*(hide|exporti|exec_doc)\s*$")  # cells nbdev keeps out of docs
_SHOW_DOC = re.compile(r"^\s*show_doc\(")  # a show_doc cell shows its output (the signature) only


# Shared notebook rules (also used by tools/notebooks.py) ------------------------------------
def mark_gpu_cells(nb: nbformat.NotebookNode, gpu: bool | None = None) -> nbformat.NotebookNode:
    "Give `gpu` cells nbclient's skip tag when there is no GPU (`gpu=None`: ask `has_gpu()`)."
    if gpu is None:
        gpu = has_gpu()
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if not gpu and is_gpu_cell(cell) and SKIP_TAG not in tags:
            cell.metadata["tags"] = [*tags, SKIP_TAG]
    return nb


def read_notebook(text: str) -> nbformat.NotebookNode:
    "The book's `.ipynb` reader: nbformat's, plus `mark_gpu_cells`."
    return mark_gpu_cells(nbformat.reads(text, as_version=nbformat.NO_CONVERT))


def squash_progress(text: str) -> str:
    """What a terminal shows of `text`: each line keeps what follows its last `\\r`; lines that a
    progress bar cleared (only blanks after a `\\r`) are dropped."""
    out = []
    for line in text.split("\n"):
        shown = line.rsplit("\r", 1)[-1]
        if "\r" in line and not shown.strip():
            continue
        out.append(shown)
    return "\n".join(out)


def coalesce_streams(outputs: list) -> list:
    "Join consecutive outputs of one stream, then `squash_progress` each stream's text."
    out = []
    for o in outputs:
        if (o.get("output_type") == "stream" and out and out[-1].get("output_type") == "stream"
                and out[-1]["name"] == o["name"]):
            out[-1]["text"] += o["text"]
        else:
            out.append(o)
    for o in out:
        if o.get("output_type") == "stream" and "\r" in o["text"]:
            o["text"] = squash_progress(o["text"])
    return out


# 1. nbdev directives -------------------------------------------------------------------
def _is_code_cell(node) -> bool:
    return isinstance(node, nodes.container) and node.get("nb_element") == "cell_code"


def _tidy_cell_sources(app, doctree) -> None:
    for cell in list(doctree.findall(_is_code_cell)):
        for block in list(cell.findall(nodes.literal_block)):
            if "cell_input" not in block.parent.get("classes", []):
                continue  # an output, not the cell's source
            lines = block.astext().splitlines()
            if not any(_DIRECTIVE.match(l) or _SHOW_DOC.match(l) for l in lines):
                continue
            if any(_HIDE.match(l) for l in lines):
                cell.parent.remove(cell)
                break
            kept = "\n".join(l for l in lines if not _DIRECTIVE.match(l)).strip("\n")
            if kept and not all(_SHOW_DOC.match(l) for l in kept.splitlines()):
                new = nodes.literal_block(kept, kept, **{k: v for k, v in block.attributes.items()
                                                        if k not in ("ids", "backrefs")})
                block.replace_self(new)
            else:
                source = block.parent
                source.parent.remove(source)
                if not any(isinstance(c, nodes.container) for c in cell.children):
                    cell.parent.remove(cell)
                    break


class _DropNestedTransitions(Transform):
    """nbdev's `show_doc` output starts with a `---` rule; docutils allows rules only between
    sections, so drop the ones that land inside a cell's output."""
    default_priority = 800  # before docutils' own transition check (830)

    def apply(self):
        for node in list(self.document.findall(nodes.transition)):
            if not isinstance(node.parent, (nodes.document, nodes.section)):
                node.parent.remove(node)


# 2. GPU cells ------------------------------------------------------------------------------
def _use_our_reader(app, config) -> None:
    formats = dict(config.nb_custom_formats or {})
    formats.setdefault(".ipynb", "coreinv_book.read_notebook")
    config.nb_custom_formats = formats


def _note_unexecuted_gpu_cells(app, doctree) -> None:
    for cell in doctree.findall(_is_code_cell):
        has_output = any("cell_output" in c.get("classes", []) for c in cell.children)
        if is_gpu_cell({"metadata": cell.get("cell_metadata", {})}) and not has_output:
            note = nodes.admonition(classes=["warning", "needs-gpu"])
            note += nodes.title("", "Needs a GPU")
            note += nodes.paragraph("", "This cell needs a GPU and was not run in this build. "
                                    "Run the chapter on a CUDA machine (COREINV_PRESET=paper) "
                                    "to see its output.")
            cell += note


# 3. Outputs as a reader sees them ----------------------------------------------------------
def _stream_kind(node) -> str | None:
    if isinstance(node, nodes.literal_block):
        classes = node.get("classes", [])
        if "output" in classes and ("stream" in classes or "stderr" in classes):
            return "stderr" if "stderr" in classes else "stdout"
    return None


def _squash_stream_outputs(app, doctree) -> None:
    """Join consecutive stream blocks of one cell output and show their terminal state
    (`nb_merge_streams` is off: myst-nb's merge puts each progress-bar update on its own line)."""
    for container in list(doctree.findall(nodes.container)):
        if "cell_output" not in container.get("classes", []):
            continue
        children = list(container.children)
        i = 0
        while i < len(children):
            kind = _stream_kind(children[i])
            if kind is None:
                i += 1
                continue
            j = i + 1
            while j < len(children) and _stream_kind(children[j]) == kind:
                j += 1
            text = squash_progress("".join(c.astext() for c in children[i:j])).rstrip("\n")
            first = children[i]
            for extra in children[i + 1:j]:
                container.remove(extra)
            if text.strip():
                new = nodes.literal_block(text, text, **{k: v for k, v in first.attributes.items()
                                                        if k not in ("ids", "backrefs")})
                first.replace_self(new)
            else:
                container.remove(first)
            children = list(container.children)
            i += 1 if text.strip() else 0


# 4. Re-execution when the code changes ----------------------------------------------------
def execution_key(path: str | Path | None = None) -> str:
    """The key a notebook's cached outputs are valid for: the provenance of the code it runs, and the device.

    A chapter notebook (`.../chapters/<name>.ipynb`, `name` one of `coreinv.results.CHAPTERS`) keys on its
    own code, `provenance(name)`; any other notebook (or `path=None`) on the whole package's."""
    from coreinv.results import CHAPTERS, provenance
    p = Path(path) if path is not None else None
    chapter = p.stem if p is not None and p.parent.name == "chapters" and p.stem in CHAPTERS else None
    return f"{provenance(chapter)['key']}-{'gpu' if has_gpu() else 'cpu'}"


def read_keys(cache: Path) -> dict[str, str] | None:
    "The keys recorded for the notebooks in `cache` ({uri: key}); None when none can be trusted (no file, old format)."
    try:
        keys = json.loads((Path(cache) / KEY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return keys if isinstance(keys, dict) else None


def write_keys(cache: Path) -> dict[str, str]:
    """Record the current `execution_key` of every notebook in the jupyter cache at `cache`.

    Called when a build ends: every notebook cached by then either kept its key (checked when the build
    began) or was executed by this build's code."""
    from jupyter_cache import get_cache
    keys = {r.uri: execution_key(r.uri) for r in get_cache(cache).list_cache_records()}
    (Path(cache) / KEY_FILE).write_text(json.dumps(keys, indent=1, sort_keys=True) + "\n")
    return keys


def _drop_stale_notebooks(app) -> None:
    "Drop from the cache each notebook whose code key changed; Sphinx re-reads it (`_outdated`)."
    config = app.env.mystnb_config
    app.env.coreinv_rerun = []
    if config.execution_mode != "cache":
        return
    from jupyter_cache import get_cache
    cache_path = Path(config.execution_cache_path)
    old = read_keys(cache_path) if cache_path.exists() else {}
    cache = get_cache(cache_path)
    dropped = []
    for record in cache.list_cache_records():
        if old is None or old.get(record.uri) != execution_key(record.uri):
            cache.remove_cache(record.pk)
            dropped.append(record.uri)
    if dropped:
        LOGGER.info(f"coreinv: {len(dropped)} cached notebook(s) ran other code: re-executed "
                    f"({', '.join(sorted(Path(u).stem for u in dropped))})")
    app.env.coreinv_rerun = [d for d in (app.env.path2doc(u) for u in dropped) if d]


def _record_keys(app, exception) -> None:
    config = app.env.mystnb_config
    if config.execution_mode == "cache" and Path(config.execution_cache_path).exists():
        write_keys(Path(config.execution_cache_path))


def _outdated(app, env, added, changed, removed):
    "Re-read pages with a scorecard always, and every notebook dropped from the cache."
    docs = [d for d in env.found_docs if "scorecard" in d]
    return docs + [d for d in getattr(env, "coreinv_rerun", []) if d in env.found_docs]


# 5. The scorecard --------------------------------------------------------------------------
class scorecard_placeholder(nodes.General, nodes.Element):
    pass


class ScorecardDirective(SphinxDirective):
    """`{scorecard}` with an optional preset argument (default: the preset the book is built at)."""
    optional_arguments = 1

    def run(self):
        from coreinv.presets import preset_name
        node = scorecard_placeholder()
        node["preset"] = self.arguments[0] if self.arguments else preset_name()
        return [node]


_COLUMNS = [("claim", 40), ("paper", 14), ("measured", 22), ("threshold", 16), ("status", 8)]


def _grid(columns, rows, classes=("scorecard",)) -> nodes.table:
    "A docutils table: `columns` [(name, width)], `rows` [(cells, classes)]; a cell is text or a list of nodes."
    table = nodes.table(classes=list(classes))
    group = nodes.tgroup(cols=len(columns))
    table += group
    for _, width in columns:
        group += nodes.colspec(colwidth=width)
    head, body = nodes.thead(), nodes.tbody()
    group += head
    group += body

    def row(cells, classes=()):
        r = nodes.row(classes=list(classes))
        for c in cells:
            r += nodes.entry("", *(c if isinstance(c, list) else [nodes.paragraph("", str(c))]))
        return r

    head += row([name for name, _ in columns])
    for cells, classes in rows:
        body += row(cells, classes)
    return table


def _table(rows) -> nodes.table:
    return _grid(_COLUMNS, [
        ([[nodes.paragraph("", "", nodes.literal("", rw["id"])), nodes.paragraph("", rw["claim"])],
          rw["paper"], rw["measured"], rw["threshold"],
          [nodes.paragraph("", rw["status"]), nodes.paragraph("", f"({rw['kind']})")]],
         [f"status-{rw['status'].replace(' ', '-')}"]) for rw in rows])


class regimes_placeholder(nodes.General, nodes.Element):
    pass


class RegimesDirective(SphinxDirective):
    """`{regimes}` with an optional preset argument: each claim's verdict here and under the other float
    kernels (`coreinv.results.regime_rows`), filled at build time."""
    optional_arguments = 1

    def run(self):
        from coreinv.presets import preset_name
        node = regimes_placeholder()
        node["preset"] = self.arguments[0] if self.arguments else preset_name()
        return [node]


def _fill_regimes(app, doctree, docname) -> None:
    from coreinv.results import regime_rows, results_for
    for node in list(doctree.findall(regimes_placeholder)):
        preset = node["preset"]
        rows = regime_rows(preset, results_for(preset))
        if not rows:
            node.replace_self(nodes.paragraph("", f"No chapter at the {preset!r} preset has been run under a "
                                              "second set of float kernels yet (tools/regimes.py)."))
            continue
        out = []
        for chapter in dict.fromkeys(r["chapter"] for r in rows):
            rs = [r for r in rows if r["chapter"] == chapter]
            here, other = rs[0]["capability_here"], rs[0]["capability_other"]
            changed = [r["id"] for r in rs if r["changed"]]
            words = (f": {len(rs) - len(changed)} of {len(rs)} claims keep their verdict under {other} kernels"
                     + (f"; changed: {', '.join(changed)}" if changed else "") + ".")
            if not all(r["current"] for r in rs):
                words += " This record was made by other code than the chapter's results: not current."
            out.append(nodes.paragraph("", "", nodes.strong("", chapter), nodes.Text(words)))
            out.append(_grid([("claim", 30), (f"here ({here})", 14), (other, 14), ("", 12)], [
                ([[nodes.paragraph("", "", nodes.literal("", r["id"]))], r["here"], r["other"],
                  "flipped" if r["flipped"] else "changed" if r["changed"] else ""],
                 [f"status-{r['other'].replace(' ', '-')}"] + (["regime-changed"] if r["changed"] else []))
                for r in rs], classes=("scorecard", "regimes")))
        node.replace_self(out)


class reproduces_placeholder(nodes.General, nodes.Element):
    pass


class ReproducesDirective(SphinxDirective):
    """`{reproduces}`: one line per chapter, `docname | title | the paper's result in words`; the table adds
    the verdict counts of the book's preset and the chapter's answer figure, at build time."""
    has_content = True

    def run(self):
        from coreinv.presets import preset_name
        node = reproduces_placeholder()
        node["preset"] = preset_name()
        node["rows"] = [[part.strip() for part in line.split("|", 2)] for line in self.content if line.strip()]
        for row in node["rows"]:
            if len(row) != 3:
                raise self.error(f"reproduces: a line is `docname | title | result`, got {' | '.join(row)!r}")
        return [node]


def _counts(s: dict) -> str:
    "A chapter's verdict counts in words: '6 of 10 hold, 2 undecided, 2 do not hold'."
    failed = s["total"] - s["held"] - s["untestable"] - s["undecided"]
    parts = [f"{s['held']} of {s['total']} hold"] + [f"{n} {w}" for n, w in (
        (s["undecided"], "undecided"), (failed, "does not hold" if failed == 1 else "do not hold"),
        (s["untestable"], "not testable")) if n]
    return ", ".join(parts) + (f" (required claim FAILED: {', '.join(s['failed_required'])})"
                               if s["failed_required"] else "")


def _fill_reproduces(app, doctree, docname) -> None:
    import base64
    from coreinv.results import chapter_summaries, results_for
    for node in list(doctree.findall(reproduces_placeholder)):
        preset = node["preset"]
        root = results_for(preset)
        summary = {s["chapter"]: s for s in chapter_summaries(preset, root)}
        table = nodes.table(classes=["reproduces"])
        group = nodes.tgroup(cols=3)
        table += group
        for width in (45, 25, 30):
            group += nodes.colspec(colwidth=width)
        head, body = nodes.thead(), nodes.tbody()
        group += head
        group += body
        hrow = nodes.row()
        for name in ("result", f"verdicts ({preset} preset)", "the answer figure"):
            hrow += nodes.entry("", nodes.paragraph("", name))
        head += hrow
        for target, title, words in node["rows"]:
            chapter = PurePosixPath(target).name
            href = app.builder.get_relative_uri(docname, target)
            link = nodes.reference("", "", nodes.strong("", title), refuri=href)
            s = summary.get(chapter)
            png = Path(root) / preset / f"{chapter}.png"
            img = (nodes.raw("", f'<a href="{href}"><img class="thumb" '
                                 f'alt="{title}: the answer figure" src="data:image/png;base64,'
                                 f'{base64.b64encode(png.read_bytes()).decode()}"></a>', format="html")
                   if png.is_file() else nodes.paragraph("", "(no figure saved)"))
            r = nodes.row()
            r += nodes.entry("", nodes.paragraph("", "", link), nodes.paragraph("", words))
            r += nodes.entry("", nodes.paragraph("", _counts(s) if s else f"not run at {preset!r}"))
            r += nodes.entry("", img)
            body += r
        node.replace_self(table)


def _machine_words(m: dict) -> str:
    "A results file's `machine` in words: `AMD EPYC (x86_64, AVX512)`, and the GPU where one computed."
    words = f"{m.get('cpu', 'an unknown CPU')} ({', '.join(v for v in (m.get('arch'), m.get('cpu_capability')) if v)})"
    return words + (f" with {m['gpu']}" if m.get("gpu") else "")


def _fill_scorecards(app, doctree, docname) -> None:
    from coreinv.results import chapter_summaries, results_for, scorecard_rows
    for node in list(doctree.findall(scorecard_placeholder)):
        preset = node["preset"]
        root = results_for(preset)
        rows = scorecard_rows(preset, root)
        if not rows:
            node.replace_self(nodes.paragraph("", f"No results at the {preset!r} preset yet: "
                                              f"no results/{preset}/*.json was written."))
            continue
        out = [nodes.paragraph("", "", nodes.Text("Preset "), nodes.literal("", preset), nodes.Text(".")),]
        for s in chapter_summaries(preset, root):
            out.append(nodes.paragraph(
                "", "", nodes.strong("", s["chapter"]),
                nodes.Text(f": {s['held']} of {s['total']} claims hold"
                           + "".join(f" ({s[k]} {w})" for k, w in (("untestable", "not testable"),
                                                                     ("undecided", "undecided")) if s.get(k))
                           + ". Code "),
                nodes.literal("", s["code_key"] or "not recorded"),
                nodes.Text(f", written {s['written'] or '(no date)'}, {s['wall_time_s']:.0f} s"
                           + (f", on {_machine_words(s['machine'])}." if s["machine"] else "."))))
            out.append(_table([r for r in rows if r["chapter"] == s["chapter"]]))
        node.replace_self(out)


# 6. Notebooks executed side by side ---------------------------------------------------------
WORKERS_ENV = "COREINV_BOOK_WORKERS"


def book_workers() -> int:
    "How many notebooks a book build executes at once: `$COREINV_BOOK_WORKERS`, else one per CPU core."
    return int(os.environ.get(WORKERS_ENV) or len(os.sched_getaffinity(0)))


def _execute(path: Path, nb: nbformat.NotebookNode, config):
    from jupyter_cache.executors.utils import single_nb_execution
    return single_nb_execution(nb, cwd=str(path.parent), timeout=config.execution_timeout,
                               allow_errors=config.execution_allow_errors, meta_override=True,
                               kernel_manager_class=AsyncUnixSocketKernelManager)  # side by side: no TCP ports


def _execute_side_by_side(app, env, docnames) -> None:
    config = env.mystnb_config
    workers = book_workers()
    if config.execution_mode != "cache" or config.execution_in_temp or workers < 2:
        return
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn
    cache = get_cache(config.execution_cache_path or ".jupyter_cache")
    todo = []
    for doc in docnames:
        path = Path(env.doc2path(doc))
        excluded = any(PurePosixPath(path.as_posix()).match(p) for p in config.execution_excludepatterns)
        if path.suffix != ".ipynb" or excluded:
            continue
        nb = read_notebook(path.read_text(encoding="utf-8"))
        try:
            cache.match_cache_notebook(nb)
        except KeyError:
            todo.append((path, nb))
    if len(todo) < 2:
        return  # nothing to gain: myst-nb executes it as it reads it
    todo.sort(key=lambda t: -t[0].stat().st_size)  # the largest (the chapters, with figures) take longest
    workers = min(workers, len(todo))
    LOGGER.info(f"coreinv: executing {len(todo)} notebooks, {workers} at a time")
    with ThreadPoolExecutor(workers) as pool:  # the work is in the kernels: threads only wait on them
        jobs = {pool.submit(_execute, path, nb, config): (path, nb) for path, nb in todo}
        for job in as_completed(jobs):
            path, nb = jobs[job]
            result = job.result()
            if result.err is None:
                cache.cache_notebook_bundle(CacheBundleIn(nb, str(path), data={"execution_seconds": result.time}),
                                            check_validity=False, overwrite=True)
                LOGGER.info(f"coreinv: executed {path.name} in {result.time:.0f} s")
            else:
                LOGGER.info(f"coreinv: {path.name} failed ({type(result.err).__name__}): "
                            "it is executed again, and its error reported, when it is read")


def setup(app):
    os.environ.update(KERNEL_ENV)  # kernels inherit this process's environment
    app.add_transform(_DropNestedTransitions)
    app.add_node(scorecard_placeholder)
    app.add_directive("scorecard", ScorecardDirective)
    app.add_node(reproduces_placeholder)
    app.add_node(regimes_placeholder)
    app.add_directive("regimes", RegimesDirective)
    app.add_directive("reproduces", ReproducesDirective)
    app.connect("config-inited", _use_our_reader)
    app.connect("builder-inited", _drop_stale_notebooks, priority=900)  # after myst-nb's
    app.connect("build-finished", _record_keys)
    app.connect("doctree-read", _tidy_cell_sources)
    app.connect("doctree-read", _note_unexecuted_gpu_cells)
    app.connect("doctree-read", _squash_stream_outputs)
    app.connect("doctree-resolved", _fill_scorecards)
    app.connect("doctree-resolved", _fill_reproduces)
    app.connect("doctree-resolved", _fill_regimes)
    app.connect("env-get-outdated", _outdated)
    app.connect("env-before-read-docs", _execute_side_by_side)
    return {"version": "0.2", "parallel_read_safe": True, "parallel_write_safe": True}
