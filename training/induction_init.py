"""An induction circuit written into a fresh Llama's first two layers, before training.

Copying from the passages is what makes a RAG answer grounded, and what both the draft model
and the n-gram proposer feed on.  A transformer copies with an *induction circuit* (Olsson et al.
2022): a previous-token head in one layer writes "the token before me" into each position, and an
induction head in a later layer finds the earlier position whose previous token equals the
current token and copies the token found there.  Trained from scratch, that circuit appears only
after a long plateau: on this CPU a 2-layer model trained on nothing but repeated random spans
sat at the uniform loss for 1,900 steps (~4 M tokens, measured), and the session-1 demo pair
never formed it.  So the circuit is set analytically at initialisation and training starts from
a model that can already copy; everything else (language, the answer format, which passage to
quote) is learnt as usual, and the circuit itself stays trainable.

Residual stream layout at initialisation (``code`` = min(head_dim, (hidden - 1) // 3) dimensions
each):

- dim 0: a constant, the same in every token's embedding; after RMSNorm it is a near-constant
  input from which position-only attention is built;
- dims A: the token's own code (its input embedding, random Gaussian);
- dims B: empty; the previous-token head writes the previous token's code here;
- dims C: empty; the induction heads write the copied token's code here, and only here does the
  (untied) output embedding read at initialisation.  Reading the current token's own code (A)
  would favour repeating the current token whenever there is nothing to copy: with tied
  embeddings a first run answered ``"ReturnReturnReturn..."`` (measured at step 250);
- the rest: small random values, free for training to use.

Layer 0, head 0 (previous token): query and key come from dim 0 only, on the high-frequency
rotary pairs, with the key's phases shifted by one position, so the score is
``sum_j w_j cos(theta_j (d - 1))`` for a key ``d`` positions back: largest at d = 1.  The weights
w_j are chosen by a linear programme that maximises the margin of d = 1 over every other
d in [0, max_positions).  Value: dims A; output: dims B.

Layer 1, heads 0 and 1 (induction): query = the current token's code (A), key = each position's
previous-token code (B), both on the low-frequency rotary pairs, where rotation over the whole
context is negligible (``rope_theta`` is set high for that), each head matching on half of the
code through orthogonal projections.  Value: the attended position's own code (A); output: written to
dims C with gain ``COPY_GAIN``, where the output embedding holds every token's code, so the copied
token ranks first.

Every other head's output projection and every MLP's down projection in these two layers, and
all later layers' residual outputs, start at zero: the network is exactly the circuit plus
identity at step 0, and learns the rest from there.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import linprog
from transformers import LlamaForCausalLM

ROPE_THETA = 1e8
"""High base: pairs 16..31 of a 64-dim head rotate < 0.21 rad over 2048 positions."""
PREV_PAIRS = range(0, 14)
"""Rotary pairs the previous-token head may use (theta 1 .. 3e-4 at ROPE_THETA)."""
MATCH_PAIRS = range(16, 32)
"""Rotary pairs the induction heads match on (theta <= 1e-4: position-independent)."""
PREV_MARGIN = 24.0
"""Logit margin of the previous position over any other in the previous-token head."""
MATCH_LOGIT = 36.0
"""Expected score of an exact code match in each induction head (before softmax)."""
COPY_GAIN = 2.0
"""Copied code's scale in dims C relative to a token's code in its embedding."""
OUTPUT_MARGIN = 12.0
"""Expected logit margin of the copied token over any other at the output."""


def prev_token_weights(
    inv_freq: np.ndarray, pairs: range, max_positions: int
) -> tuple[np.ndarray, float]:
    """Weights w_j >= 0 (summing to 1) maximising min_{d != 1} sum_j w_j (1 - cos(theta_j (d-1))),
    and that margin (in units of the head's total weight)."""
    thetas = inv_freq[list(pairs)]
    d = np.array([0] + list(range(2, max_positions)), dtype=np.float64)
    gaps = 1.0 - np.cos(np.outer(d - 1.0, thetas))  # [n_d, n_pairs]
    n = len(thetas)
    # Variables: w_0..w_{n-1}, t.  Maximise t  s.t.  gaps @ w >= t,  sum w = 1,  w >= 0.
    c = np.zeros(n + 1)
    c[-1] = -1.0
    a_ub = np.hstack([-gaps, np.ones((len(d), 1))])
    b_ub = np.zeros(len(d))
    a_eq = np.hstack([np.ones((1, n)), np.zeros((1, 1))])
    res = linprog(
        c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=[1.0], bounds=[(0, None)] * n + [(None, None)]
    )
    if not res.success:
        raise RuntimeError(f"previous-token head: linear programme failed: {res.message}")
    w = np.clip(res.x[:n], 0.0, None)
    w /= w.sum()
    return w, float((gaps @ w).min())


@torch.no_grad()
def wire_induction(model: LlamaForCausalLM, seed: int) -> dict[str, float]:
    """Write the circuit into ``model`` (fresh Llama, head_dim 64, rope_theta=ROPE_THETA, untied).

    Returns the design figures (margins, scales) for the training card.
    """
    cfg = model.config
    d_model, n_heads = cfg.hidden_size, cfg.num_attention_heads
    hd = d_model // n_heads
    code = min(hd, (d_model - 1) // 3)
    if hd != 64 or n_heads < 2 or code < 48 or cfg.num_key_value_heads != n_heads:
        raise ValueError(
            "induction init needs head_dim 64, >= 2 heads, no GQA and hidden >= 145 "
            f"(a code of >= 48 dims); got hidden {d_model}, heads {n_heads}, "
            f"kv heads {cfg.num_key_value_heads}"
        )
    if cfg.tie_word_embeddings:
        raise ValueError("induction init needs untied embeddings (the output reads dims C only)")
    if cfg.num_hidden_layers < 2:
        raise ValueError("induction init needs at least two layers")
    inv_freq = model.model.rotary_emb.inv_freq.double().numpy()
    if abs(inv_freq[MATCH_PAIRS.start] * cfg.max_position_embeddings) > 0.25:
        raise ValueError(f"rope_theta too low for position-free matching: {cfg.rope_parameters}")
    gen = torch.Generator().manual_seed(seed)
    a_dims = torch.arange(1, 1 + code)
    b_dims = torch.arange(1 + code, 1 + 2 * code)
    c_dims = torch.arange(1 + 2 * code, 1 + 3 * code)
    free = torch.arange(1 + 3 * code, d_model)

    # Input embedding: constant dim 0, Gaussian code in A, B and C empty.
    emb = model.model.embed_tokens.weight
    vocab = emb.shape[0]
    c0 = 2.0 * math.sqrt(code)  # constant^2 = 4 x E|code|^2: RMSNorm of any token ~ the same
    codes = torch.randn(vocab, code, generator=gen)
    emb.zero_()
    emb[:, 0] = c0
    emb[:, a_dims] = codes
    emb[:, free] = 0.02 * torch.randn(vocab, len(free), generator=gen)
    # Output embedding: every token's code in C, nothing elsewhere.
    out = model.lm_head.weight
    out.zero_()
    out[:, c_dims] = codes

    def rms(sq_sum: float) -> float:
        return math.sqrt(sq_sum / d_model)

    rms0 = rms(c0**2 + code)  # embedding only
    rms1 = rms(c0**2 + 2 * code)  # after the previous-token head filled B
    rms2 = rms(c0**2 + code * (2 + COPY_GAIN**2))  # after the copy

    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        layer.input_layernorm.weight.fill_(1.0)
        layer.post_attention_layernorm.weight.fill_(1.0)

    # Layer 0, head 0: previous-token head.
    att0 = model.model.layers[0].self_attn
    w, margin = prev_token_weights(inv_freq, PREV_PAIRS, cfg.max_position_embeddings)
    x0 = c0 / rms0  # normed dim 0
    # score(d) = (1/sqrt(hd)) * x0^2 * scale^2 * sum_j w_j cos(theta_j (d - 1))
    scale = math.sqrt(PREV_MARGIN * math.sqrt(hd) / (x0**2 * margin))
    q, k, v = att0.q_proj.weight, att0.k_proj.weight, att0.v_proj.weight
    for h_rows in (q, k, v):
        h_rows[:hd].zero_()
    half = hd // 2
    for wj, j in zip(w, PREV_PAIRS, strict=True):
        amp = scale * math.sqrt(wj)
        theta = inv_freq[j]
        q[j, 0] = amp
        # Key phase +theta: Re(q_m conj(k_n)) = cos(theta (m - n) - theta) peaks at m - n = 1.
        k[j, 0] = amp * math.cos(theta)
        k[j + half, 0] = amp * math.sin(theta)
    v[torch.arange(code), a_dims] = 1.0
    att0.o_proj.weight[b_dims, torch.arange(code)] = rms0  # B = previous token's code

    # Layer 1, heads 0 and 1: induction heads, each matching half the code.
    att1 = model.model.layers[1].self_attn
    q, k, v = att1.q_proj.weight, att1.k_proj.weight, att1.v_proj.weight
    rot = torch.linalg.qr(torch.randn(code, code, generator=gen, dtype=torch.float64))[0].float()
    match_dims = torch.tensor(list(MATCH_PAIRS) + [j + half for j in MATCH_PAIRS])
    per_head = min(len(match_dims), code // 2)  # half the code's dimensions per head
    # score = (1/sqrt(hd)) * m^2 * |P e|^2 / rms1^2, |P e|^2 ~ per_head  ->  MATCH_LOGIT
    m = math.sqrt(MATCH_LOGIT * math.sqrt(hd) * rms1**2 / per_head)
    for h in range(2):
        rows = slice(h * hd, (h + 1) * hd)
        q[rows].zero_()
        k[rows].zero_()
        v[rows].zero_()
        proj = rot[h * per_head : (h + 1) * per_head]  # [per_head, code]
        rows_qk = h * hd + match_dims[:per_head, None]
        q[rows_qk, a_dims[None, :]] = m * proj
        k[rows_qk, b_dims[None, :]] = m * proj
        v[h * hd + torch.arange(code), a_dims] = 1.0
        att1.o_proj.weight[c_dims, h * hd + torch.arange(code)] = COPY_GAIN * rms1 / 2

    # Final norm: the copied token's logit OUTPUT_MARGIN above any other token's.
    # logit_y = (w_f / rms2) * <h_C, code_y>;  gap ~ w_f * COPY_GAIN * code / rms2
    model.model.norm.weight.fill_(OUTPUT_MARGIN * rms2 / (COPY_GAIN * code))
    return {
        "prev_head_margin": PREV_MARGIN,
        "prev_head_lp_margin": margin,
        "match_logit": MATCH_LOGIT,
        "copy_gain": COPY_GAIN,
        "output_margin": OUTPUT_MARGIN,
        "rope_theta": ROPE_THETA,
    }
