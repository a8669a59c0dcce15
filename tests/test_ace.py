"ACE estimator: closed forms, equivariance, batching, model hooks and bad input."
import warnings

import pytest
import torch
from torch import nn

from coreinv.ace import ACE, Core, record_activation, replace_activation

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


def _same_columns(U, V, atol):
    "Columns equal up to sign."
    return torch.allclose((U.T @ V).diagonal().abs(), torch.ones(U.shape[1], dtype=F64), atol=atol)


def test_jvp_equals_cov_times_readout(data):
    acts, W = data["acts"], data["W"]
    ace = ACE(batch_size=333).fit(acts, lambda x: x @ W.T)
    Ht = acts - acts.mean(0)
    Wc = W - W.mean(0)                              # centring the outputs centres W's rows
    U, S = _svd_basis(Ht.T @ Ht / len(acts) @ Wc.T, data["O"] - 1)
    assert ace.rank_ == data["O"] - 1
    assert torch.allclose(ace.singular_values_, S, rtol=1e-10)
    assert _same_columns(ace.basis_, U, 1e-9)
    assert torch.allclose(ace.mean_, acts.mean(0))


def test_jvp_single_output_is_not_centred_away(data):
    acts, W = data["acts"], data["W"][:1]
    ace = ACE().fit(acts, lambda x: (x @ W.T)[:, 0])   # [n] output → O = 1
    Ht = acts - acts.mean(0)
    U, S = _svd_basis(Ht.T @ Ht / len(acts) @ W.T, 1)
    assert ace.rank_ == 1 and torch.allclose(ace.singular_values_, S, rtol=1e-10)


def test_gramian_equals_closed_form(data):
    acts, A = data["acts"], data["A"]
    quad = lambda x: 0.5 * torch.einsum("nd,ode,ne->no", x, A, x)
    ace = ACE(method="gramian", batch_size=700).fit(acts, quad)
    Ht = acts - acts.mean(0)
    Sigma = Ht.T @ Ht / len(acts)
    Ac = A - A.mean(0)
    U, S = _svd_basis(torch.cat([Sigma @ a for a in Ac], 1), data["D"])
    assert ace.rank_ == data["D"]
    assert torch.allclose(ace.singular_values_, S, rtol=1e-9)
    assert _same_columns(ace.basis_, U, 1e-7)


def test_gramian_of_linear_readout_raises(data):
    with pytest.raises(ValueError, match="numerically zero"):
        ACE(method="gramian").fit(data["acts"], lambda x: x @ data["W"].T)


@pytest.mark.parametrize("method", ["jvp", "gramian"])
def test_equivariance(data, method):
    acts, W, A, Q = data["acts"], data["W"], data["A"], data["Q"]
    f = (lambda x: torch.tanh(x / 10) @ W.T) if method == "jvp" else \
        (lambda x: 0.5 * torch.einsum("nd,ode,ne->no", x, A, x))
    a = ACE(method=method).fit(acts, f)
    b = ACE(method=method).fit(acts @ Q.T, lambda x: f(x @ Q))
    assert a.rank_ == b.rank_
    assert torch.allclose(a.singular_values_, b.singular_values_, rtol=1e-9)
    assert _same_columns(b.basis_[:, :3], Q @ a.basis_[:, :3], 1e-8)


def test_batch_size_does_not_matter(data):
    f = lambda x: torch.tanh(x / 10) @ data["W"].T
    a = ACE(batch_size=64).fit(data["acts"], f)
    b = ACE(batch_size=5000).fit(data["acts"], f)
    assert torch.allclose(a.singular_values_, b.singular_values_, rtol=1e-10)
    assert torch.allclose(a.basis_, b.basis_, atol=1e-10)


def test_sketch_recovers_low_rank_curvature(data):
    g = torch.Generator().manual_seed(1)
    D = data["D"]
    B = torch.linalg.qr(torch.randn(D, 2, generator=g, dtype=F64))[0]
    R = torch.randn(40, 2, 2, generator=g, dtype=F64)
    A2 = torch.einsum("dk,okl,el->ode", B, R + R.transpose(1, 2), B)
    f = lambda x: 0.5 * torch.einsum("nd,ode,ne->no", x, A2, x)
    sk = ACE(method="gramian", n_sketch=6).fit(data["acts"], f)
    Ht = data["acts"] - data["acts"].mean(0)
    SB = torch.linalg.qr(Ht.T @ Ht @ B)[0]                          # C_o = Σ Ã_o: the core is range(Σ B)
    assert sk.rank_ == 2
    assert (sk.basis_.T @ SB).pow(2).sum() / 2 > 1 - 1e-9


def test_core_maps(data):
    ace = ACE().fit(data["acts"], lambda x: x @ data["W"].T)
    c = ace.core(2)
    h = data["acts"][:10]
    assert torch.allclose(c.keep(h) + c.remove(h), h + c.mean)
    assert torch.allclose(c.coords(c.remove(h)), torch.zeros(10, 2, dtype=F64), atol=1e-9)
    assert torch.allclose(ace.transform(h, 2), c.coords(h))
    with pytest.raises(ValueError, match="orthonormal"):
        Core(torch.ones(4, 2), torch.zeros(4))


