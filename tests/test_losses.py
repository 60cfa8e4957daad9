"""The policy losses and the k3 KL as mathematics: values by hand, gradients against their
closed forms, the clip, GSPO's sequence ratio, and the loss registry."""

from __future__ import annotations

import math

import pytest
from conftest import import_extra
from hypothesis import given, settings
from hypothesis import strategies as st

from basis_bench.errors import InputError

# every test here needs torch: without the [hf] extra the module is skipped, naming it
torch = import_extra("hf", "torch")

from basis_bench.train import losses  # noqa: E402  (imports torch)

# Two responses: 2 tokens and 1 token; the third column is padding (garbage on purpose).
LOGP = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, -math.inf, -math.inf]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
ADV = torch.tensor([2.0, -1.0])
FINITE = torch.nan_to_num(LOGP, nan=-3.0, neginf=-3.0)  # the same on the mask, finite padding

floats = st.floats(-5.0, 5.0, allow_nan=False, allow_infinity=False)


def test_reduce_token_and_sequence_means_ignore_padding():
    values = torch.tensor([[1.0, 3.0, float("nan")], [5.0, math.inf, 0.0]])
    assert losses.reduce(values, MASK, "token_mean").item() == pytest.approx((1 + 3 + 5) / 3)
    assert losses.reduce(values, MASK, "seq_mean").item() == pytest.approx((2 + 5) / 2)
    assert losses.reduce(values, MASK, "token_mean", denom=9.0).item() == pytest.approx(1.0)


def test_gpg_loss_is_minus_advantage_weighted_logprob():
    token = losses.gpg_loss(LOGP, ADV, MASK, "token_mean")
    assert token.item() == pytest.approx(-(2 * -1 + 2 * -2 + -1 * -0.5) / 3)
    seq = losses.gpg_loss(LOGP, ADV, MASK, "seq_mean")
    assert seq.item() == pytest.approx(-((2 * -1 + 2 * -2) / 2 + (-1 * -0.5)) / 2)


def test_gpg_gradient_is_minus_advantage_times_grad_logp():
    """d L / d logp_it = -A_i m_it / D: token_mean D = all tokens; seq_mean D = N |y_i|."""
    logp = FINITE.clone().requires_grad_(True)
    (token,) = torch.autograd.grad(losses.gpg_loss(logp, ADV, MASK, "token_mean"), logp)
    assert torch.allclose(token, -ADV[:, None] * MASK / MASK.sum())
    (seq,) = torch.autograd.grad(losses.gpg_loss(logp, ADV, MASK, "seq_mean"), logp)
    lengths = MASK.sum(-1, keepdim=True)
    assert torch.allclose(seq, -ADV[:, None] * MASK / (lengths * MASK.shape[0]))
    # Through a model: the chain rule makes it -A * grad log pi, summed over tokens.
    theta = torch.tensor([0.3, -0.7], requires_grad=True)
    logits = torch.stack([theta, theta.flip(0)])  # two "responses" of one token each
    logp_tok = torch.log_softmax(logits, -1)[:, :1]  # the sampled token is index 0
    adv = torch.tensor([1.5, -0.5])
    (g_loss,) = torch.autograd.grad(
        losses.gpg_loss(logp_tok, adv, torch.ones(2, 1), "token_mean"), theta, retain_graph=True
    )
    expected = sum(
        -adv[i] * torch.autograd.grad(logp_tok[i, 0], theta, retain_graph=True)[0] / 2
        for i in range(2)
    )
    assert torch.allclose(g_loss, expected)


