# coreinv: two commands do everything on a fresh machine.
#   make book   install, export the library, run every chapter at the `book` preset, build _build/html
#   make test   install, then the checks: export in sync, notebook hygiene, unit tests and nbval
#               over the library notebooks (test-fast, one process per core and one more), then nbval over the
#               chapters at the `ci` preset (each executed once; its claims rechecked from that
#               run), the committed book rendered, the book built executed (two sessions side by side), then test-tl4
#   make test-fast  the same without chapters, book builds or the browser, one process per core and one more (for authors; CI runs `make test`)
#   make test-tl4   the library's tests on users' models under TransformerLens 4.x, in .venv-tl4/ (`make test` runs it too)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PATH := $(CURDIR)/$(BIN):$(PATH)
export MPLBACKEND := Agg
export PYTHONHASHSEED := 0
# One thread per process (PyTorch's and OpenBLAS's pools): processes run side by side, one per core, and two
# threads each on a loaded 2-core machine spin against each other (a library page: 114 s with two, 15 s with one).
export OMP_NUM_THREADS := 1

.PHONY: install export book publish test test-fast test-tl4 nbs clean help
help:
	@grep -E '^#  ' Makefile

$(STAMP): requirements.txt requirements-nodeps.txt setup.py settings.ini
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt 2>&1 | { grep -v 'is ignored: it is neither' || true; }
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . 2>&1 | { grep -v 'is ignored: it is neither' || true; }
	touch $(STAMP)

install: $(STAMP)

# The library's second environment: TransformerLens 4.x (no HookedTransformer) without sae-lens, for the tests of
# what a user applies to a model of their own (issue 43). The book's environment above stays on 3.9.
VENV_TL4 := .venv-tl4
STAMP_TL4 := $(VENV_TL4)/.installed
TL4_TESTS := tests/test_readme.py tests/test_models.py tests/test_user_model.py tests/test_ace.py tests/test_ace_fit_hook.py \
	tests/test_ace_ablate.py tests/test_ace_compare.py tests/test_ace_identify.py tests/test_koopman.py \
	tests/test_koopman_calibration.py tests/test_koopman_streaming.py tests/test_koopman_dictionaries.py \
	tests/test_invariance.py tests/test_heldout.py tests/test_sae.py tests/test_api.py tests/test_das.py tests/test_padding.py
$(STAMP_TL4): requirements-tl4.txt requirements-nodeps.txt setup.py settings.ini
	test -x $(VENV_TL4)/bin/python || $(PYTHON) -m venv $(VENV_TL4)
	$(VENV_TL4)/bin/python -m pip install -q --disable-pip-version-check -r requirements-tl4.txt 2>&1 | { grep -v 'is ignored: it is neither' || true; }
	$(VENV_TL4)/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	$(VENV_TL4)/bin/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e . 2>&1 | { grep -v 'is ignored: it is neither' || true; }
	touch $(STAMP_TL4)

# The TL4_TESTS under TransformerLens 4.x; the report's header names the version.
test-tl4: $(STAMP_TL4)
	COREINV_PRESET=ci $(VENV_TL4)/bin/python -m pytest -rs -p no:cacheprovider $(TL4_TESTS)

export: install
	$(BIN)/nbdev_export

# The main job. Results go to _build/results so a build never touches tracked files;
# `make publish` copies them, and the executed notebooks' outputs, into the repo.
# Notebooks the cache lacks execute side by side, one per core (COREINV_BOOK_WORKERS=N to change).
# It ends with each chapter's claims (n of m hold) and the path of the index page.
book: export
	$(BIN)/python tools/notebooks.py build --preset book --results $(CURDIR)/_build/results

# Then every chapter again under the other float kernels (tools/regimes.py: default, or avx2 where this machine's are
# default), with a model cache of its own, for the scorecard's table of verdicts under both; publish copies it.
publish: book
	$(BIN)/python tools/regimes.py other --out _build/results/book/regimes
	$(BIN)/python tools/notebooks.py publish --cache _build/.jupyter_cache --results _build/results/book

# What test-fast leaves out: the chapters (nbval and their claim checks), every book build (test_gpu_cells builds
# two, and runs nbval in two more pytest processes) and the browser. What it keeps runs in TEST_WORKERS processes
# (pytest-xdist), a file (a notebook) each: by default one more than the cores, since each waits part of the time
# on its kernels and subprocesses (on 2 cores, one run each: 3 workers 298 s, 2 workers 312 s).
SLOW_TESTS := nbs/chapters tests/test_chapter_results.py tests/test_book.py tests/test_book_build.py tests/test_browser.py \
	tests/test_gpu_cells.py tests/test_pretrained.py tests/test_kernel_regimes.py
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test-fast: install
	COREINV_PRESET=ci $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(addprefix --ignore=,$(SLOW_TESTS))

# test-fast, then the chapters: each chapter's nbval run, then the tests that read it (its claims, the
# executed book), and the rendered book in the browser. With two or more TEST_WORKERS they run as two pytest
# sessions side by side (tools/side_by_side.py), balanced by their measured seconds (in a fresh clone:
# grokking 375 + agreement 77; markov 51 + sae_gap 122 + the book builds and browser 222 + the gpu tag 24); each checks its own
# chapters' claims. test_pretrained (both packaged LMs against transformers' own GGUF load) joins the first, and so does
# test-tl4 (install ~160 s, tests ~110 s): measured 2026-12-03 in a fresh clone, the first session 363 s without it, the
# second 489 s.
CHAPTERS_A := nbs/chapters/grokking.ipynb nbs/chapters/agreement.ipynb tests/test_chapter_results.py tests/test_pretrained.py \
	tests/test_kernel_regimes.py
CHAPTERS_B := nbs/chapters/markov.ipynb nbs/chapters/sae_gap.ipynb tests/test_chapter_results.py \
	tests/test_book.py tests/test_book_build.py tests/test_browser.py tests/test_gpu_cells.py
test: test-fast
ifeq ($(TEST_WORKERS),1)
	COREINV_PRESET=ci $(BIN)/python -m pytest $(SLOW_TESTS)
	$(MAKE) --no-print-directory test-tl4
else
	COREINV_PRESET=ci $(BIN)/python tools/side_by_side.py \
		"grokking+agreement+tl4=$(BIN)/python -m pytest -v $(CHAPTERS_A); s=\$$?; $(MAKE) --no-print-directory test-tl4 && exit \$$s" \
		"markov+sae_gap+book=$(BIN)/python -m pytest -v $(CHAPTERS_B)"
endif

# Re-run one notebook in place at the book preset and tidy it (for authors): make nbs NB=nbs/00_presets.ipynb
nbs: export
	COREINV_PRESET=$${COREINV_PRESET:-book} $(BIN)/python tools/notebooks.py run $(NB)

clean:
	rm -rf _build
