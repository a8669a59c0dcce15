"""coreinv.sae: ReLU+L1 and TopK+AuxK SAEs, their metrics, and SAEDictionary on any SAE (ours, sae-lens)."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from coreinv.base import NotFittedError, clone
from coreinv.dictionaries import SAEDictionary
from coreinv.koopman import EDMDc, linear_control_system
from coreinv.sae import SAE, SparseAutoencoder, auxk_loss, ce_loss_recovered, sae_metrics, train_sae


def planted(n=4000, d=16, m=24, seed=0):
    "Data from m sparse unit atoms in d dims (about 2 per input), scaled and offset; and the atoms [m, d]."
    rng = np.random.default_rng(seed)
    true = rng.standard_normal((m, d)); true /= np.linalg.norm(true, axis=1, keepdims=True)
    codes = rng.exponential(1.0, (n, m)) * (rng.random((n, m)) < 2 / m)
    return 5.0 * codes @ true + 3.0 + 0.01 * rng.standard_normal((n, d)), true


X, TRUE = planted()


@pytest.fixture(scope="module")
def fits():
    return {kind: SparseAutoencoder(kind, expansion_factor=4, k=3, steps=800, progress=False).fit(X)
            for kind in ("relu", "topk")}


@pytest.mark.parametrize("kind", ["relu", "topk"])
def test_recovers_a_known_sparse_dictionary(fits, kind):
    est = fits[kind]
    met = sae_metrics(est, X)
    cos = np.abs(TRUE @ est.sae_.W_dec.numpy().T).max(1)                 # best cosine per true atom
    assert met["fvu"] < 0.06 and abs(met["explained_variance"] - (1 - met["fvu"])) < 1e-12
    assert (cos > 0.9).mean() >= 0.8
    assert 0 <= met["dead_fraction"] < 1 and est.d_sae_ == 64 and est.n_tokens_ == 800 * 256


def test_topk_l0_is_k(fits):
    L0 = (fits["topk"].encode(X) > 0).sum(-1)
    assert L0.max() == 3 and (L0 == 3).float().mean() > 0.99
    assert sae_metrics(fits["topk"], X)["l0"] == pytest.approx(L0.float().mean().item())
    s = SAE(8, 32, kind="topk", k=5, seed=2)
    with torch.no_grad(): s.b_enc.fill_(50.0)                            # all pre-activations positive
    assert ((s.encode(torch.randn(100, 8)) > 0).sum(-1) == 5).all()


def test_decoder_rows_unit_norm_after_every_step(fits):
    h = fits["relu"].history_
    assert len(h["decoder_norm_error"]) == 800 and h["decoder_norm_error"].max() < 1e-5
    assert torch.allclose(fits["relu"].sae_.W_dec.norm(dim=1), torch.ones(64))   # also after folding the scale


def test_encoder_init_is_decoder_transpose():
    for kind, k in [("relu", None), ("topk", 4)]:
        s = SAE(12, 48, seed=3, kind=kind, k=k)
        assert torch.equal(s.W_enc, s.W_dec.T) and torch.allclose(s.W_dec.norm(dim=1), torch.ones(48))
        assert (s.b_enc == 0).all() and (s.b_dec == 0).all()
    assert not torch.equal(SAE(12, 48, seed=3).W_dec, SAE(12, 48, seed=4).W_dec)


def test_resampling_revives_planted_dead_latents():
    init = SAE(16, 24, seed=0)                                           # as wide as the 24 atoms
    with torch.no_grad(): init.b_enc[:8] = -1e3                          # 8 latents that never fire
    out = {}
    for every in (100, None):
        est = SparseAutoencoder("relu", d_sae=24, steps=400, dead_window=50, resample_every=every,
                                progress=False).fit(X, init=init)
        out[every] = ((est.encode(X)[:, :8] > 0).float().mean(0), sae_metrics(est, X)["fvu"], est.n_resampled_)
    assert (out[100][0] > 0.01).all() and out[100][2] >= 8
    assert (out[None][0] == 0).all() and out[None][2] == 0               # the control stays dead
    assert out[100][1] < out[None][1]
    assert (init.b_enc[:8] == -1e3).all()                                # init is not trained in place


def test_auxk_loss_is_nonzero_only_with_dead_latents(fits):
    s = SAE(8, 32, seed=1, kind="topk", k=4)
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    xh, _ = s(x)
    e, var = (x - xh).detach(), (x - x.mean(0)).pow(2).sum()
    none = torch.zeros(32, dtype=torch.bool)
    some = none.clone(); some[[1, 5, 9]] = True
    assert auxk_loss(s.pre_acts(x), e, s.W_dec, none, 4, var) == 0
    pre = s.pre_acts(x).detach().requires_grad_(True)
    la = auxk_loss(pre, e, s.W_dec, some, 4, var)                        # k_aux = 4 > 3 dead: uses 3
    la.backward()
    assert la > 0 and (pre.grad[:, ~some] == 0).all()
    z = torch.zeros_like(pre); z[:, some] = pre.detach()[:, some].relu()
    assert torch.allclose(la, (z @ s.W_dec - e).pow(2).sum() / var)
    h = fits["topk"].history_                                            # and in training, step by step
    assert np.array_equal(h["aux"] > 0, h["dead_fraction"] > 0) and (h["dead_fraction"] > 0).any()
    assert (fits["relu"].history_["aux"] == 0).all()


def test_estimator_contract():
    est = SparseAutoencoder("relu", expansion_factor=8, steps=20, seed=2, progress=False)
    assert est.get_params()["expansion_factor"] == 8 and est.set_params(seed=3) is est and est.seed == 3
    assert repr(est) == "SparseAutoencoder(kind='relu', expansion_factor=8, steps=20, seed=3, progress=False)"
    with pytest.raises(NotFittedError, match=r"^SparseAutoencoder\.encode needs a fitted SparseAutoencoder: call fit first"):
        est.encode(X)
    est.fit(X)
    assert est.sae_.cfg.d_sae == 8 * 16 and repr(est).endswith("  # fitted: d_sae_=128")
    c = clone(est)
    assert not hasattr(c, "sae_") and c.get_params() == est.get_params()
    f = est.encode(X[:5])
    assert f.shape == (5, 128) and (f >= 0).all() and est.decode(f).shape == (5, 16)
    assert est.encode(torch.as_tensor(X[:6]).reshape(2, 3, 16)).shape == (2, 3, 128)   # [batch, pos, d]
    for bad in [dict(kind="gated"), dict(steps=0), dict(k=0), dict(lr=0.0), dict(kind="topk", d_sae=4, k=5)]:
        with pytest.raises(ValueError):
            SparseAutoencoder(**{"progress": False, **bad}).fit(X)


def test_bad_input_names_the_cause(fits):
    bad = X.copy(); bad[7, 3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        SparseAutoencoder(progress=False).fit(bad)
    with pytest.raises(ValueError, match="NaN"):
        sae_metrics(fits["topk"], bad)
    with pytest.raises(ValueError, match="NaN"):
        SAEDictionary(fits["topk"], 4).fit(bad)
    with pytest.raises(ValueError, match="zero variance"):
        SparseAutoencoder(progress=False).fit(np.ones((10, 4)))
    for call in [lambda: sae_metrics(fits["topk"], X[:, :12]), lambda: fits["topk"].encode(X[:, :12]),
                 lambda: SAEDictionary(fits["topk"].sae_, 4).fit(X[:, :12]),
                 lambda: SparseAutoencoder("relu", d_sae=64, progress=False).fit(X[:, :12], init=fits["relu"].sae_)]:
        with pytest.raises(ValueError, match="d_in=16"):
            call()


def _tiny_model():
    from coreinv.train import make_transformer
    g = torch.Generator().manual_seed(0)
    def steps_mod(n, V=20, T=16):
        start = torch.randint(0, V, (n, 1), generator=g)
        return torch.cat([start, (start + torch.randint(1, 3, (n, T - 1), generator=g).cumsum(1)) % V], 1)
    model = make_transformer(1, 32, 4, 20, 16, seed=0)
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    for _ in range(60):
        loss = model(steps_mod(64), return_type="loss"); opt.zero_grad(); loss.backward(); opt.step()
    return model.requires_grad_(False), steps_mod(32)


@pytest.fixture(scope="module")
def tiny():
    return _tiny_model()


def test_ce_loss_recovered(tiny):
    from coreinv.hooks import record_activation
    model, tokens = tiny
    hook = "blocks.0.hook_resid_post"
    ident, zero = SAE(32, 64), SAE(32, 64)
    with torch.no_grad():
        eye = torch.eye(32)
        ident.W_enc.copy_(torch.cat([eye, -eye], 1)); ident.W_dec.copy_(torch.cat([eye, -eye], 0))
        zero.W_dec.zero_()
    assert ce_loss_recovered(model, hook, ident, tokens) == pytest.approx(1, abs=1e-6)
    assert ce_loss_recovered(model, hook, zero, tokens) == pytest.approx(0, abs=1e-12)
    acts = record_activation(model, hook, tokens)[0].reshape(-1, 32)
    est = SparseAutoencoder("topk", steps=200, progress=False).fit(acts)
    r = ce_loss_recovered(model, hook, est, tokens, batch_size=7)       # batching does not matter
    assert 0.8 < r < 1.05 and r == pytest.approx(ce_loss_recovered(model, hook, est, tokens), abs=1e-9)
    with pytest.raises(ValueError, match="d_in=16"):
        ce_loss_recovered(model, hook, SAE(16, 32), tokens)
    with pytest.raises(ValueError, match="unknown hook"):
        ce_loss_recovered(model, "blocks.9.hook_resid_post", est, tokens)
    with pytest.raises(ValueError, match="integer"):
        ce_loss_recovered(model, hook, est, tokens.float())


class LensLike:
    "A minimal stand-in shaped like sae-lens's `SAE`: W_enc, b_enc, W_dec, b_dec, cfg, dtype, device, encode, decode."
    def __init__(self, d_in=4, d_sae=16, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.W_enc = torch.randn(d_in, d_sae, generator=g)
        self.b_enc = -torch.linspace(0, 2, d_sae)
        self.W_dec, self.b_dec = self.W_enc.T.clone(), torch.zeros(d_in)
        self.cfg = SimpleNamespace(d_in=d_in, d_sae=d_sae)
        self.dtype, self.device = torch.float32, torch.device("cpu")
    def encode(self, x): return torch.relu((x - self.b_dec) @ self.W_enc + self.b_enc)
    def decode(self, f): return f @ self.W_dec + self.b_dec


def _check_wrapper(sae, d_in):
    A, B, Xc, U, Y = linear_control_system(600, seed=0)
    Z = sae.encode(torch.as_tensor(Xc, dtype=torch.float32)).detach().double().numpy()
    dv = SAEDictionary(sae, 5, select="variance").fit(Xc)
    df = SAEDictionary(sae, 5, select="frequency").fit(Xc)
    assert list(dv.latents_) == list(np.argsort(-Z.var(0), kind="stable")[:5])
    assert list(df.latents_) == list(np.argsort(-(Z > 0).mean(0), kind="stable")[:5])
    assert np.allclose(dv.transform(Xc)[:, 1:], Z[:, dv.latents_], atol=1e-6)
    m = EDMDc(SAEDictionary(sae, 5)).fit(Xc, U, Y)
    assert m.A_.shape == (6, 6) and np.isfinite(m.eigvals_).all()
    met = sae_metrics(sae, Xc)
    assert set(met) == {"fvu", "explained_variance", "l0", "dead_fraction"} and np.isfinite(met["fvu"])
    with pytest.raises(ValueError, match=f"d_in={d_in}"):
        SAEDictionary(sae, 5).fit(np.hstack([Xc, Xc]))
    with pytest.raises(ValueError, match=f"d_in={d_in}"):
        sae_metrics(sae, np.hstack([Xc, Xc]))


def test_sae_dictionary_on_a_sae_lens_shaped_object():
    _check_wrapper(LensLike(), 4)


def test_sae_dictionary_on_our_estimator():
    A, B, Xc, U, Y = linear_control_system(600, seed=0)
    est = SparseAutoencoder("topk", k=2, steps=100, progress=False).fit(np.vstack([Xc, Y]))
    d = SAEDictionary(est, 5).fit(Xc)
    assert np.allclose(d.transform(Xc)[:, 1:], est.encode(Xc).double().numpy()[:, d.latents_], atol=1e-6)
    assert EDMDc(SAEDictionary(est.sae_, 5)).fit(Xc, U, Y).A_.shape == (6, 6)
    with pytest.raises(ValueError, match="not fitted"):
        EDMDc(SAEDictionary(est, 5)).fit(Xc, U, Y)          # EDMDc fits a clone: pass est.sae_
    _check_wrapper(train_sae(np.vstack([Xc, Y]), 16, steps=100), 4)


def test_sae_dictionary_on_a_sae_lens_sae():
    sae_lens = pytest.importorskip("sae_lens")
    torch.manual_seed(0)
    std = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=4, d_sae=16))
    top = sae_lens.TopKSAE(sae_lens.TopKSAEConfig(d_in=4, d_sae=16, k=3))
    with torch.no_grad():
        for s in (std, top):                                               # zero init would give all-zero latents
            s.W_enc.copy_(torch.randn(4, 16)); s.b_enc.copy_(-torch.linspace(0, 1, 16))
    for s in (std, top):
        _check_wrapper(s, 4)
    A, B, Xc, U, Y = linear_control_system(600, seed=0)
    assert (sae_lens_l0 := (top.encode(torch.as_tensor(Xc, dtype=torch.float32)) > 0).sum(-1)).max() <= 3
    assert sae_metrics(top, Xc)["l0"] == pytest.approx(sae_lens_l0.float().mean().item())


def test_sae_lens_sae_in_ce_loss_recovered(tiny):
    sae_lens = pytest.importorskip("sae_lens")
    model, tokens = tiny
    s = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=32, d_sae=64))
    with torch.no_grad():                                                  # the identity, as a sae-lens SAE
        eye = torch.eye(32)
        s.W_enc.copy_(torch.cat([eye, -eye], 1)); s.W_dec.copy_(torch.cat([eye, -eye], 0))
        s.b_enc.zero_(); s.b_dec.zero_()
    assert ce_loss_recovered(model, "blocks.0.hook_resid_post", s, tokens) == pytest.approx(1, abs=1e-6)
    with pytest.raises(ValueError, match="d_in=32"):
        sae_metrics(s, np.random.default_rng(0).standard_normal((5, 16)))


def test_match_features_hungarian_and_share(fits):
    from coreinv.sae import match_features
    a = fits["topk"]
    assert match_features(a, a).share == 1.0
    # a permuted copy of the decoder matches perfectly, in the permuted order
    perm = torch.randperm(a.d_sae_, generator=torch.Generator().manual_seed(0))
    copy = SimpleNamespace(W_dec=a.sae_.W_dec[perm])
    m = match_features(a, copy)
    assert m.share == 1.0 and np.array_equal(perm.numpy()[m.cols], m.rows)
    assert match_features(a, SAE(16, a.d_sae_, seed=5)).share < 0.2     # a random decoder: a negative control
    with pytest.raises(ValueError, match="different widths"):
        match_features(a, SAE(8, 16))
    with pytest.raises(ValueError, match="W_dec"):
        match_features(a, object())


def test_invariance_penalty_lowers_the_residual():
    from coreinv.dictionaries import SAEDictionary
    from coreinv.spectra import invariance_residual
    A, B, X4, U4, Y4 = linear_control_system(4000, seed=3)
    lift = np.random.default_rng(0).standard_normal((4, 16))
    Xl, Yl = X4 @ lift, Y4 @ lift
    res = {}
    for lam in (0.0, 1.0):
        est = SparseAutoencoder("topk", d_sae=32, k=4, steps=600, invariance=lam, progress=False).fit(Xl, U4, Yl)
        res[lam] = invariance_residual(SAEDictionary(est.sae_), Xl, U4, Yl).overall
        assert (est.history_["invariance"] > 0).any() == (lam > 0)
    assert res[1.0] < 0.5 * res[0.0]                    # λ = 0 is the control: the penalty does the work
    with pytest.raises(ValueError, match="needs the dynamics"):
        SparseAutoencoder(invariance=1.0, progress=False).fit(Xl)
    with pytest.raises(ValueError, match="paired"):
        SparseAutoencoder(invariance=1.0, progress=False).fit(Xl, U4, Yl[:-1])
    with pytest.raises(ValueError, match="invariance"):
        SparseAutoencoder(invariance=-1.0, progress=False).fit(Xl, U4, Yl)
