"""A researcher's study on the packaged SmolLM2-135M: prompts of different lengths in one batch (which
`to_tokens` pads on the right) give the same answers as one prompt at a time; `core_dims` refuses or flags
scores it could not have measured; an unknown hook, an empty batch and a readout that mixes repeated prompts
are refused by name."""
import math
import warnings

import pytest
import torch

from coreinv import ACE, core_dims, hook_evaluator, mean_core, prompt_lengths, random_core, split_by_length
from coreinv.ablate import CoreDims, ablate
from coreinv.calibration import collect_triples
from coreinv.hooks import record_activation
from coreinv.pretrained import pretrained

HOOK = "blocks.20.hook_resid_post"
CAPITALS = {"France": " Paris", "Japan": " Tokyo", "the United Kingdom": " London", "Italy": " Rome",
            "Egypt": " Cairo", "the Czech Republic": " Prague"}


@pytest.fixture(scope="module")
def study():
    "(model, padded tokens [6, T], each prompt alone [1, T_i], the answers' ids [6])"
    torch.manual_seed(0)
    model = pretrained("smollm2-135m", device="cpu")
    prompts = [f"The capital of {c} is" for c in CAPITALS]
    answers = torch.tensor([model.to_single_token(a) for a in CAPITALS.values()])
    toks = model.to_tokens(prompts)                                           # right-padded
    alone = [model.to_tokens(p) for p in prompts]
    assert len({t.shape[1] for t in alone}) > 1                                 # lengths differ: a padded batch
    return model, toks, alone, answers


def answer_logprob(answers):
    "Per-prompt log-probability of the right capital at the last position (a two-argument metric)."
    def metric(logits, tokens):
        lp = logits[:, -1].log_softmax(-1)                                     # [batch, d_vocab]
        return lp[torch.arange(len(lp)), answers]                                # [batch]
    return metric


def test_padding_is_detected(study):
    model, toks, alone, _ = study
    n = prompt_lengths(model, toks)
    assert n.tolist() == [t.shape[1] for t in alone]
    groups = split_by_length(model, toks)
    for rows, t in groups:
        for r, row in zip(rows.tolist(), t):
            assert torch.equal(row, alone[r][0])


def test_hook_evaluator_batched_equals_one_at_a_time(study):
    model, toks, alone, answers = study
    batched = hook_evaluator(model, HOOK, toks, answer_logprob(answers), pos=-1)
    one = [hook_evaluator(model, HOOK, t, lambda l, x, a=a: l[:, -1].log_softmax(-1)[:, a], pos=-1)
           for t, a in zip(alone, answers)]
    intact = batched(None)
    assert intact > -3                                                          # the model knows the capitals
    assert intact == pytest.approx(sum(e(None) for e in one) / len(one), abs=1e-4)
    core = random_core(model.cfg.d_model, 8, torch.zeros(model.cfg.d_model), seed=0)
    for mode in ("keep", "remove"):
        want = sum(e(core, mode) for e in one) / len(one)
        assert batched(core, mode) == pytest.approx(want, abs=1e-4), mode
    # the old behaviour, for the record: reading position -1 of the padded batch is far off
    with torch.no_grad():
        naive = float(model(toks)[:, -1].log_softmax(-1)[torch.arange(len(answers)), answers].mean())
    assert naive < intact - 1


def test_metric_reading_padding_is_refused(study):
    model, toks, _, _ = study
    whole = hook_evaluator(model, HOOK, toks, lambda logits: logits.log_softmax(-1).max(-1).values.mean())
    with pytest.raises(ValueError, match="NaN on padded prompts"):
        whole(None)


def test_fit_hook_batched_equals_one_at_a_time(study):
    model, toks, alone, answers = study
    ids = torch.cat([answers, torch.arange(100, 106)])                         # 12 outputs: more than any length
    readout = lambda logits: logits[:, -1][:, ids].log_softmax(-1)            # [batch, 12]
    batched = ACE(n_components=4).fit_hook(model, toks, HOOK, readout, pos=-1, progress=False)
    listed = ACE(n_components=4).fit_hook(model, alone, HOOK, readout, pos=-1, progress=False)
    assert batched.n_samples_ == listed.n_samples_ == len(alone)
    assert torch.allclose(batched.mean_, listed.mean_, atol=1e-4)
    assert torch.allclose(batched.singular_values_, listed.singular_values_, rtol=1e-3)
    P = lambda a: a.basis_ @ a.basis_.T
    assert float((P(batched) - P(listed)).norm()) < 1e-3