def test_grpo_loss_clips_per_token_ratio():
    old = LOGP.clone()
    logp = LOGP.clone()
    logp[0, 0] += math.log(1.5)  # A > 0, ratio 1.5 -> clipped to 1.2
    logp[0, 1] += math.log(0.9)  # A > 0, ratio 0.9 -> inside the range, kept
    logp[1, 0] += math.log(0.5)  # A < 0, ratio 0.5 -> min(0.5 A, 0.8 A) = 0.8 A
    logp.requires_grad_(True)
    loss = losses.grpo_loss(logp, old, ADV, MASK, 0.2, 0.2, "token_mean")
    assert loss.item() == pytest.approx(-(1.2 * 2 + 0.9 * 2 + 0.8 * -1) / 3)
    loss.backward()
    # Clipped tokens get no gradient; the kept one gets -A * ratio / D.
    assert logp.grad[0, 0].item() == 0.0 and logp.grad[1, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(-2 * 0.9 / 3)
    assert torch.isfinite(logp.grad).all()


def test_grpo_clip_is_one_sided():
    """A ratio outside the range in the direction the advantage disfavours is not clipped:
    A > 0 at ratio 0.5 and A < 0 at ratio 1.5 keep their (unclipped) gradient."""
    old = FINITE.clone()
    logp = FINITE.clone()
    logp[0, 0] += math.log(0.5)
    logp[1, 0] += math.log(1.5)
    logp.requires_grad_(True)
    losses.grpo_loss(logp, old, ADV, MASK, 0.2, 0.2, "token_mean").backward()
    assert logp.grad[0, 0].item() == pytest.approx(-2 * 0.5 / 3)
    assert logp.grad[1, 0].item() == pytest.approx(1 * 1.5 / 3)


@settings(max_examples=30, deadline=None)
@given(st.lists(floats, min_size=6, max_size=6), st.lists(floats, min_size=2, max_size=2))
def test_ratio_losses_equal_gpg_at_ratio_one(values, advantages):
    """At rho = 1 (the first update on fresh samples) GRPO's gradient is GPG's and its value
    -reduce(A); GSPO's gradient is GPG's per-sequence one."""
    logp = torch.tensor(values).reshape(2, 3).requires_grad_(True)
    adv = torch.tensor(advantages)
    old = logp.detach()
    for agg in ("token_mean", "seq_mean"):
        pg = losses.gpg_loss(logp, adv, MASK, agg)
        ppo = losses.grpo_loss(logp, old, adv, MASK, 0.2, 0.2, agg)
        ones = losses.gpg_loss(torch.ones_like(logp), adv, MASK, agg)
        assert ppo.item() == pytest.approx(ones.item(), abs=1e-5)
        (g_pg,) = torch.autograd.grad(pg, logp)
        (g_ppo,) = torch.autograd.grad(ppo, logp)
        assert torch.allclose(g_pg * MASK, g_ppo * MASK, atol=1e-6)
    seq = losses.gpg_loss(logp, adv, MASK, "seq_mean")
    gspo = losses.gspo_loss(logp, old, adv, MASK)
    (g_seq,) = torch.autograd.grad(seq, logp)
    (g_gspo,) = torch.autograd.grad(gspo, logp)
    assert torch.allclose(g_seq * MASK, g_gspo * MASK, atol=1e-6)


def test_gspo_uses_the_geometric_mean_ratio_of_the_sequence():
    old = LOGP.detach().clone()
    logp = LOGP.detach().clone()
    logp[0, 0] += 0.3
    logp[0, 1] -= 0.1  # sequence 0: s = exp((0.3 - 0.1) / 2) = exp(0.1)
    logp[1, 0] -= 0.0002  # sequence 1: s = exp(-0.0002), inside [1 - 3e-4, 1 + 4e-4]
    s0, s1 = math.exp(0.1), math.exp(-0.0002)
    expected = -(min(s0 * 2, min(s0, 1 + 4e-4) * 2) + (s1 * -1)) / 2
    assert losses.gspo_loss(logp, old, ADV, MASK).item() == pytest.approx(expected)


def test_gspo_clips_the_whole_sequence():
    """Sequence 0's ratio exp(0.1) is clipped (A > 0): none of its tokens gets a gradient,
    though token 1 alone moved down; sequence 1 (inside the range) keeps its gradient."""
    old = FINITE.clone()
    logp = FINITE.clone()
    logp[0, 0] += 0.3
    logp[0, 1] -= 0.1
    logp.requires_grad_(True)
    losses.gspo_loss(logp, old, ADV, MASK).backward()
    assert logp.grad[0].abs().sum().item() == 0.0
    assert logp.grad[1, 0].item() == pytest.approx(1 / 2)  # -A * s / (|y| N) with s = 1


def test_kl_k3_by_hand_and_zero_at_equality():
    ref = LOGP.detach().clone()
    assert losses.kl_k3(LOGP, ref, MASK).item() == pytest.approx(0.0)
    ref[0, 0] += 0.5
    ref[1, 0] -= 1.0
    expected = ((math.exp(0.5) - 0.5 - 1) + 0 + (math.exp(-1) + 1 - 1)) / 3
    assert losses.kl_k3(LOGP, ref, MASK).item() == pytest.approx(expected)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(floats, floats), min_size=1, max_size=12))
def test_kl_k3_is_never_negative(pairs):
    logp = torch.tensor([[a for a, _ in pairs]])
    ref = torch.tensor([[b for _, b in pairs]])
    mask = torch.ones_like(logp)
    for agg in ("token_mean", "seq_mean"):
        assert losses.kl_k3(logp, ref, mask, agg).item() >= 0.0


# ---------------------------------------------------------------- the registry


def test_registry_serves_the_three_losses_with_one_signature():
    assert {"gpg", "grpo", "gspo"} <= set(losses.POLICY_LOSSES)
    settings_ = losses.LossSettings("token_mean", 0.2, 0.2)
    logp, old = FINITE.clone(), FINITE.clone()
    logp[0, 0] += 0.1
    direct = {
        "gpg": losses.gpg_loss(logp, ADV, MASK, "token_mean", 3.0),
        "grpo": losses.grpo_loss(logp, old, ADV, MASK, 0.2, 0.2, "token_mean", 3.0),
        "gspo": losses.gspo_loss(logp, old, ADV, MASK, 0.2, 0.2, 3.0),
    }
    for name, value in direct.items():
        entry = losses.POLICY_LOSSES.get(name)
        assert torch.equal(entry.fn(logp, old, ADV, MASK, settings_, 3.0), value)
    assert losses.POLICY_LOSSES.get("gspo").aggregation("token_mean") == "seq_mean"
    assert losses.POLICY_LOSSES.get("grpo").aggregation("token_mean") == "token_mean"


def test_registering_a_loss_makes_it_a_config_choice_named_in_the_help():
    from basis_bench.settings import setting_help
    from basis_bench.train import TrainConfig, make_config

    def half(logp, old_logp, advantages, mask, settings, denom=None):
        return 0.5 * losses.gpg_loss(logp, advantages, mask, settings.agg, denom)

    help_before = setting_help(TrainConfig, "loss")
    assert help_before == "A registered policy loss: gpg, grpo or gspo (basis_bench.train.losses)."
    with losses.POLICY_LOSSES.temporary():
        losses.register_policy_loss("test_half_gpg")(half)
        assert make_config({}, ["loss=test_half_gpg"]).loss == "test_half_gpg"
        assert setting_help(TrainConfig, "loss") == (
            "A registered policy loss: gpg, grpo, gspo or test_half_gpg (basis_bench.train.losses)."
        )
        with pytest.raises(ValueError, match="already registered"):
            losses.register_policy_loss("test_half_gpg")(half)
    with pytest.raises(InputError, match="unknown policy loss 'test_half_gpg'; registered: gpg"):
        losses.POLICY_LOSSES.get("test_half_gpg")
    assert setting_help(TrainConfig, "loss") == help_before
