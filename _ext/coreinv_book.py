"""Sphinx glue for the coreinv book (Jupyter Book 1 loads it as a local extension).

Three jobs, each small:

1. nbdev directives. Notebook cells start with nbdev's `#| ...` lines. The book shows cells
   without them, and drops cells marked `#| hide` (and cells left empty, such as
   `#| default_exp`), so the notebooks need no Jupyter Book `remove-*` tags of their own.
   A cell that only calls `show_doc(...)` shows its output (the signature) alone.
2. GPU cells. A code cell tagged `gpu` runs only when `coreinv.presets.has_gpu()` is true.
   Otherwise the book's executor leaves it unexecuted, and any `gpu` cell without outputs
   gets a visible "needs a GPU" note. nbval's side of the same rule is in `conftest.py`.
3. The scorecard. The `{scorecard}` directive renders `coreinv.results.scorecard_rows` at
   build time, after every chapter has been read (and so executed), so no measured number
   is typed into a page by hand.
"""
from __future__ import annotations

import re

from docutils import nodes
from docutils.transforms import Transform
from sphinx.util.docutils import SphinxDirective

GPU_TAG = "gpu"
_DIRECTIVE = re.compile(r"^\s*#\|")
_HIDE = re.compile(r"^\s*#\|\s*(hide|exporti|exec_doc)\s*$")  # cells nbdev keeps out of docs
_SHOW_DOC = re.compile(r"^\s*show_doc\(")  # a show_doc cell shows its output (the signature) only


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
def _skip_gpu_cells_without_cuda() -> None:
    """Make nbclient (the book's executor, running in this process) pass over `gpu` cells."""
    from coreinv.presets import has_gpu
    if has_gpu():
        return
    from nbclient.client import NotebookClient
    if getattr(NotebookClient, "_coreinv_gpu_skip", False):
        return
    run_cell = NotebookClient.async_execute_cell

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        if GPU_TAG in cell.metadata.get("tags", []):
            return cell  # left as it is: unexecuted, no outputs
        return await run_cell(self, cell, cell_index, execution_count, store_history)

    NotebookClient.async_execute_cell = async_execute_cell
    NotebookClient._coreinv_gpu_skip = True


def _note_unexecuted_gpu_cells(app, doctree) -> None:
    for cell in doctree.findall(_is_code_cell):
        tags = cell.get("cell_metadata", {}).get("tags", [])
        has_output = any("cell_output" in c.get("classes", []) for c in cell.children)
        if GPU_TAG in tags and not has_output:
            note = nodes.admonition(classes=["warning", "needs-gpu"])
            note += nodes.title("", "Needs a GPU")
            note += nodes.paragraph("", "This cell needs a GPU and was not run in this build. "
                                    "Run the chapter on a CUDA machine (COREINV_PRESET=paper) "
                                    "to see its output.")
            cell += note


# 3. The scorecard --------------------------------------------------------------------------
class scorecard_placeholder(nodes.General, nodes.Element):
    pass


class ScorecardDirective(SphinxDirective):
    """`{scorecard}` with an optional preset argument (default `book`)."""
    optional_arguments = 1

    def run(self):
        node = scorecard_placeholder()
        node["preset"] = self.arguments[0] if self.arguments else "book"
        return [node]


_COLUMNS = [("claim", 40), ("paper", 14), ("measured", 22), ("threshold", 16), ("status", 8)]


def _table(rows) -> nodes.table:
    table = nodes.table(classes=["scorecard"])
    group = nodes.tgroup(cols=len(_COLUMNS))
    table += group
    for _, width in _COLUMNS:
        group += nodes.colspec(colwidth=width)
    head, body = nodes.thead(), nodes.tbody()
    group += head
    group += body

    def row(cells, classes=()):
        r = nodes.row(classes=list(classes))
        for c in cells:
            r += nodes.entry("", *(c if isinstance(c, list) else [nodes.paragraph("", str(c))]))
        return r

    head += row([name for name, _ in _COLUMNS])
    for rw in rows:
        claim = [nodes.paragraph("", "", nodes.literal("", rw["id"])), nodes.paragraph("", rw["claim"])]
        status = [nodes.paragraph("", rw["status"]), nodes.paragraph("", f"({rw['kind']})")]
        body += row([claim, rw["paper"], rw["measured"], rw["threshold"], status],
                    classes=[f"status-{rw['status'].replace(' ', '-')}"])
    return table


def _fill_scorecards(app, doctree, docname) -> None:
    from coreinv.results import scorecard_rows
    for node in list(doctree.findall(scorecard_placeholder)):
        rows = scorecard_rows(node["preset"])
        if not rows:
            node.replace_self(nodes.paragraph("", f"No results at preset {node['preset']!r} yet: "
                                              f"no results/{node['preset']}/*.json was written."))
            continue
        out = []
        for chapter in dict.fromkeys(r["chapter"] for r in rows):
            mine = [r for r in rows if r["chapter"] == chapter]
            ok = sum(r["status"] in ("pass", "holds") for r in mine)
            out.append(nodes.paragraph("", "", nodes.strong("", f"{chapter}"),
                                       nodes.Text(f": {ok} of {len(mine)} claims hold.")))
            out.append(_table(mine))
        node.replace_self(out)


def _scorecard_depends_on_results(app, env, added, changed, removed):
    """Re-render pages with a scorecard whenever the build runs (results change outside Sphinx)."""
    return [d for d in env.found_docs if "scorecard" in d]


def setup(app):
    _skip_gpu_cells_without_cuda()
    app.add_transform(_DropNestedTransitions)
    app.add_node(scorecard_placeholder)
    app.add_directive("scorecard", ScorecardDirective)
    app.connect("doctree-read", _tidy_cell_sources)
    app.connect("doctree-read", _note_unexecuted_gpu_cells)
    app.connect("doctree-resolved", _fill_scorecards)
    app.connect("env-get-outdated", _scorecard_depends_on_results)
    return {"version": "0.1", "parallel_read_safe": True, "parallel_write_safe": True}
