"""Calibration triples from small local HookedTransformers (coreinv.calibration)."""
import numpy as np
import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from coreinv.calibration import check_update, collect_triples, fit_realisations, mlp_map
from coreinv.koopman import EDMDc


def model(**kw):
    cfg = dict(n_layers=2, d_model=16, n_ctx=12, d_head=4, n_heads=4, d_mlp=32, d_vocab=30, act_fn="gelu",
               normalization_type="LN", seed=1, dtype=torch.float64, device="cpu")
    return HookedTransformer(HookedTransformerConfig(**{**cfg, **kw})).eval()


TOKENS = torch.randint(0, 30, (5, 12), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("kw", [{}, {"normalization_type": "RMS"}, {"attn_only": True}, {"act_fn": "relu"},
                                {"normalization_type": "LN", "d_mlp": 8}])
def test_update_equation_holds(kw):
    m = model(**kw)
    dev = check_update(m, TOKENS)
    assert set(dev) == {0, 1} and max(dev.values()) < 1e-13
    d = collect_triples(m, TOKENS)
    x, u, y = d.layer(1)
    with torch.no_grad():
        pred = x + u + mlp_map(m, 1)(torch.as_tensor(x + u)).numpy()
    assert np.abs(pred - y).max() < 1e-12 * np.abs(y).max()


def test_float32_model_within_float_tolerance():
    assert max(check_update(model(dtype=torch.float32), TOKENS).values()) < 1e-5


def test_parallel_attention_refused():
    with pytest.raises(ValueError, match="parallel"):
        check_update(model(parallel_attn_mlp=True), TOKENS)


def test_shapes_positions_pooled_per_layer():
    m = model()
    d = collect_triples(m, TOKENS, layers=[1], positions=[0, 5, 11], batch_size=2)
    _, cache = m.run_with_cache(TOKENS)
    assert d.X.shape == (1, 15, 16)
    assert np.array_equal(d.U[0], cache["blocks.1.hook_attn_out"][:, [0, 5, 11]].reshape(-1, 16).numpy())
    full = collect_triples(m, TOKENS)
    X, U, Y = full.pooled()
    assert X.shape == (2 * 60, 16) and np.array_equal(X[60:], full.layer(1)[0])
    assert np.array_equal(full.layer(0)[2], full.layer(1)[0])
    fits = fit_realisations(full, EDMDc(rank=8))
    assert set(fits) == {"pooled", 0, 1} and fits["pooled"].A_.shape == (8, 8)
    with pytest.raises(ValueError, match="out of range"):
        collect_triples(m, TOKENS, layers=[2])
    with pytest.raises(ValueError, match="was not collected"):
        d.layer(0)
    with pytest.raises(ValueError, match="integer tensor"):
        collect_triples(m, TOKENS.double())


def test_mlp_map_is_the_mlp_sublayer_and_pipeline_runs():
    from coreinv.dictionaries import RandomFourierDictionary
    from coreinv.spectra import invariance_residual
    m = model()
    _, cache = m.run_with_cache(TOKENS)
    with torch.no_grad():
        out = mlp_map(m, 0)(cache["blocks.0.hook_resid_mid"])
    assert torch.allclose(out, cache["blocks.0.hook_mlp_out"], atol=1e-13)
    assert (out.abs().max() > 1e-3)                                       # m is not trivially zero
    X, U, Y = collect_triples(m, TOKENS, positions=slice(1, None)).pooled()
    fit = EDMDc(RandomFourierDictionary(24)).fit(X, U, Y)
    assert fit.A_.shape == (25, 25) and fit.C_.shape == (16, 25) and np.isfinite(fit.eigvals_).all()
    r = invariance_residual(RandomFourierDictionary(24), X, U, Y)
    assert 0 < r.overall and r.per_feature.shape == (25,)


@pytest.mark.parametrize("bad, match", [
    ("hello", "^collect_triples: tokens are text but the model has no tokenizer"),
    ([[1.5, 2.0]], "^collect_triples: tokens are torch.float64, not ids"),
    (torch.tensor([[1.0, 2.0]]), "^collect_triples: tokens are torch.float32, not ids"),
    (torch.tensor([[1, 2, 30]]), "^collect_triples: token ids run from 1 to 30, outside the vocabulary 0..29"),
    (torch.tensor([[-1, 2]]), "^collect_triples: token ids run from -1 to 2"),
    (torch.zeros(1, 13, dtype=torch.long), "^collect_triples: sequences have 13 positions, more than the model's n_ctx=12"),
    ({"a": 1}, "^collect_triples: tokens must be token ids"),
    (torch.zeros(2, 2, 2, dtype=torch.long), "^collect_triples: tokens must be an integer tensor"),
])
def test_bad_tokens_name_the_cause(bad, match):
    with pytest.raises(ValueError, match=match):
        collect_triples(model(), bad)


def test_text_goes_through_to_tokens(tmp_path):
    import warnings
    from coreinv.models import load_local, tiny_local_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tiny_local_model("gpt2", tmp_path, n_layers=2, d_model=16, n_heads=2, n_ctx=16)
        m = load_local(tmp_path, route="hooked")
    text = collect_triples(m, "hello there")
    ids = collect_triples(m, m.to_tokens("hello there"))
    assert text.X.shape[1] == m.to_tokens("hello there").shape[1] and np.array_equal(text.Y, ids.Y)
    two = collect_triples(m, ["hello", "hello"])
    assert two.X.shape[1] == 2 * m.to_tokens("hello").shape[1]
    with pytest.raises(ValueError, match="^collect_triples: the texts tokenize to different lengths"):
        collect_triples(m, ["hello", "hello there"])
    assert max(check_update(m, "hello there").values()) < 1e-4


def test_calibration_data_refuses_nan():
    import numpy as np
    import pytest
    from coreinv.calibration import CalibrationData
    X = np.zeros((2, 4, 3)); bad = X.copy(); bad[1, 2, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        CalibrationData(bad, X, X, [0, 1])
    with pytest.raises(ValueError, match="shape"):
        CalibrationData(X, X[:, :2], X, [0, 1])
