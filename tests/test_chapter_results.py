"""Each chapter's run at the `ci` preset: its results file holds every claim the chapter reports, each
measured value is a finite number, and each `passed` is what the measured values and the preset's
thresholds (the results file's `config`) give.

The run is nbval's, cell by cell, in the same `make test` session (`nbval_chapter`, root conftest.py):
these tests run after it and read what it wrote, so no chapter is executed twice. When the session
did not collect the chapter's notebook (`pytest tests/test_chapter_results.py`), the chapter is
executed here, once, into a temporary copy.

nbval only checks that a chapter runs; this reads what it concluded. To add a chapter, add its
claim rules to RULES: one function per claim id, (measured, config) -> bool, written independently
of the chapter's own code. The chapter's outputs must also be free of tool warnings, machine paths
and tracebacks (`helpers.forbidden_hit`)."""
import json
import math
import os
import shutil
import sys

import nbformat
import pytest

from helpers import REPO, forbidden_hit, run

RULES = {
    "markov": {
        "markov.near_optimal": lambda m, S: m["max_kl"] <= S["thr_kl"],
        "markov.core_dim": lambda m, S: (m["max_keep3_minus_intact"] <= S["thr_suff"]
                                         and m["min_keep2_minus_intact"] > S["thr_suff"]
                                         and m["min_random3_minus_intact"] > S["thr_suff"]),
        "markov.necessary": lambda m, S: (m["min_remove3_over_chance"] >= S["thr_necessary"]
                                          and m["max_remove1_over_chance"] < S["thr_necessary"]
                                          and m["max_random3_over_chance"] < S["thr_necessary"]),
        "markov.eig_error": lambda m, S: m["max_error"] <= S["thr_eig"],
        # issue 61: the means over seed pairs and the merge gap (aligned − naive) are judged by their 95% intervals
        # (lo, hi): a claim holds when its whole interval satisfies the rule
        "markov.cca": lambda m, S: m["lo"] >= S["thr_cca"],
        "markov.overlap": lambda m, S: (
            m["hi"] <= S["thr_overlap_factor"] * 3 / S["d_model"]
            and m["control_same_model_min"] > S["thr_overlap_factor"] * 3 / S["d_model"]),
        "markov.weights_cos": lambda m, S: -0.1 <= m["lo"] and m["hi"] <= 0.1,
        "markov.merge": lambda m, S: m["hi"] < 0,
        "markov.layernorm": lambda m, S: m["max_kl"] <= S["thr_kl"] and m["max_eig_error"] <= S["thr_eig"],
    },
    # issue 42: each per-seed check is judged on the seeds as a population: holds when the Wilson 95% interval of
    # the share of seeds that pass starts at >= 1/2 (_wilson, written here apart from coreinv.results.share_verdict);
    # groks is the setup's precondition, on every seed
    "grokking": {
        "grokking.groks": lambda m, S: min(m["tau_grok"]) > 0 and min(m["delay_ratio"]) >= S["thr_delay"],
        "grokking.stays_grokked": lambda m, S: _most([a >= S["thr_stay"] and f >= S["thr_final"]
                                                      for a, f in zip(m["min_test_acc_after"], m["final_test_acc"])]),
        "grokking.crystallises": lambda m, S: _most([
            st == 1 and a <= S["thr_crystal"] * b and n <= S["thr_nec_over_suff"] * a and not censored
            for st, b, a, n, censored in zip(m["at_is_grokked"], m["suff_k_before"], m["suff_k_at"], m["nec_k_at"],
                                             m["nec_k_at_is_lower_bound"])]),
        "grokking.unit_circle": lambda m, S: _most([
            st == 1 and a <= S["thr_unit"] and a <= S["thr_unit_ratio"] * b
            for st, a, b in zip(m["after_is_grokked"], m["after"], m["before"])]),
        "grokking.snap_at_grokking": lambda m, S: _most([sn == 1 and x <= S["thr_snap"]
                                                         for sn, x in zip(m["snapped"], m["snap_over_tau_grok"])]),
        "grokking.frequencies": lambda m, S: (
            abs(m["tol_rad"] - S["thr_freq_tol"] * 2 * math.pi / S["p"]) < 1e-12
            and _most([k >= 1 and pl >= 1 and max(ce, re) <= m["tol_rad"] for k, pl, ce, re in zip(
                m["n_key_freqs"], m["n_planes"], m["coverage_err_rad"], m["rotation_err_rad"])])),
        # judged over the seeds whose stable "after" is >= thr_wd_window x tau_grok in weight-decay time
        "grokking.inflation": lambda m, S: _most([
            ne >= S["thr_inflate"] * na and abs(se - sa) <= S["thr_suff_flat"] * sa
            for st, w, na, ne, sa, se in zip(m["after_is_grokked"], m["wd_after_over_wd_tau"], m["nec_k_at"],
                                             m["nec_k_after"], m["suff_k_at"], m["suff_k_after"])
            if st == 1 and w >= S["thr_wd_window"]]),
        "grokking.alpha": lambda m, S: m["ci95"][0] <= 1 <= m["ci95"][1] and (m["ci95"][0] > 0 or m["ci95"][1] < 0),
        "grokking.beta": lambda m, S: m["ci95"][0] <= 1 <= m["ci95"][1] and (m["ci95"][0] > 0 or m["ci95"][1] < 0),
    },
    "sae_gap": {
        "sae.model_ok": lambda m, S: (m["update_max_rel_dev"] <= S["thr_update"]
                                      and m["lm_loss"] <= S["thr_model"] * m["trigram_loss"]),
        # issue 25: span residuals on test rows; the SAE against the spectral dictionary on its own latents,
        # random directions, and (added after the first book run) the sparse ReLU null
        "sae.gap": lambda m, S: all(
            min(v["sae_variance"], v["sae_frequency"]) >= S["thr_gap"] * max(v["spectral_same_base"], v["random"])
            and min(v["sae_variance"], v["sae_frequency"]) > max(v["null_variance"], v["null_frequency"])
            for v in m["rows"].values()) and len(m["rows"]) == 2 * len(S["rs"]),
        "sae.selection_rule": lambda m, S: (
            __import__("statistics").median(list(m["ratios"].values())) >= S["thr_rule"]),
        "sae.seed_features": lambda m, S: m["max"] < S["thr_share"],
        # identifiability across dictionary seeds, each ratio (cross-seed distance / split-half floor) judged on its
        # 95% range over other random halves of the rows: holds when both ranges clear their thresholds; basis
        # invariance of one dictionary holds by construction (Psi.T gives T^-1 A T), so the chapter asserts it
        "sae.seed_spectra": lambda m, S: (m["sae"]["ratio_ci"][0] > 1
                                          and m["spectral"]["ratio_ci"][1] <= S["thr_spectra"]),
        # k by the gap rule per layer; every layer with a k covers -1/2; no layer with a k: not testable
        # (recorded with testable=False and passed=False, which this rule returns)
        "sae.rate": lambda m, S: (any(v["k"] for v in m["layers"].values())
                                  and all(v["ci"][0] <= -0.5 <= v["ci"][1]
                                          for v in m["layers"].values() if v["k"])),
        # the angle on its 95% bootstrap interval
        "sae.nonnormal": lambda m, S: (m["henrici"] > S["thr_noise"] * m["noise"]
                                       and m["angle_ci"][0] > S["thr_angle"]),
        # rank-matched removals, never scaled above 1 (per_unit_removed is reported, not judged); each difference
        # on its 95% bootstrap interval over the prompts: holds when every interval lies above 0
        "sae.interventions": lambda m, S: (
            m["intervals"]["modes − random"][min(m["gap"], key=int)][0] > 0
            and m["intervals"]["PCs − modes"][min(m["gap"], key=int)][0] > 0
            and m["intervals"]["gap near − far"][0] > 0),
        # scored on every one of >= 2 SAE seeds (each seed's own unpenalised SAE and spectral target); each
        # seed must have a gap to close and the chosen lambda must close >= thr_closed of it
        "sae.penalty": lambda m, S: (len(m["seeds"]) >= max(2, S["n_penalty_seeds"]) and all(
            v["gap_before"] > 0 and v["share_closed"] >= S["thr_closed"] for v in m["seeds"].values())),
    },
    "agreement": {
        "agreement.learned": lambda m, S: (min(m["simple"].values()) >= S["thr_learned"]
                                           and m["untrained"] < S["thr_learned"]),
        "agreement.one_dim": lambda m, S: max(m["ratio"].values()) <= S["thr_one_dim"],
        # issue 24: keep/remove act from the subject on; margins are signed and retained (1 = kept, 0 = gone)
        # the model's part from its 95% bootstrap intervals over pairs (accuracy share, retained margin; necessity:
        # one of the two at chance suffices); the random direction's verdict must be "fails" (its control)
        "agreement.sufficient": lambda m, S: (
            all(m["acc_interval"][n][0] >= S["thr_sufficient"] and m["margin_interval"][n][0] >= S["thr_keep_margin"]
                for n in m["acc"])
            and all(v == "fails" for v in m["random_verdict"].values())),
        "agreement.necessary": lambda m, S: (
            all(m["acc_interval"][n][1] <= S["thr_necessary"] or m["margin_interval"][n][1] <= S["thr_margin"]
                for n in m["k"])
            and all(v == "fails" for v in m["random_verdict"].values())),
        "agreement.flip": lambda m, S: (
            all(m["ace"][k] >= S["thr_flip"] * m["ceiling"][k] for k in m["ace"])
            and all(m["random"][k] < S["thr_flip"] * m["ceiling"][k] for k in m["ace"])),
        "agreement.spearman": lambda m, S: (m["interval"][0] >= S["thr_spearman"]
                                            and m["excess_interval"][0] >= S["thr_spearman_excess"]),
        # issue 24 review: the earliest layer (the last hook, read by the unembedding, left out) whose removal leaves
        # ≤ thr_margin of the margin; upper_half holds only the models whose candidates span both halves (≥ 4
        # layers); with none, the claim is not testable and is stored as not passed
        "agreement.late": lambda m, S: (bool(m["upper_half"])
                                        and sum(m["upper_half"].values()) / len(m["upper_half"]) > 0.5
                                        and all(c < n - 1 for c, n in zip(m["chosen"].values(), m["n_layers"].values()))),
    },
}
# issue 41: the SAE-gap claims on a pretrained LM (sae.smollm2.*) by the same rules; its model check is the update
# equation alone (no trigram baseline for a pretrained model)
RULES["sae_gap"] |= {id.replace("sae.", "sae.smollm2."): rule for id, rule in list(RULES["sae_gap"].items())
                     if id != "sae.model_ok"}