def _bad_cases(acts, W):
    lin = lambda x: x @ W.T
    nan = acts.clone(); nan[3, 1] = float("inf")
    return {
        "1-D acts": lambda: ACE().fit(acts[:, 0], lin),
        "N<2": lambda: ACE().fit(acts[:1], lin),
        "inf acts": lambda: ACE().fit(nan, lin),
        "int acts": lambda: ACE().fit(acts.long(), lin),
        "N mismatch": lambda: ACE().fit(acts, lambda x: lin(x)[1:]),
        "D mismatch": lambda: ACE().fit(acts[:, :5], lin),
        "D mismatch gramian": lambda: ACE(method="gramian").fit(acts[:, :5], lin),
        "nan outputs": lambda: ACE().fit(acts, lambda x: lin(x).log()),
        "nan jacobian": lambda: ACE().fit(acts, lambda x: torch.sqrt(x * 0) @ W.T),
        "numpy": lambda: ACE().fit(acts, lambda x: torch.tensor(x.numpy()) @ W.T),
        "detach": lambda: ACE().fit(acts, lambda x: x.detach() @ W.T),
        "not callable": lambda: ACE().fit(acts, W),
        "method": lambda: ACE(method="pca").fit(acts, lin),
        "k > rank": lambda: ACE().fit(acts, lin).core(W.shape[0]),
        "k = 0": lambda: ACE().fit(acts, lin).core(0),
        "unfitted": lambda: ACE().core(1),
        "sketch with jvp": lambda: ACE(n_sketch=3).fit(acts, lin),
        "non-tensor outputs": lambda: ACE().fit(acts, lambda x: 1.0),
    }


@pytest.mark.parametrize("case", list(_bad_cases(torch.zeros(5, 2), torch.zeros(2, 2))))
def test_bad_input_raises_value_error(data, case):
    with pytest.raises(ValueError):
        _bad_cases(data["acts"], data["W"])[case]()


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


def _brute_force_M(model, tokens, hook, t):
    Ht, Js = _brute_force_jacobians(model, tokens, hook, t)
    return sum(torch.outer(h, J @ h) for h, J in zip(Ht, Js)) / len(Js)


def test_fit_hook_matches_brute_force_through_later_blocks(tl_model):
    model, tokens = tl_model
    hook = "blocks.0.hook_resid_post"
    ace = ACE(batch_size=5).fit_hook(model, tokens, hook, _readout, pos=2)
    S = torch.linalg.svdvals(_brute_force_M(model, tokens, hook, 2))
    assert ace.rank_ == 2 and ace.hook_ == hook and ace.n_samples_ == 12
    assert torch.allclose(ace.singular_values_, S[:2], rtol=1e-4)


def test_gramian_fit_hook_matches_brute_force(tl_model):
    model, tokens = tl_model
    hook, t = "blocks.0.hook_resid_post", 2
    ace = ACE(method="gramian", batch_size=5).fit_hook(model, tokens, hook, _readout, pos=t)
    Ht, Js = _brute_force_jacobians(model, tokens, hook, t)
    C = sum(torch.einsum("d,oe->ode", h, J) for h, J in zip(Ht, Js)) / len(Js)   # [3, D, D]
    S = torch.linalg.svdvals(C.permute(1, 0, 2).reshape(Ht.shape[1], -1))
    assert torch.allclose(ace.singular_values_, S[:ace.rank_], rtol=1e-3, atol=1e-6 * S[0])


def test_fit_hook_all_positions_and_attention_hook(tl_model):
    model, tokens = tl_model
    ace = ACE(batch_size=6).fit_hook(model, tokens, "blocks.0.hook_resid_post", _readout)
    assert ace.n_samples_ == 12 * 5 and ace.rank_ == 2
    z = ACE().fit_hook(model, tokens, "blocks.1.attn.hook_z", _readout, pos=-1)   # [b, pos, head, d_head]
    assert z.basis_.shape[0] == 16


def test_joint_positions_exact_only_when_positions_do_not_mix(tl_model):
    model, tokens = tl_model
    a = ACE(batch_size=6).fit_hook(model, tokens, "blocks.1.hook_resid_post", _readout, joint=True)
    b = ACE(batch_size=6).fit_hook(model, tokens, "blocks.1.hook_resid_post", _readout)
    assert torch.allclose(a.singular_values_, b.singular_values_, rtol=1e-5)
    with pytest.raises(ValueError, match="interact"):
        ACE().fit_hook(model, tokens, "blocks.0.hook_resid_post", _readout, joint=True)


def test_unknown_hook_lists_close_names(tl_model):
    model, tokens = tl_model
    with pytest.raises(ValueError, match="blocks.0.hook_resid_post"):
        ACE().fit_hook(model, tokens, "blocks.0.hook_resid_pots", _readout)
    mlp = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match="unknown hook"):
        ACE().fit_hook(mlp, torch.randn(10, 3), "hidden", lambda o, x: o)


def test_fit_hook_on_plain_module_equals_fit():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    xs = torch.randn(300, 4)
    a = ACE().fit_hook(mlp, xs, "1", lambda out, x: out)
    b = ACE().fit(mlp[1](mlp[0](xs)).detach(), lambda h: mlp[2:](h))
    assert torch.allclose(a.singular_values_, b.singular_values_, rtol=1e-5)
    with pytest.raises(ValueError, match="no position axis"):
        ACE().fit_hook(mlp, xs, "1", lambda out, x: out, pos=0)
    drop = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 3))
    with pytest.raises(ValueError, match="eval"):
        ACE().fit_hook(drop, xs, "0", lambda out, x: out)
