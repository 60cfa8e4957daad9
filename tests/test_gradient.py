"""The gradient benchmark: score sketches against exact per-sample gradients, the target's
noise correction, the variance ratio's closed-form scale and interval, and the table that
`evaluate` writes on a dataset with sketches (simulated here: tests/sketch_data.py)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from sketch_data import sketch_dataset

from basis_bench.evaluation.gradient import Target, _ratio_ci, closed_form_scale


def _tiny_model(tied: bool = False):  # type: ignore[no-untyped-def]
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=40, hidden_size=12, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tied,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg).eval()


def _exact_scores(model, prompts, responses, of, temperature, every=False):  # type: ignore[no-untyped-def]
    """d log pi(y | x) / d lm_head.weight (``every``: / d of every parameter, concatenated)
    by autograd, one response at a time."""
    import torch

    out = []
    for i, resp in enumerate(responses):
        model.zero_grad()
        seq = torch.tensor([prompts[of[i]] + list(resp)])
        logits = model(seq).logits[0] / temperature
        n, length = len(resp), seq.shape[1]
        logp = torch.log_softmax(logits[length - n - 1 : length - 1], -1)
        logp[torch.arange(n), torch.tensor(resp)].sum().backward()
        params = list(model.parameters()) if every else [model.lm_head.weight]
        out.append(np.concatenate([p.grad.detach().double().numpy().ravel() for p in params]))
    return np.stack(out)


def test_sketch_inner_products_are_unbiased_for_the_exact_scores() -> None:
    """Averaged over projection seeds, <s_i, s_j> -> <S_i, S_j>_F (torch autograd's
    per-sample gradients of the output layer), within Monte Carlo error."""
    from basis_bench.rollouts.score_sketch import ScoreProjection, score_sketches

    model = _tiny_model()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    responses = [np.array([9, 10, 11]), np.array([12]), np.array([13, 14, 15, 16, 2])]
    of = [0, 0, 1]
    exact = _exact_scores(model, prompts, responses, of, 0.7)
    gram = exact @ exact.T
    draws = []
    for seed in range(400):
        proj = ScoreProjection.make(32, seed, 40, 12)
        s = score_sketches(model, prompts, responses, of, 0.7, proj).astype(np.float64)
        draws.append((s @ s.T).ravel())
    draws_arr = np.asarray(draws)
    se = draws_arr.std(axis=0, ddof=1) / np.sqrt(len(draws_arr))
    z = (draws_arr.mean(axis=0) - gram.ravel()) / se
    assert np.all(np.abs(z) < 4.5), z
    # and the sketch is not trivially right: one projection is off by more than its error
    assert np.abs(draws_arr[0] - gram.ravel()).max() > 1e-3 * np.abs(gram).max()


def test_sketch_on_a_shared_prompt_cache_equals_the_full_pass() -> None:
    """A prompt's responses share its KV cache (right-padded together): each sketch equals
    the one of a full forward pass of that prompt and response alone, tied weights too."""
    from basis_bench.rollouts.score_sketch import ScoreProjection, score_sketches

    model = _tiny_model(tied=True)
    prompts = [[1, 2, 3], [4, 5]]
    responses = [np.array([9, 10, 11]), np.array([12]), np.array([13, 14, 15, 16])]
    proj = ScoreProjection.make(16, 3, 40, 12)
    together = score_sketches(model, prompts, responses, [0, 1, 1], 1.3, proj)
    for i, (resp, p) in enumerate(zip(responses, [0, 1, 1], strict=True)):
        alone = score_sketches(model, [prompts[p]], [resp], [0], 1.3, proj)
        np.testing.assert_allclose(together[i], alone[0], rtol=1e-4, atol=1e-4)


def test_target_is_unbiased_where_the_plain_estimate_is_not() -> None:
    """Over independent datasets with a known G*: the split-half ||G*||^2 and the spread of
    the per-prompt g_p are unbiased; the plain ||G*_hat||^2 is biased up by its noise."""
    rng = np.random.default_rng(1)
    p, n, k = 12, 10, 6
    v = rng.uniform(0.1, 0.9, p)
    a = rng.normal(size=(p, k))
    g_p = (v * (1 - v))[:, None] * a
    g_true = g_p.mean(axis=0)
    sigma2 = ((g_p - g_true) ** 2).sum() / (p - 1)
    norm2, plain, spread = [], [], []
    for _ in range(3000):
        r = (rng.uniform(size=(p, n)) < v[:, None]).astype(float)
        s = (r - v[:, None])[..., None] * a[:, None, :] + rng.normal(size=(p, n, k))
        t = Target.build(r, s, np.ones((1, p, n), dtype=bool))
        norm2.append(t.norm2()[0])
        plain.append((t.mean[0] ** 2).sum())
        spread.append(t.prompt_variance(1))  # one prompt a step: the spread itself
    se = np.std(norm2, ddof=1) / np.sqrt(len(norm2))
    assert abs(np.mean(norm2) - (g_true**2).sum()) < 4 * se
    assert np.mean(plain) - (g_true**2).sum() > 6 * se
    se_spread = np.std(spread, ddof=1) / np.sqrt(len(spread))
    assert abs(np.mean(spread) - sigma2) < 4 * se_spread


def test_grpo_scale_is_rloo_exactly() -> None:
    """r - mean_G = ((G - 1) / G)(r - mean_-i): GRPO's scale factor undoes it to the digit."""
    rng = np.random.default_rng(2)
    r = rng.integers(0, 2, size=(50, 8)).astype(float)
    grpo = r - r.mean(axis=1, keepdims=True)
    rloo = r - (r.sum(axis=1, keepdims=True) - r) / 7
    np.testing.assert_allclose(grpo * closed_form_scale("grpo", 8), rloo, atol=1e-12)
    assert closed_form_scale("rloo", 8) == 1.0 == closed_form_scale("grpo", 1)


