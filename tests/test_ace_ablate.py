"""ablate, beyond the notebook's own checks (nbs/11_ablate.ipynb, run by nbval): scores of a lower-is-better
metric, positions and hook-name errors in a TransformerLens model, baselines on three classes."""
import pytest
import torch

from coreinv.ablate import ablate, class_means_core, necessity, pca_core, probe_core, random_core, sufficiency
from coreinv.ace import Core

F64 = torch.float64


def test_scores_of_a_lower_is_better_metric():
    assert abs(sufficiency(0.01, 0.0, 0.2) - 0.95) < 1e-12
    assert abs(necessity(0.25, 0.0, 0.2) - 1.25) < 1e-12            # worse than chance: above 1, not clipped
    with pytest.raises(ValueError):
        necessity(0.1, 0.3, 0.3)


def test_ablate_transformer_lens_positions():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from transformer_lens import HookedTransformer, HookedTransformerConfig
        model = HookedTransformer(HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=4, d_head=4,
                                                          n_heads=2, d_vocab=5, act_fn="relu", seed=0)).eval()
    toks = torch.randint(0, 5, (3, 4), generator=torch.Generator().manual_seed(0))
    hook = "blocks.0.hook_resid_mid"
    with torch.no_grad():
        base = model(toks)
        with ablate(model, hook, Core(torch.eye(8), torch.zeros(8)), "remove", pos=1):
            out = model(toks)
    assert torch.allclose(out[:, 0], base[:, 0]) and not torch.allclose(out[:, 1], base[:, 1])
    with pytest.raises(ValueError, match="close names"):
        with ablate(model, "blocks.0.hook_resid_md", Core(torch.eye(8), torch.zeros(8))):
            pass


def test_baselines_are_orthonormal_cores():
    g = torch.Generator().manual_seed(0)
    acts = torch.randn(500, 6, generator=g, dtype=F64) * torch.arange(1, 7, dtype=F64)
    labels = (acts[:, 0] > 0).long() + (acts[:, 1] > 0).long()
    for c in [random_core(6, 3, acts.mean(0)), pca_core(acts, 3), class_means_core(acts, labels),
              probe_core(acts, labels, 2)]:
        assert isinstance(c, Core)
        assert torch.allclose(c.basis.T @ c.basis, torch.eye(c.k, dtype=F64), atol=1e-10)
    assert pca_core(acts, 1).basis[:, 0].abs().argmax() == 5          # largest variance
    assert class_means_core(acts, labels).k == 2                       # 3 classes → 2 directions
    with pytest.raises(ValueError):
        pca_core(acts, 7)
    with pytest.raises(ValueError):
        class_means_core(acts, labels[:-1])
