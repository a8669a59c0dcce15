"ACE edge cases not shown in nbs/10_ace.ipynb (whose test cells hold the closed forms, equivariance and bad input)."
import warnings

import pytest
import torch
from torch import nn

import inspect

import coreinv.ace
import coreinv.base
import coreinv.hooks
from coreinv.hooks import record_activation, replace_activation
from coreinv.ace import ACE

F64 = torch.float64


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    D, O = 12, 5
    L = torch.randn(D, D, generator=g, dtype=F64)
    acts = torch.randn(2000, D, generator=g, dtype=F64) @ L.T + 2.0
    W = torch.randn(O, D, generator=g, dtype=F64)
    A = torch.randn(3, D, D, generator=g, dtype=F64)
    A = (A + A.transpose(1, 2)) / 2
    Q = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=F64))[0]
    return dict(acts=acts, W=W, A=A, Q=Q, D=D, O=O)


def _svd_basis(K, r):
    U, S, _ = torch.linalg.svd(K, full_matrices=False)
    return U[:, :r], S[:r]



def test_jvp_single_output_is_not_centred_away(data):
    acts, W = data["acts"], data["W"][:1]
    ace = ACE().fit(acts, lambda x: (x @ W.T)[:, 0])   # [n] output → O = 1
    Ht = acts - acts.mean(0)
    U, S = _svd_basis(Ht.T @ Ht / len(acts) @ W.T, 1)
    assert ace.rank_ == 1 and torch.allclose(ace.singular_values_, S, rtol=1e-10)


def test_gramian_of_linear_readout_raises(data):
    with pytest.raises(ValueError, match="numerically zero"):
        ACE(method="gramian").fit(data["acts"], lambda x: x @ data["W"].T)


def test_batch_size_does_not_matter(data):
    f = lambda x: torch.tanh(x / 10) @ data["W"].T
    a = ACE(batch_size=64).fit(data["acts"], f)
    b = ACE(batch_size=5000).fit(data["acts"], f)
    assert torch.allclose(a.singular_values_, b.singular_values_, rtol=1e-10)
    assert torch.allclose(a.basis_, b.basis_, atol=1e-10)


# ---- models -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tl_model():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import HookedTransformer, HookedTransformerConfig
        cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=5, d_head=4, n_heads=4, d_mlp=32,
                                      d_vocab=9, act_fn="gelu", seed=0)
        model = HookedTransformer(cfg).eval()
    tokens = torch.randint(0, 9, (12, 5), generator=torch.Generator().manual_seed(0))
    return model, tokens


def _readout(logits, toks):                       # [b, pos, vocab] → [b, pos, 3]
    return logits.log_softmax(-1)[..., :3]


def _brute_force_jacobians(model, tokens, hook, t):
    "Centred activations H̃ [N, D] at position t and each sample's Jacobian J_n [3, D] by plain autograd."
    acts, _ = record_activation(model, hook, tokens)
    H = acts[:, t].double()
    Js = []
    for n in range(len(tokens)):
        def yn(hn, n=n):
            def sub(act):
                act = act.clone(); act[:, t] = hn.float(); return act
            with replace_activation(model, hook, sub):
                y = _readout(model(tokens[n:n + 1]), None)[0, t]
            return y - y.mean()
        Js.append(torch.autograd.functional.jacobian(yn, H[n]).double())   # [3, D]: rows are g_{n,o}
    return H - H.mean(0), Js



def test_gramian_fit_hook_matches_brute_force(tl_model):
    model, tokens = tl_model
    hook, t = "blocks.0.hook_resid_post", 2
    ace = ACE(method="gramian", batch_size=5).fit_hook(model, tokens, hook, _readout, pos=t)
    Ht, Js = _brute_force_jacobians(model, tokens, hook, t)
    C = sum(torch.einsum("d,oe->ode", h, J) for h, J in zip(Ht, Js)) / len(Js)   # [3, D, D]
    S = torch.linalg.svdvals(C.permute(1, 0, 2).reshape(Ht.shape[1], -1))
    assert torch.allclose(ace.singular_values_.double(), S[:ace.rank_], rtol=1e-3, atol=1e-6 * S[0])


def test_fit_hook_all_positions_and_attention_hook(tl_model):
    model, tokens = tl_model
    ace = ACE(batch_size=6).fit_hook(model, tokens, "blocks.0.hook_resid_post", _readout)
    assert ace.n_samples_ == 12 * 5 and ace.rank_ == 2
    z = ACE().fit_hook(model, tokens, "blocks.1.attn.hook_z", _readout, pos=-1)   # [b, pos, head, d_head]
    assert z.basis_.shape[0] == 16


def test_fit_hook_refuses_active_dropout():
    xs = torch.randn(300, 4)
    drop = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 3))
    with pytest.raises(ValueError, match="eval"):
        ACE().fit_hook(drop, xs, "0", lambda out, x: out)


# ---- discoverable API and progress -------------------------------------------------------------

def _public_callables():
    for mod in (coreinv.base, coreinv.hooks, coreinv.ace):                   # ace and the modules split from it
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isclass(obj) and issubclass(obj, Exception): continue   # NotFittedError: an exception's
            yield name, obj                                                      # signature is its message
            if inspect.isclass(obj):
                for m, f in vars(obj).items():
                    if not m.startswith("_") and callable(f) and m not in ("get_params", "set_params") or \
                            m in ("fit", "fit_hook", "partial_fit", "finalize", "core", "transform"):
                        yield f"{name}.{m}", getattr(obj, m)


def test_module_docstring():
    assert coreinv.ace.__doc__ and "Algorithmic Core Extraction" in coreinv.ace.__doc__


@pytest.mark.parametrize("name,obj", list(_public_callables()), ids=lambda v: v if isinstance(v, str) else "")
def test_numpydoc_docstrings(name, obj):
    doc = inspect.getdoc(obj) or ""
    assert "Parameters\n----------" in doc or not [p for p in inspect.signature(obj).parameters
                                                  if p not in ("self", "cls")], f"{name}: no Parameters"
    assert "Returns\n-------" in doc or name in ("Core", "ACE", "Estimator"), f"{name}: no Returns"


def test_help_shows_fit_hook_cost_and_progress():
    doc = inspect.getdoc(ACE.fit_hook)
    for words in ("Raises", "progress", "one JVP pass per position", "hook_pattern", "metric(logits)"):
        assert words in doc, words


def test_fit_hook_progress_bar(tl_model, capsys):
    model, tokens = tl_model
    ACE(batch_size=6).fit_hook(model, tokens, "blocks.0.hook_resid_post", _readout, pos=-1)
    assert "ACE.fit_hook" in capsys.readouterr().err
    ACE(batch_size=6).fit_hook(model, tokens, "blocks.0.hook_resid_post", _readout, pos=-1, progress=False)
    assert capsys.readouterr().err == ""