def test_ratio_interval_covers_the_true_ratio() -> None:
    """The delta-method interval on paired rows covers mean(a) / mean(b) about 95% of the time."""
    rng = np.random.default_rng(3)
    hits = 0
    trials = 1000
    for _ in range(trials):
        x = rng.exponential(size=200)
        a = 2.0 * x + rng.exponential(size=200)  # mean 3
        b = x + 0.5 * rng.exponential(size=200)  # mean 1.5: true ratio 2
        _, lo, hi = _ratio_ci(a, b)
        hits += lo <= 2.0 <= hi
    assert 0.93 <= hits / trials <= 0.97


@pytest.fixture(scope="module")
def gradient_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[pl.DataFrame, dict]:
    from basis_bench.api import evaluate

    root = tmp_path_factory.mktemp("sketches")
    truth = sketch_dataset(root / "data", prompts=24, samples=16, k=8)
    result = evaluate(
        root / "data", out=None, estimators=["basis", "grpo", "rloo", "vanilla"], ref_n=16,
        gradient_budgets="16,48", repeats=200, write_estimates=False,
    )  # fmt: skip
    assert result.gradient is not None
    return result.gradient, truth


def test_gradient_table_columns_and_budgets(gradient_run: tuple[pl.DataFrame, dict]) -> None:
    table, _ = gradient_run
    for col in ("estimator", "rollouts_per_step", "variance_ratio_rloo8", "ci_low", "ci_high",
                "relative_error", "cosine", "var_prompt", "var_baseline"):  # fmt: skip
        assert col in table.columns
    assert sorted(table["rollouts_per_step"].unique().to_list()) == [16, 48]
    grpo = table.filter(pl.col("estimator") == "grpo")["variance_ratio_rloo8"].to_numpy()
    np.testing.assert_allclose(grpo, 1.0, rtol=1e-9)  # same draws, scale taken out


def test_oracle_baseline_beats_no_baseline(gradient_run: tuple[pl.DataFrame, dict]) -> None:
    """b = v removes the r v part of r s that b = 0 keeps: less variance, not by chance."""
    table, _ = gradient_run
    whole = table.filter((pl.col("checkpoint") == "all") & (pl.col("rollouts_per_prompt") == 1))
    by = {
        r["estimator"]: r
        for r in whole.filter(pl.col("rollouts_per_step") == 48).iter_rows(named=True)
    }
    assert by["oracle_baseline"]["ci_high"] < by["vanilla"]["ci_low"]
    # RLOO's leave-one-out mean errs by sigma^2 / (G - 1): b = v at G = 8 has less variance
    rows8 = table.filter(
        (pl.col("checkpoint") == "all") & (pl.col("estimator") == "oracle_baseline")
        & (pl.col("rollouts_per_prompt") == 8)
    )  # fmt: skip
    assert (rows8["ci_high"] < 1).all()
    # a whole pass over the prompts each step leaves no prompt-sampling variance
    assert by["vanilla"]["var_prompt"] == 0.0


def test_target_matches_the_simulated_truth(gradient_run: tuple[pl.DataFrame, dict]) -> None:
    """The replay's noise-corrected ||G*||^2 per checkpoint lies within 4 of its standard
    errors of the simulation's known value."""
    table, truth = gradient_run
    rows = table.filter(
        (pl.col("estimator") == "rloo") & (pl.col("rollouts_per_step") == 16)
        & (pl.col("checkpoint") != "all")
    )  # fmt: skip
    for row in rows.iter_rows(named=True):
        want = float((truth[row["checkpoint"]] ** 2).sum())
        assert abs(row["grad_norm2"] - want) < 4 * row["grad_norm2_se"] + 1e-12


