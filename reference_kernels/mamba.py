"""Mamba2 (state-space) references: the decode state update, the causal depthwise convolution
(decode and prefill) and the SSD prefill scan, all in float64 and written from the recurrence.

The recurrence of one Mamba2 head h at one token, with its group g = h // (H / G):

    dt'   = softplus(dt + dt_bias[h])          (softplus only when dt_softplus)
    state = exp(dt' · A[h]) · state + dt' · x ⊗ B[g]     (state [P, N], x [P], B [N])
    y     = state · C[g] + D[h] · x             (then y · silu(z) when a gate z is given)

The chunked SSD form a prefill kernel uses is an exact rearrangement of this recurrence, so
the sequential loop below is the reference for it too (chunk_size changes nothing here).
"""

from __future__ import annotations

import numpy as np


def softplus(v: np.ndarray) -> np.ndarray:
    """softplus(v) = log(1 + e^v), as logaddexp(0, v): no overflow for large v."""
    return np.logaddexp(0.0, np.asarray(v, dtype=np.float64))


def silu(v: np.ndarray) -> np.ndarray:
    """SiLU(v) = v / (1 + e^-v)."""
    v = np.asarray(v, dtype=np.float64)
    with np.errstate(over="ignore"):  # e^-v = inf for very negative v gives the right limit 0
        return v / (1.0 + np.exp(-v))


def _heads(bc: np.ndarray, heads: int) -> np.ndarray:
    """[..., G, N] → [..., H, N]: head h reads group h // (H / G)."""
    groups = bc.shape[-2]
    if heads % groups:
        raise ValueError(f"{heads} heads do not split into {groups} groups")
    return np.repeat(bc, heads // groups, axis=-2)


def ssm_step(state: np.ndarray, x: np.ndarray, dt: np.ndarray, A: np.ndarray, B: np.ndarray, C: np.ndarray,
             D: np.ndarray, z: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """One token for every head: state [..., H, P, N], x [..., H, P], dt [..., H] (final step size),
    A, D [H], B, C [..., G, N], z [..., H, P] or None → (y [..., H, P], new state)."""
    heads = x.shape[-2]
    bh, ch = _heads(B, heads), _heads(C, heads)
    decay = np.exp(dt * A)[..., None, None]
    state = decay * state + (dt[..., None] * x)[..., None] * bh[..., None, :]
    y = np.einsum("...pn,...n->...p", state, ch) + D[:, None] * x
    if z is not None:
        y = y * silu(z)
    return y, state


def _step_size(dt: np.ndarray, dt_bias: np.ndarray, dt_softplus: bool) -> np.ndarray:
    d = np.asarray(dt, dtype=np.float64) + np.asarray(dt_bias, dtype=np.float64)
    return softplus(d) if dt_softplus else d


def selective_state_update(state: np.ndarray, x: np.ndarray, dt: np.ndarray, A: np.ndarray, B: np.ndarray,
                           C: np.ndarray, D: np.ndarray, z: np.ndarray | None, dt_bias: np.ndarray,
                           dt_softplus: bool) -> tuple[np.ndarray, np.ndarray]:
    """T consecutive decode steps carrying the state: state [Bt, H, P, N], x [T, Bt, H, P],
    dt [T, Bt, H], B, C [T, Bt, G, N], z [T, Bt, H, P] or None → (y [T, Bt, H, P], final state)."""
    s = np.asarray(state, dtype=np.float64).copy()
    A, D = np.asarray(A, dtype=np.float64), np.asarray(D, dtype=np.float64)
    ys = []
    for t in range(x.shape[0]):
        y, s = ssm_step(s, x[t], _step_size(dt[t], dt_bias, dt_softplus), A, B[t], C[t], D,
                        None if z is None else z[t])
        ys.append(y)
    return np.stack(ys), s


def _conv(window: np.ndarray, weight: np.ndarray, bias: np.ndarray, silu_activation: bool) -> np.ndarray:
    """Σ_k window[..., k] · weight[:, k] + bias: tap W-1 meets the newest sample (torch's conv1d)."""
    out = np.einsum("...dk,dk->...d", window, weight) + bias
    return silu(out) if silu_activation else out


def causal_conv1d_update(x: np.ndarray, conv_state: np.ndarray, weight: np.ndarray, bias: np.ndarray,
                         silu_activation: bool) -> tuple[np.ndarray, np.ndarray]:
    """T decode steps: x [T, Bt, D], conv_state [Bt, D, W-1] (oldest sample first), weight [D, W]
    → (out [T, Bt, D], conv_state after the last step: the W-1 newest inputs)."""
    state = np.asarray(conv_state, dtype=np.float64).copy()
    weight, bias = np.asarray(weight, dtype=np.float64), np.asarray(bias, dtype=np.float64)
    outs = []
    for t in range(x.shape[0]):
        window = np.concatenate([state, x[t][..., None]], axis=-1)  # [Bt, D, W]
        outs.append(_conv(window, weight, bias, silu_activation))
        state = window[..., 1:]
    return np.stack(outs), state


def causal_conv1d_fwd(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, conv_states: np.ndarray,
                      query_start_loc: np.ndarray, has_initial_state: np.ndarray,
                      silu_activation: bool) -> tuple[np.ndarray, np.ndarray]:
    """Prefill of S sequences packed along tokens: x [D, L], conv_states [S, D, W-1] (read where
    has_initial_state, else zeros), query_start_loc [S+1] → (out [D, L], final conv_states)."""
    x = np.asarray(x, dtype=np.float64)
    weight, bias = np.asarray(weight, dtype=np.float64), np.asarray(bias, dtype=np.float64)
    width = weight.shape[1]
    out = np.zeros_like(x)
    final = np.asarray(conv_states, dtype=np.float64).copy()
    for s in range(len(query_start_loc) - 1):
        a, b = int(query_start_loc[s]), int(query_start_loc[s + 1])
        init = final[s] if bool(has_initial_state[s]) else np.zeros((x.shape[0], width - 1))
        full = np.concatenate([init, x[:, a:b]], axis=1)  # [D, W-1 + len]
        for i in range(b - a):
            out[:, a + i] = _conv(full[:, i:i + width], weight, bias, silu_activation)
        final[s] = full[:, full.shape[1] - (width - 1):]
    return out, final


def ssd_chunk_scan(x: np.ndarray, dt: np.ndarray, A: np.ndarray, B: np.ndarray, C: np.ndarray, D: np.ndarray,
                   z: np.ndarray | None, dt_bias: np.ndarray, initial_states: np.ndarray, cu_seqlens: np.ndarray,
                   chunk_size: int, dt_softplus: bool) -> tuple[np.ndarray, np.ndarray]:
    """Prefill scan of S packed sequences, token by token: x [L, H, P], dt [L, H], B, C [L, G, N],
    z [L, H, P] or None, initial_states [S, H, P, N] → (out [L, H, P], final states [S, H, P, N]).
    ``chunk_size`` only shapes a chunked kernel's work; the result does not depend on it."""
    del chunk_size
    A, D = np.asarray(A, dtype=np.float64), np.asarray(D, dtype=np.float64)
    out = np.zeros(x.shape, dtype=np.float64)
    final = np.asarray(initial_states, dtype=np.float64).copy()
    for s in range(len(cu_seqlens) - 1):
        state = final[s]
        for t in range(int(cu_seqlens[s]), int(cu_seqlens[s + 1])):
            out[t], state = ssm_step(state, x[t], _step_size(dt[t], dt_bias, dt_softplus), A, B[t], C[t], D,
                                     None if z is None else z[t])
        final[s] = state
    return out, final