def test_ablate_refuses_a_position_on_padding(study):
    model, toks, alone, _ = study
    core = mean_core(torch.zeros(model.cfg.d_model))
    with pytest.raises(ValueError, match="different lengths"):
        with ablate(model, HOOK, core, "keep", pos=-1):
            model(toks)
    with ablate(model, HOOK, core, "keep", pos=-1):                            # one prompt: nothing to refuse
        model(alone[0])


def test_collect_triples_refuses_padding(study):
    model, toks, _, _ = study
    with pytest.raises(ValueError, match="padded"):
        collect_triples(model, toks, layers=[0], positions=[-1])


def test_core_dims_refuses_intact_within_noise(study):
    """At the first position every prompt has the same token (the document start), so replacing it by the
    mean over prompts changes nothing: intact and chance are one number, and no core can be measured."""
    model, toks, alone, answers = study
    hook = "blocks.5.hook_resid_post"
    evaluate = hook_evaluator(model, hook, toks, answer_logprob(answers), pos=0)
    first = record_activation(model, hook, toks, pos=0)[0].mean(0)            # [d_model]: the start token's
    chance = evaluate(mean_core(first), "keep")
    intact = evaluate(None)
    assert evaluate.per_prompt and evaluate.noise() > 0
    with pytest.raises(ValueError, match="within the metric's noise|equals chance"):
        core_dims(evaluate, lambda k: random_core(len(first), k, first), [1, 2, 4], intact, chance,
                  progress=False)


def test_core_dims_flags_scores_beyond_intact():
    "A core that does 'better than intact' by many gaps is no core: flagged, warned, and bounded refuses."
    d = 6
    cores = lambda k: random_core(d, k, torch.zeros(d, dtype=torch.float64), seed=k)
    evaluate = lambda core, mode: 1.0 if mode == "keep" else -0.5          # intact 0.1, chance 0.0
    with pytest.warns(RuntimeWarning, match="measure no core"):
        dims = core_dims(evaluate, cores, [1, 2], intact=0.1, chance=0.0, progress=False)
    assert not dims.reliable and "sufficiency reaches" in dims.problems[0]
    with pytest.raises(ValueError, match="measure no core"):
        dims.bounded("k_sufficient")
    assert dims.table().startswith("**Not a core:**")
    # with the noise known, a score just past 1 is within it and counts
    close = lambda core, mode: 0.1002 if mode == "keep" else 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ok = core_dims(close, cores, [1, 2], intact=0.1, chance=0.0, noise=0.001, progress=False)
    assert ok.reliable and ok.k_sufficient == 1


def test_table_says_what_it_measured():
    cores = lambda k: random_core(4, k, torch.zeros(4, dtype=torch.float64), seed=k)
    ev = lambda core, mode: {1: 0.5, 2: 0.95, 3: 1.0}[core.k] if mode == "keep" else 0.0
    dims = core_dims(ev, cores, [1, 2, 3], intact=1.0, chance=0.0, progress=False)
    ctrl = core_dims(lambda core, mode: 0.1 if mode == "keep" else 0.9, cores, [1, 2, 3], 1.0, 0.0, progress=False)
    text = dims.table(control=ctrl)
    first = text.splitlines()[0]
    for part in ("intact 1", "chance 0", "score ≥ 0.9", "k sufficient: 2", "k necessary: 1", "control: none up to 3"):
        assert part in first, (part, first)
    assert "control sufficiency" in text and math.isnan(CoreDims(None, None, [], [], []).intact)


def test_unknown_hook_is_refused_when_built(study):
    model, toks, _, answers = study
    with pytest.raises(ValueError, match="unknown hook 'blocks.20.nope'"):
        hook_evaluator(model, "blocks.20.nope", toks, answer_logprob(answers))


def test_empty_batch_is_named(study):
    model, toks, _, answers = study
    with pytest.raises(ValueError, match="empty"):
        hook_evaluator(model, HOOK, toks[:0], answer_logprob(answers))
    with pytest.raises(ValueError, match="empty"):
        ACE().fit_hook(model, toks[:0], HOOK, lambda l: l[:, -1, :4], pos=-1, progress=False)


def test_readout_mixing_repeated_prompts_is_refused(study):
    model, _, alone, _ = study
    same = alone[0].repeat(4, 1)                                             # one prompt four times
    mixing = lambda l: l[:, -1, :12] - l[:, -1, :12].mean(0)
    with pytest.raises(ValueError, match="mixes samples"):
        ACE().fit_hook(model, same, HOOK, mixing, pos=-1, progress=False)
