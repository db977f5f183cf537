"""The Mamba2 references against values worked out by hand, and against each other (prefill as
repeated decode)."""

from __future__ import annotations

import math

import numpy as np

from reference_kernels.mamba import (
    causal_conv1d_fwd,
    causal_conv1d_update,
    selective_state_update,
    softplus,
    ssd_chunk_scan,
)


def test_softplus_known_values_and_no_overflow() -> None:
    assert softplus(np.array([0.0]))[0] == math.log(2.0)
    assert softplus(np.array([1000.0]))[0] == 1000.0
    assert softplus(np.array([-1000.0]))[0] == 0.0


def _one(v: float) -> np.ndarray:
    return np.array([v])


def test_one_decode_step_by_hand() -> None:
    # softplus(0 + log(e - 1)) = 1; decay e^(1·-log 2) = 1/2: state 2 → 1 + 1·3·1 = 4, y = 4·1 + 0.5·3.
    args = {"state": np.full((1, 1, 1, 1), 2.0), "x": np.full((1, 1, 1, 1), 3.0), "dt": np.zeros((1, 1, 1)),
            "A": _one(-math.log(2.0)), "B": np.ones((1, 1, 1, 1)), "C": np.ones((1, 1, 1, 1)), "D": _one(0.5),
            "dt_bias": _one(math.log(math.e - 1.0)), "dt_softplus": True}
    y, state = selective_state_update(z=None, **args)  # type: ignore[arg-type]
    assert np.allclose(state, 4.0) and np.allclose(y, 5.5)
    y_gated, _ = selective_state_update(z=np.zeros((1, 1, 1, 1)), **args)  # type: ignore[arg-type]
    assert np.allclose(y_gated, 0.0)  # silu(0) = 0


def test_groups_map_consecutive_heads() -> None:
    # 4 heads, 2 groups: heads 0-1 read group 0 (B = 1), heads 2-3 group 1 (B = 10).
    b = np.array([1.0, 10.0]).reshape(1, 1, 2, 1)
    _, state = selective_state_update(np.zeros((1, 4, 1, 1)), np.ones((1, 1, 4, 1)), np.ones((1, 1, 4)),
                                      -np.ones(4), b, b, np.zeros(4), None, np.zeros(4), False)
    assert state.reshape(-1).tolist() == [1.0, 1.0, 10.0, 10.0]


def test_conv_update_by_hand() -> None:
    weight = np.array([[1.0, 10.0, 100.0]])  # tap W-1 meets the newest sample
    out, state = causal_conv1d_update(np.full((1, 1, 1), 3.0), np.array([[[1.0, 2.0]]]), weight, np.array([0.5]),
                                      False)
    assert out.reshape(-1).tolist() == [321.5] and state.reshape(-1).tolist() == [2.0, 3.0]


def test_conv_prefill_is_repeated_decode_and_short_sequences_keep_initial_samples() -> None:
    rng = np.random.default_rng(0)
    d, w = 5, 4
    x, weight, bias = rng.normal(size=(d, 9)), rng.normal(size=(d, w)), rng.normal(size=d)
    states = rng.normal(size=(2, d, w - 1))
    qsl = np.array([0, 7, 9])
    out, final = causal_conv1d_fwd(x, weight, bias, states, qsl, np.array([True, True]), True)
    for s in range(2):
        seq = x[:, qsl[s]:qsl[s + 1]].T[:, None, :]
        dec, dec_state = causal_conv1d_update(seq, states[s:s + 1], weight, bias, True)
        assert np.allclose(out[:, qsl[s]:qsl[s + 1]], dec[:, 0].T) and np.allclose(final[s], dec_state[0])
    assert np.array_equal(final[1][:, :1], states[1][:, 2:])  # 2 tokens < 3 kept: one initial sample stays


def test_scan_is_repeated_decode_whatever_the_chunk_size() -> None:
    rng = np.random.default_rng(1)
    length, h, p, n, g = 11, 4, 3, 5, 2
    x, dt = rng.normal(size=(length, h, p)), rng.normal(size=(length, h))
    b, c = rng.normal(size=(length, g, n)), rng.normal(size=(length, g, n))
    a, d, bias, z = -rng.uniform(0.5, 1.5, h), rng.normal(size=h), rng.normal(size=h), rng.normal(size=(length, h, p))
    init = rng.normal(size=(1, h, p, n))
    out, final = ssd_chunk_scan(x, dt, a, b, c, d, z, bias, init, np.array([0, length]), 4, True)
    dec, dec_state = selective_state_update(init, x[:, None], dt[:, None], a, b[:, None], c[:, None], d, z[:, None],
                                            bias, True)
    assert np.allclose(out, dec[:, 0]) and np.allclose(final, dec_state)