RULES["sae_gap"]["sae.smollm2.model_ok"] = lambda m, S: m["update_max_rel_dev"] <= S["thr_update"]
# issue 40: the same seven claims on the pretrained LMs (agreement.pretrained.*), by the same rules; spearman needs
# a pair of pretrained models (at ci there is one: not testable, stored as not passed)
RULES["agreement"] |= {id.replace("agreement.", "agreement.pretrained."): rule
                       for id, rule in list(RULES["agreement"].items())}
RULES["agreement"]["agreement.pretrained.spearman"] = lambda m, S: (bool(m["pairs"])
                                                                    and RULES["agreement"]["agreement.spearman"](m, S))
# the pretrained models' accuracy on simple pairs by its Wilson interval over the pairs (the trained LMs' is the
# required precondition, read as measured: its pairs are too few for an interval to clear 0.95)
RULES["agreement"]["agreement.pretrained.learned"] = lambda m, S: (
    all(lo >= S["thr_learned"] for lo, _ in m["interval"].values()) and m["untrained"] < S["thr_learned"])


def _wilson(holds: list) -> tuple[float, float]:
    "The Wilson 95% score interval of the share of True in holds."
    n, z = len(holds), 1.959963984540054
    ph = sum(bool(h) for h in holds) / n
    mid = (ph + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(ph * (1 - ph) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return mid - half, mid + half


def _most(holds: list) -> bool:
    "A population verdict holds: the share's Wilson interval starts at >= 1/2 (False on no units)."
    return bool(holds) and _wilson(holds)[0] >= 0.5


WORDS = {"holds", "fails", "undecided", ">=", ">", "<=", "<"}   # a three-state verdict and its rule, beside its numbers


def _numbers(x):
    "Every leaf of a measured value but the verdict words (None stands for a non-finite float in a results file)."
    if isinstance(x, dict):
        return [v for item in x.values() for v in _numbers(item)]
    if isinstance(x, list):
        return [v for item in x for v in _numbers(item)]
    return [] if isinstance(x, str) and x in WORDS else [x]


@pytest.fixture(scope="module", params=sorted(RULES))
def chapter_run(request, tmp_path_factory, nbval_chapter):
    "(chapter, its ci results, the executed notebook): nbval's run of the chapter in this session, else one here."
    chapter = request.param
    run_ = nbval_chapter(chapter)
    if run_ is not None:
        path = run_.results / "ci" / f"{chapter}.json"
        assert path.is_file(), f"the {chapter} chapter's nbval run wrote no {path.name}"
        return chapter, json.loads(path.read_text()), run_.notebook
    tmp = tmp_path_factory.mktemp(chapter)
    nb_path = tmp / f"{chapter}.ipynb"
    shutil.copy(REPO / "nbs" / "chapters" / f"{chapter}.ipynb", nb_path)
    env = {"COREINV_PRESET": "ci", "COREINV_RESULTS_DIR": str(tmp / "results"),  # this checkout's coreinv
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    r = run([sys.executable, str(REPO / "tools" / "notebooks.py"), "run", str(nb_path)], env=env, timeout=2400)
    assert r.returncode == 0, r.stdout[-5000:]
    res = json.loads((tmp / "results" / "ci" / f"{chapter}.json").read_text())
    return chapter, res, nbformat.read(nb_path, as_version=4)


def test_claims_present_finite_and_recomputed(chapter_run):
    chapter, res, _ = chapter_run
    rules = RULES[chapter]
    assert res["preset"] == "ci" and res["chapter"] == chapter
    got = [c["id"] for c in res["claims"]]
    assert sorted(got) == sorted(rules), f"claims {got}, expected {sorted(rules)}"
    for c in res["claims"]:
        for v in _numbers(c["measured"]):        # numbers, or yes/no flags (e.g. CoreDims.bounded's censoring)
            assert isinstance(v, (int, float)) and math.isfinite(v), f"{c['id']}: measured {c['measured']} holds {v!r}"
        if not c.get("testable", True):            # a claim the run cannot test neither holds nor is required
            assert not c["passed"] and not c["required"], f"{c['id']}: not testable, yet passed or required"
        want = rules[c["id"]](c["measured"], res["config"])
        assert c["passed"] == want, f"{c['id']}: reported passed={c['passed']}, recomputed {want}"
        if isinstance(c["measured"], dict) and "share" in c["measured"] and not c["required"]:
            lo, hi = _wilson(c["measured"]["holds"])           # a population verdict: undecided when it straddles 1/2
            assert c["decided"] == (lo >= 0.5 or hi < 0.5), f"{c['id']}: decided={c['decided']}, interval [{lo}, {hi}]"
        assert not (c["required"] and not c["passed"]), f"required claim {c['id']} failed at ci"


def test_outputs_are_clean(chapter_run):
    _, _, nb = chapter_run
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            text = out.get("text", "") + str(out.get("data", {}).get("text/plain", ""))
            hit = forbidden_hit(text)
            assert hit is None, f"cell {cell.get('id')}: {hit!r} in its output"