def test_direction_from_independent_folds_is_unbiased_and_covered() -> None:
    """_direction: cos(E G_hat, E G_ref) from repeats whose two folds are independent. A
    fold's own noise (its samples), shared by the two arms, biases the plain cosine of the
    pooled means towards 1; the cross-fold one stays on the truth. Under repeat noise alone
    its jackknife interval covers the truth about 95% of the time."""
    from basis_bench.evaluation.gradient import _direction

    rng = np.random.default_rng(0)
    mu_r = rng.normal(size=16)
    mu_a = mu_r + 0.6 * rng.normal(size=16)
    truth = mu_a @ mu_r / np.sqrt((mu_a @ mu_a) * (mu_r @ mu_r))
    fold = np.arange(200) % 2
    got, naive, hits = [], [], 0
    for trial in range(600):
        pooled = trial % 2 == 0  # a fold's own noise (its samples), shared by both arms
        shared = 2.0 * rng.normal(size=(200, 16))
        if pooled:
            shared = rng.normal(size=(2, 16))[fold] + 0.1 * shared
        arm = {"est": mu_a + shared + 0.5 * rng.normal(size=(200, 16))}
        ref = {"est": mu_r + shared + 0.5 * rng.normal(size=(200, 16))}
        cos, lo, hi = _direction([arm], [ref], fold)
        if pooled:
            a, r = arm["est"].mean(axis=0), ref["est"].mean(axis=0)
            got.append(cos)
            naive.append(a @ r / np.sqrt((a @ a) * (r @ r)))
        else:  # repeat noise only: what the jackknife's interval is for
            hits += lo <= truth <= hi
    assert np.isnan(got).mean() < 0.05  # a negative ||E G||^2 estimate: no cosine
    assert abs(np.nanmedian(got) - truth) < 0.02, (np.nanmedian(got), truth)
    assert np.mean(naive) - truth > 0.01, (np.mean(naive), truth)
    assert 0.9 <= hits / 300 <= 0.99, hits


def test_group_std_arm_is_measured_against_grpo(gradient_run: tuple[pl.DataFrame, dict]) -> None:
    """Only the normalised arm gets a direction, a cosine near but not above 1 up to its
    interval; its scale is measured (std < 1 for 0/1 rewards: the step is larger)."""
    table, _ = gradient_run
    std = table.filter((pl.col("estimator") == "grpo_std") & (pl.col("checkpoint") == "all"))
    assert std.height == 2  # one row per budget
    assert (std["direction_ci_low"] <= 1).all() and (std["direction_cosine"] > 0.9).all()
    assert (1 / std["scale"] > 1).all()
    assert table.filter(pl.col("estimator") != "grpo_std")["direction_cosine"].is_nan().all()


def test_fig_gradient_draws_one_line_per_arm_against_r(
    gradient_run: tuple[pl.DataFrame, dict],
) -> None:
    """fig_gradient: one line per (arm, G) over the budgets, the RLOO(8) level marked."""
    import matplotlib.pyplot as plt

    from basis_bench.evaluation.gradient_figure import fig_gradient

    table, _ = gradient_run
    fig = fig_gradient(table)
    (ax,) = fig.axes
    arms = table.filter(pl.col("checkpoint") == "all").select("estimator", "rollouts_per_prompt")
    assert len(ax.get_legend().get_texts()) == arms.unique().height
    assert len(ax.containers) == arms.unique().height  # one errorbar line per arm
    assert any(set(line.get_ydata()) == {1.0} for line in ax.get_lines())  # RLOO(8) itself
    plt.close(fig)


@pytest.mark.parametrize("tied", [False, True])
def test_full_model_sketch_is_unbiased_for_every_parameters_score(tied: bool) -> None:
    """Averaged over seeds, <s_i, s_j> of the full-model sketch -> the inner products of
    autograd's per-sample gradients over all parameters (norm scales and a tied embedding
    included), which are larger than the output layer's alone."""
    from basis_bench.rollouts.model_sketch import model_score_sketches

    model = _tiny_model(tied=tied)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    responses = [np.array([9, 10, 11]), np.array([12]), np.array([13, 14, 15, 16, 2])]
    of = [0, 0, 1]
    exact = _exact_scores(model, prompts, responses, of, 0.7, every=True)
    gram = exact @ exact.T
    draws = []
    for seed in range(300):
        s = model_score_sketches(model, prompts, responses, of, 0.7, 32, seed).astype(np.float64)
        draws.append((s @ s.T).ravel())
    draws_arr = np.asarray(draws)
    se = draws_arr.std(axis=0, ddof=1) / np.sqrt(len(draws_arr))
    z = (draws_arr.mean(axis=0) - gram.ravel()) / se
    assert np.all(np.abs(z) < 4.5), z
    if not tied:  # the output layer is a strict part, sketched with the same pair
        head = _exact_scores(model, prompts, responses, of, 0.7)
        assert np.trace(gram) > 1.2 * np.trace(head @ head.T)
