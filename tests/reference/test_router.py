"""Router of Algorithm alg:routing and the LFLB controller, checked against independent numpy references."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from scipy import stats

from scaleplan.reference.router import (
    bias_update,
    proposal_size,
    route,
    sequence_aux_loss,
    starved_experts,
    z_loss,
)


def _np_scores(h, w, c_r=1.0):
    wn = c_r * w / np.linalg.norm(w, axis=1, keepdims=True)
    return 1.0 / (1.0 + np.exp(-(h @ wn.T)))


@pytest.mark.parametrize("E,K,rho,M", [(20, 3, 12, 20), (64, 2, 12, 24), (8, 1, 4, 4)])
def test_proposal_size_and_gate_normalisation(E, K, rho, M):
    g = torch.Generator().manual_seed(1)
    h = torch.randn(50, 12, generator=g, dtype=torch.float64)
    w = torch.randn(E, 12, generator=g, dtype=torch.float64)
    phi = 0.05 * torch.randn(E, generator=g)
    out = route(h, w, phi, K, rho=rho, generator=g)
    assert proposal_size(K, E, rho) == M
    assert out.candidates.shape == (50, M)
    for row_c, row_i in zip(out.candidates.tolist(), out.idx.tolist()):
        assert len(set(row_c)) == M  # distinct candidates
        assert set(row_i) <= set(row_c) and len(set(row_i)) == K  # selection inside the proposal
    gates = out.gates.detach().numpy()
    assert np.all(gates >= 0)
    np.testing.assert_allclose(gates.sum(axis=1), 1.0, rtol=1e-6)
    s = _np_scores(h.numpy(), w.numpy())
    chosen = np.take_along_axis(s, out.idx.numpy(), axis=1)
    np.testing.assert_allclose(gates, chosen / chosen.sum(axis=1, keepdims=True), rtol=1e-5)
    assert out.counts.sum().item() == 50 * K
    np.testing.assert_array_equal(out.counts.numpy(), np.bincount(out.idx.numpy().ravel(), minlength=E))


@pytest.mark.parametrize("tau", [0.0, 1e-9])
def test_tau_to_zero_is_biased_topk_within_clean_topm(tau):
    E, K, rho, T = 32, 2, 2, 200  # M = 4
    g = torch.Generator().manual_seed(2)
    h = torch.randn(T, 16, generator=g, dtype=torch.float64)
    w = torch.randn(E, 16, generator=g, dtype=torch.float64)
    phi = torch.zeros(E)
    phi[:4] = 0.6  # strongly favour experts 0..3 in the correction, whatever their clean rank
    out = route(h, w, phi, K, rho=rho, tau=tau, generator=g)
    s = _np_scores(h.numpy(), w.numpy())
    M = rho * K
    differs_from_global = 0
    for t in range(T):
        top_m = np.argsort(-s[t])[:M]
        biased = s[t, top_m] + phi.numpy()[top_m]
        expect = set(top_m[np.argsort(-biased)[:K]].tolist())
        assert set(out.idx[t].tolist()) == expect
        global_k = set(np.argsort(-(s[t] + phi.numpy()))[:K].tolist())
        differs_from_global += global_k != expect
    # the restriction to the clean top-M matters: the bias alone would pick other experts
    assert differs_from_global > 0


def test_uncentred_k1_gumbel_max_frequencies_follow_tempered_distribution():
    """eq:gumbel-max: argmax(log p + tau g) ~ Categorical(p^(1/tau) / sum p^(1/tau)); K = M = 1, no centring."""
    E, T, tau = 5, 40_000, 0.5
    g = torch.Generator().manual_seed(3)
    w = torch.randn(E, 8, generator=g, dtype=torch.float64)
    h1 = torch.randn(1, 8, generator=g, dtype=torch.float64)
    h = h1.expand(T, 8)
    out = route(h, w, torch.zeros(E), 1, rho=1, tau=tau, center=False, generator=g)
    observed = np.bincount(out.idx.numpy().ravel(), minlength=E)
    p = _np_scores(h1.numpy(), w.numpy())[0]
    tempered = p ** (1 / tau) / np.sum(p ** (1 / tau))
    assert stats.chisquare(observed, tempered * T).pvalue > 1e-3
    # power check: the untempered distribution p/sum(p) is rejected by the same test
    assert stats.chisquare(observed, p / p.sum() * T).pvalue < 1e-6


def test_bias_update_matches_eq_bias_update_by_hand():
    counts = torch.tensor([10, 0, 2, 0])  # n_bar = 3; v = (-7, 3, 1, 3); mean v^2 = 17
    phi = torch.tensor([0.5, 0.0, 0.0, 0.0])
    new = bias_update(phi, counts, mu_b=0.1, eps=0.0)
    u = np.array([-7, 3, 1, 3]) / np.sqrt(17.0)
    raw = np.array([0.5, 0, 0, 0]) + 0.1 * u
    np.testing.assert_allclose(new.numpy(), raw - raw.mean(), rtol=1e-6)
    assert abs(new.sum().item()) < 1e-6


def test_starved_definition():
    # uniform share = 100 * 2 / 4 = 50 tokens; 5% of it = 2.5
    assert starved_experts(torch.tensor([2, 3, 100, 95]), k=2) == 1
    assert starved_experts(torch.tensor([0, 0, 100, 100]), k=2) == 2


def test_z_loss_and_sequence_aux_loss_by_hand():
    logits = torch.tensor([[0.0, 0.0], [np.log(3.0), 0.0]])
    assert z_loss(logits).item() == pytest.approx(((np.log(2)) ** 2 + (np.log(4)) ** 2) / 2, rel=1e-6)
    # one sequence of 2 tokens, E=2, K=1: both tokens pick expert 0
    scores = torch.tensor([[0.6, 0.2], [0.3, 0.3]])
    idx = torch.tensor([[0], [0]])
    p = np.array([(0.75 + 0.5) / 2, (0.25 + 0.5) / 2])
    f = np.array([2 / (1 * 2) * 2, 0.0])
    assert sequence_aux_loss(scores, idx, seq_len=2).item() == pytest.approx(float(f @ p), rel=1e-6)


def test_controller_drives_starved_experts_down_on_skewed_stream():
    E, d, K, T, steps = 16, 16, 2, 512, 300
    g = torch.Generator().manual_seed(0)
    w = torch.randn(E, d, generator=g)
    # tokens cluster around the directions of three experts: the rest starve without a controller
    mu = 3 * (w[:3] / w[:3].norm(dim=1, keepdim=True)).sum(0)
    tails = {}
    for controlled in (False, True):
        phi = torch.zeros(E)
        starved = []
        for _ in range(steps):
            out = route(mu + torch.randn(T, d, generator=g), w, phi, K, generator=g)
            starved.append(starved_experts(out.counts, K))
            if controlled:
                phi = bias_update(phi, out.counts)
        tails[controlled] = float(np.mean(starved[-50:]))
        assert np.mean(starved[:5]) >= E / 2  # the stream really is skewed at the start
    assert tails[False] >= E / 2
    assert tails[True] <= 0.5
