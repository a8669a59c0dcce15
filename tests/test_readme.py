"The README's 'Use coreinv on your model' section runs as written, on the packaged SmolLM2-135M, and says what it found."
import os
import re
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

from coreinv import prompt_lengths

README = Path(__file__).resolve().parents[1] / "README.md"
HEADING = "## Use coreinv on your model"


def _section_code() -> str:
    text = README.read_text()
    assert HEADING in text, f"README.md has no {HEADING!r} section"
    body = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", body, flags=re.S)
    assert blocks, "the section has no python code block"
    return "\n".join(blocks)


def test_readme_your_model_section_runs(tmp_path, monkeypatch):
    code = _section_code()
    assert 'pretrained("smollm2-135m")' in code and 'load_local("path/to/my-model")' in code
    monkeypatch.chdir(tmp_path)
    ns = {"__name__": "__readme__"}
    exec(compile(code, str(README), "exec"), ns)
    dims, control, edmd, ace, tokens = ns["dims"], ns["control"], ns["edmd"], ns["ace"], ns["tokens"]
    model = ns["model"]
    lengths = prompt_lengths(model, tokens)
    assert tokens.shape[0] == 32 and len(set(lengths.tolist())) > 1          # prompts of different lengths, padded
    assert ace.rank_ >= 12 and dims.ks == [1, 2, 4, 8, 12] and dims.reliable
    assert all(0 <= s <= 1.01 for s in dims.sufficiency)
    assert dims.sufficiency[-1] > 3 * control.sufficiency[-1]                # ACE beats a random subspace
    assert dims.intact > dims.chance + 4 * dims.noise                       # the gap is measured
    assert np.isfinite(edmd.eigvals_).all() and len(edmd.eigvals_) == 9      # 8 PCA features + the constant
    assert all(np.isfinite(h.eigvals_).all() for h in ns["halves"])


def test_make_test_runs_every_chapter_and_slow_test_once():
    """`make test`'s two chapter sessions (CHAPTERS_A, CHAPTERS_B) together run every chapter in nbs/chapters
    once and every slow test file that test-fast leaves out; a new chapter must be given to one of them."""
    text = (README.parent / "Makefile").read_text().replace("\\\n", " ")
    var = lambda name: re.search(rf"^{name} := (.*)$", text, flags=re.M).group(1).split()
    a, b, slow = var("CHAPTERS_A"), var("CHAPTERS_B"), var("SLOW_TESTS")
    chapters = sorted(f"nbs/chapters/{p.name}" for p in (README.parent / "nbs" / "chapters").glob("*.ipynb"))
    ran = [f for f in a + b if f.startswith("nbs/chapters/")]
    assert sorted(ran) == chapters, f"chapters run by make test: {sorted(ran)}; in nbs/chapters: {chapters}"
    assert "nbs/chapters" in slow and set(a + b) - set(ran) == set(slow) - {"nbs/chapters"}
    assert "tests/test_chapter_results.py" in a and "tests/test_chapter_results.py" in b
