"""The top-level API (nbs/02_api.ipynb → coreinv/__init__.py) and the docstring convention of the
modules issue 11 asked about. The import checks run in a fresh interpreter: what `import coreinv`
pulls in depends on what this process has imported already."""
import ast
import inspect
import json
import subprocess
import sys

import pytest

from helpers import REPO

MAIN = "from coreinv import ACE, Core, ablate, core_dims, EDMDc, PCADictionary, collect_triples, spectral_distance"


def _py(code: str) -> dict:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fresh_imports() -> dict:
    """In one fresh interpreter, in this order: what `import coreinv` pulls in; the main names (and whether they
    needed TransformerLens); the SAE names; then `from coreinv import *` and every lazy export against its module."""
    return _py("import sys, json, coreinv\n"
               "heavy = sorted(m for m in ('torch', 'transformer_lens', 'numpy', 'scipy') if m in sys.modules)\n"
               f"{MAIN}\n"
               "import coreinv.ace as a, coreinv.koopman as k\n"
               "main = dict(heavy=heavy, version=coreinv.__version__, ace=ACE is a.ACE, edmdc=EDMDc is k.EDMDc,\n"
               "    ablate=ablate is sys.modules['coreinv.ablate'].ablate, tl='transformer_lens' in sys.modules)\n"
               "from coreinv import SparseAutoencoder, SAE, sae_metrics, ce_loss_recovered\n"
               "import coreinv.sae as s\n"
               "sae = all(getattr(s, n) is v for n, v in dict(SparseAutoencoder=SparseAutoencoder,\n"
               "    SAE=SAE, sae_metrics=sae_metrics, ce_loss_recovered=ce_loss_recovered).items())\n"
               "ns = {}\nexec('from coreinv import *', ns)\n"
               "bad = [n for m, names in coreinv._EXPORTS.items() for n in names\n"
               "       if getattr(coreinv, n) is not getattr(__import__(f'coreinv.{m}', fromlist=[n]), n)]\n"
               "print(json.dumps(dict(main=main, sae=sae, bad=bad, star=sorted(set(ns) - {'__builtins__'}),\n"
               "    all=sorted(coreinv.__all__), dir=all(n in dir(coreinv) for n in coreinv.__all__))))")


def test_import_coreinv_is_cheap_and_exposes_the_main_names(fresh_imports):
    out = fresh_imports["main"]
    assert out["heavy"] == [] and out["ace"] and out["edmdc"] and out["ablate"]
    assert not out["tl"]                                  # none of these names needs TransformerLens
    assert fresh_imports["sae"] is True
    settings = (REPO / "settings.ini").read_text()
    assert f"version = {out['version']}\n" in settings


def test_ablate_is_the_function_whatever_was_imported_first():
    out = _py("import sys, json\n"
              "from coreinv.ablate import core_dims          # binds the submodule to coreinv.ablate\n"
              "import coreinv\n"
              "from coreinv import ablate\n"
              "print(json.dumps(dict(fn=callable(ablate) and ablate.__name__ == 'ablate',\n"
              "    attr=coreinv.ablate is ablate, mod=sys.modules['coreinv.ablate'].core_dims is core_dims)))")
    assert out == {"fn": True, "attr": True, "mod": True}


def test_every_export_resolves_and_star_import_matches(fresh_imports):
    out = fresh_imports
    assert out["bad"] == [] and out["star"] == out["all"] and out["dir"]
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        import coreinv
        coreinv.nope


def test_type_checking_imports_list_the_same_names():
    tree = ast.parse((REPO / "coreinv" / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    static = {(imp.module, a.name) for imp in block.body for a in imp.names}
    import coreinv
    assert static == {(m, n) for m, names in coreinv._EXPORTS.items() for n in names}


# -- numpydoc docstrings (issue 11): the modules of this part -------------------------------------------
def _modules() -> list[str]:
    "Every module of the package (a new one is covered the moment it is exported)."
    import pkgutil
    import coreinv
    return sorted(m.name.removeprefix("coreinv.") for m in pkgutil.walk_packages(coreinv.__path__, "coreinv.")
                  if not m.ispkg and not m.name.rsplit(".", 1)[-1].startswith("_"))


MODULES = _modules()
# Public names whose docstring still lacks numpydoc sections (none: a docstring edit changes no code key).
NOT_YET: set[str] = set()


def _public(modname):
    import importlib
    mod = importlib.import_module(f"coreinv.{modname}")
    for name in mod.__all__:
        obj = getattr(mod, name)
        if name in NOT_YET or not callable(obj) or getattr(obj, "__module__", None) != mod.__name__:
            continue
        yield name, obj


@pytest.mark.parametrize("modname", MODULES)
def test_module_and_public_docstrings_are_numpydoc(modname):
    import importlib
    mod = importlib.import_module(f"coreinv.{modname}")
    assert mod.__doc__ and len(mod.__doc__) > 40, f"coreinv.{modname} has no module docstring"
    missing = []
    for name, obj in _public(modname):
        doc = inspect.getdoc(obj) or ""
        if inspect.isclass(obj):                          # a base class without __init__ arguments
            takes = [p for p in inspect.signature(obj.__init__).parameters if p != "self"] \
                if obj.__init__ is not object.__init__ else []   # (`Estimator`) needs only its prose
            ok = "\nParameters\n---" in doc or "\nAttributes\n---" in doc or (not takes and len(doc) > 40)
        else:
            params = [p for p in inspect.signature(obj).parameters if p != "self"]
            ok = ("\nReturns\n---" in doc or "\nYields\n---" in doc) and (not params or "\nParameters\n---" in doc)
        if not ok: missing.append(name)
    assert not missing, f"coreinv.{modname}: no numpydoc sections in {missing}"
