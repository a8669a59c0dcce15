"""ablate, beyond the notebook's own checks (nbs/11_ablate.ipynb, run by nbval): scores of a lower-is-better
metric, positions and hook-name errors in a TransformerLens model, baselines on three classes."""
import math

import pytest
import torch

from coreinv.ablate import ablate, class_means_core, necessity, pca_core, probe_core, random_core, sufficiency
from coreinv.base import Core

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


def _three_class_sweep_inputs():
    g = torch.Generator().manual_seed(0)
    acts = torch.randn(600, 6, generator=g, dtype=torch.float64)
    labels = torch.arange(600) % 3
    acts[:, :2] += torch.tensor([[0., 0.], [3., 0.], [0., 3.]], dtype=torch.float64)[labels]
    intact, chance = 1.0, 0.0
    def evaluate(core, mode):                  # a fake metric: the share of the class plane the core spans
        plane = core.basis[:2].pow(2).sum().item() / 2
        return plane if mode == "keep" else 1 - plane
    return acts, labels, evaluate, intact, chance


@pytest.mark.parametrize("search", ["sweep", "bisect"])
def test_core_dims_skips_k_beyond_a_baselines_span(search):
    from coreinv.ablate import class_means_core, core_dims
    acts, labels, evaluate, intact, chance = _three_class_sweep_inputs()
    r = core_dims(evaluate, lambda k: class_means_core(acts, labels, k), [1, 2, 3, 4], intact, chance,
                  search=search, progress=False)
    assert set(r.skipped) == {3, 4} and "span only 2 dimensions" in r.skipped[3]
    assert r.k_sufficient == 2 and r.k_necessary == 2
    assert math.isnan(r.keep[2]) and math.isnan(r.sufficiency[3]) and r.ks == [1, 2, 3, 4]
    assert "| 3 | skipped: k=3 but the vectors span only 2 dimensions" in r.table()
    with pytest.raises(ValueError, match=r"^core_dims: no k in \[3, 4\] gives a core"):
        core_dims(evaluate, lambda k: class_means_core(acts, labels, k), [3, 4], intact, chance, progress=False)


def test_core_dims_probe_baseline_skips_too():
    from coreinv.ablate import core_dims, probe_core
    acts, labels, evaluate, intact, chance = _three_class_sweep_inputs()
    r = core_dims(evaluate, lambda k: probe_core(acts, acts[:, 0], k), [1, 2], intact, chance, progress=False)
    assert set(r.skipped) == {2} and r.k_sufficient is None


def test_core_dims_progress_bar(capsys):
    from coreinv.ablate import core_dims, pca_core
    acts, labels, evaluate, intact, chance = _three_class_sweep_inputs()
    core_dims(evaluate, lambda k: pca_core(acts, k), [1, 2, 3], intact, chance)
    err = capsys.readouterr().err
    assert "core_dims: 100%" in err and "6/6" in err
    core_dims(evaluate, lambda k: pca_core(acts, k), [1, 2, 3], intact, chance, progress=False)
    assert capsys.readouterr().err == ""


def test_ablate_start_positions_are_bounds_checked():
    "A start ≥ T would ablate nothing and a negative one everything: both are errors naming the value."
    net = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Linear(4, 3))
    core = Core(torch.eye(4, dtype=torch.float64)[:, :2], torch.zeros(4, dtype=torch.float64))
    x = torch.randn(3, 5, 4)
    for bad, val in ((torch.tensor([0, 5, 1]), "5"), (torch.tensor([0, -1, 1]), "-1")):
        with pytest.raises(ValueError, match=rf"start position {val} is outside 0 ≤ start < 5"):
            with ablate(net, "0", core, "remove", pos=bad), torch.no_grad():
                net(x)
    with ablate(net, "0", core, "remove", pos=torch.tensor([0, 4, 2])), torch.no_grad():   # the edges are fine
        net(x)
