"""Tree verification (reference.verify_tree): one program per row walks its draft tree.

The walk visits one node per level (at most M + 1 nodes, the path): at each it finds the node's p in BLOCK_V chunks
with the chunked path's sweeps (CFG, 1/T, the top-k / top-p / min-p threshold, online max and Z), writes p and the
level's q into the row's scratch [2, V] while summing H and TVD, then runs RRS over the node's children in rank
order. A rejected candidate costs two sweeps over the scratch (the masses of max(p − q, 0) and of q without x, then
the renormalised rows). The emitted token is an inverse-CDF draw from the scratch p (a total sweep, then a search
sweep through the same chunk carries). No node off the path is ever computed; no path is ever copied.
"""

import triton
import triton.language as tl

from .... import reference as ref
from . import rules
from .chunked import chunk_p, load_z, restrict, restriction_threshold, softmax_sweep
from .common import S_BAD_LOGITS, chunk_cdf, chunk_lanes, philox, row_key, uniform

TREE_TAG = tl.constexpr(ref.TREE_STREAM_TAG)
NO_HIT = tl.constexpr(2147483647)


@triton.jit
def tree_uniforms(slot, off_lo, tag, k0, k1):
    """(u_accept, u_sample) of the tree stream at ``slot``: counter (slot, 2^31, offset_lo, TAG | row_id)."""
    s = slot.to(tl.uint32)
    zero = tl.zeros_like(s)
    w0, w1, _w2, _w3 = philox(s, zero + 0x80000000, zero + off_lo, zero + tag, zero + k0, zero + k1)
    return uniform(w0), uniform(w1)


@triton.jit
def _node_p(c_row, u_row, offs, mask, thr, m, z_sum, amax, bad, inv_v, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr,
            GREEDY: tl.constexpr, RESTRICT: tl.constexpr):
    """(p, support) of one chunk, 0 / False outside the vocabulary. A node with bad logits has z = 0
    (reference.target_distribution): p uniform, or one-hot(0) for T = 0."""
    p, support = chunk_p(c_row, u_row, offs, mask, thr, m, z_sum, amax, cfg_scale, inv_t, HAS_UNCOND, GREEDY,
                         RESTRICT, False)
    p = tl.where(mask, p, 0.0)
    if GREEDY:
        fallback = offs == 0
        p = tl.where(bad, tl.where(fallback, 1.0, 0.0), p)
        return p, p > 0  # the support of a one-hot p is its token
    return tl.where(bad, tl.where(mask, inv_v, 0.0), p), tl.where(bad, mask, support & mask)


@triton.jit
def _in_support(c_row, u_row, x, thr, amax, bad, cfg_scale, inv_t, HAS_UNCOND: tl.constexpr, GREEDY: tl.constexpr,
                RESTRICT: tl.constexpr):
    """Whether token x (a valid index) is in the node's support."""
    if GREEDY:
        return tl.where(bad, x == 0, x == amax)
    z = restrict(load_z(c_row, u_row, x, x >= 0, cfg_scale, inv_t, HAS_UNCOND, GREEDY, False), x >= 0, thr,
                 RESTRICT)
    return bad | (z > float("-inf"))


@triton.jit
def _load_node(c_row, u_row, q_row, s_qv, has_q, scr_p, scr_q, V, thr, m, z_sum, amax, bad, inv_v, cfg_scale, inv_t,
               HAS_UNCOND: tl.constexpr, GREEDY: tl.constexpr, RESTRICT: tl.constexpr, BLOCK_V: tl.constexpr):
    """Write the node's p and its level's q (0 at level M: ``q_row`` is then any valid row) into the scratch;
    return (H(p), TVD(p, q))."""
    lane = tl.arange(0, BLOCK_V)
    h_acc = tl.zeros((), tl.float32)
    abs_diff = tl.zeros((), tl.float32)
    for v0 in range(0, V, BLOCK_V):
        offs, mask = chunk_lanes(v0, lane, V)
        p, _support = _node_p(c_row, u_row, offs, mask, thr, m, z_sum, amax, bad, inv_v, cfg_scale, inv_t,
                              HAS_UNCOND, GREEDY, RESTRICT)
        q = tl.where(has_q, tl.load(q_row + offs * s_qv, mask=mask, other=0.0).to(tl.float32), 0.0)
        tl.store(scr_p + offs, p, mask=mask)
        tl.store(scr_q + offs, q, mask=mask)
        h_acc += tl.sum(p * tl.log(tl.where(p > 0, p, 1.0)), 0)
        abs_diff += tl.sum(tl.abs(p - q), 0)
    return -h_acc, 0.5 * abs_diff


@triton.jit
def _visit(c_row, u_row, q_row, s_qv, has_q, scr_p, scr_q, V, st, inv_v, HAS_UNCOND: tl.constexpr,
           GREEDY: tl.constexpr, TOP_K: tl.constexpr, TOP_P: tl.constexpr, MIN_P: tl.constexpr, BLOCK_V: tl.constexpr):
    """The node's target (thr, bad, m, Z, amax, H, TVD), its p and its level's q written into the scratch."""
    RESTRICT: tl.constexpr = TOP_K or TOP_P or MIN_P
    thr = restriction_threshold(c_row, u_row, V, st.top_k, st.top_p, st.log_min_p, st.cfg_scale, st.inv_t, HAS_UNCOND,
                                TOP_K, TOP_P, MIN_P, BLOCK_V)
    bad, m, z_sum, amax, _g = softmax_sweep(c_row, u_row, V, thr, st.cfg_scale, st.inv_t, 0, 0, 0, 0, HAS_UNCOND,
                                            GREEDY, RESTRICT, False, False, BLOCK_V)
    tl.debug_barrier()  # every thread is done reading the previous node's scratch
    h, tvd = _load_node(c_row, u_row, q_row, s_qv, has_q, scr_p, scr_q, V, thr, m, z_sum, amax, bad, inv_v,
                        st.cfg_scale, st.inv_t, HAS_UNCOND, GREEDY, RESTRICT, BLOCK_V)
    tl.debug_barrier()  # the scratch is read below by other threads than the ones that wrote it
    return thr, bad, m, z_sum, amax, h, tvd


@triton.jit
def _distortion(c_row, u_row, q_row, s_qv, scr_p, nb_ptr, s_nb, nb_k, V, thr, m, z_sum, amax, bad, inv_v, h, params,
                cfg_scale, inv_t, HAS_UNCOND: tl.constexpr, GREEDY: tl.constexpr, RESTRICT: tl.constexpr,
                RULE: tl.constexpr, BLOCK_V: tl.constexpr):
    """The rule's distortion at the node (csd's with its gate open: the caller gates it): the per-token terms of
    rules.distortion_terms, or lantern's (k gathers of the node's p in the scratch per token)."""
    lane = tl.arange(0, BLOCK_V)
    dist = tl.zeros((), tl.float32)
    for v0 in range(0, V, BLOCK_V):
        offs, mask = chunk_lanes(v0, lane, V)
        p, support = _node_p(c_row, u_row, offs, mask, thr, m, z_sum, amax, bad, inv_v, cfg_scale, inv_t,
                             HAS_UNCOND, GREEDY, RESTRICT)
        q = tl.load(q_row + offs * s_qv, mask=mask, other=0.0).to(tl.float32)
        if rules.is_lantern(RULE):
            dist += tl.sum(rules.lantern_terms(nb_ptr, s_nb, nb_k, offs, p, q, support, params[0], scr_p, scr_p, 0.0,
                                               1.0, 0, 0.0, 0, V, 1.0, 1.0, RULE, False, False, True, False, False), 0)
        else:
            dist += tl.sum(rules.distortion_terms(p, q, support, h, params, RULE), 0)
    return dist


@triton.jit
def _main_distortion(c_row, u_row, q_row, s_qv, scr_p, nb_ptr, s_nb, nb_k, V, thr, m, z_sum, amax, bad, inv_v, h, tvd,
                     st, main_ok, informed, HAS_UNCOND: tl.constexpr, GREEDY: tl.constexpr, RESTRICT: tl.constexpr,
                     RULE: tl.constexpr, GATHER_DIST: tl.constexpr, BLOCK_V: tl.constexpr):
    """The rule's distortion at the level's main draft (``main_ok``: there is one, below level M), swept only where
    the rule would decide (lantern's k gathers per token only when asked, NaN otherwise)."""
    params = st.params
    dist = tl.zeros((), tl.float32)
    gate = main_ok & informed
    if RULE == rules.CSD:
        gate = gate & (tvd < params[1])
    if rules.has_token_terms(RULE) or (rules.is_lantern(RULE) and GATHER_DIST):
        if gate:
            dist = _distortion(c_row, u_row, q_row, s_qv, scr_p, nb_ptr, s_nb, nb_k, V, thr, m, z_sum, amax, bad, inv_v,
                               h, params, st.cfg_scale, st.inv_t, HAS_UNCOND, GREEDY, RESTRICT, RULE, BLOCK_V)
    elif rules.is_lantern(RULE):
        dist = tl.where(main_ok & informed, float("nan"), 0.0)
    return dist


@triton.jit
def _rrs_chunk(scr_p, scr_q, rest_row, s_rv, x, v0, lane, V):
    """(offs, mask, p, q, rest without x) of the chunk at v0, for _rrs_update."""
    offs, mask = chunk_lanes(v0, lane, V)
    p = tl.load(scr_p + offs, mask=mask, other=0.0)
    q = tl.load(scr_q + offs, mask=mask, other=0.0)
    rest = tl.load(rest_row + offs * s_rv, mask=mask & (offs != x), other=0.0).to(tl.float32)
    return offs, mask, p, q, rest


@triton.jit
def _rrs_update(scr_p, scr_q, rest_row, s_rv, x, V, BLOCK_V: tl.constexpr):
    """A rejected candidate x (reference.rrs_step): p <- norm(max(p − q, 0)) (p if that is all 0), q <- rest without
    x, renormalised (0 if nothing is left). ``rest_row`` may be ``scr_q`` itself (each lane reads before it writes)."""
    lane = tl.arange(0, BLOCK_V)
    mass = tl.zeros((), tl.float32)
    left = tl.zeros((), tl.float32)
    for v0 in range(0, V, BLOCK_V):
        offs, mask, p, q, rest = _rrs_chunk(scr_p, scr_q, rest_row, s_rv, x, v0, lane, V)
        mass += tl.sum(rules.residual(p, q, q, rules.STRICT), 0)
        left += tl.sum(rest, 0)
    for v0 in range(0, V, BLOCK_V):
        offs, mask, p, q, rest = _rrs_chunk(scr_p, scr_q, rest_row, s_rv, x, v0, lane, V)
        new_p = tl.where(mass > 0, rules.residual(p, q, q, rules.STRICT) / tl.where(mass > 0, mass, 1.0), p)
        new_q = tl.where(left > 0, rest / tl.where(left > 0, left, 1.0), 0.0)
        tl.store(scr_p + offs, new_p, mask=mask)
        tl.store(scr_q + offs, new_q, mask=mask)


@triton.jit
def _draw(scr_p, u, V, BLOCK_V: tl.constexpr):
    """reference.inverse_cdf_sample of the scratch p: the first index whose running sum passes u·total (the last
    positive weight if rounding overshoots); the total and the searched sums come from the same chunk carries."""
    lane = tl.arange(0, BLOCK_V)
    carry = tl.zeros((), tl.float32)
    for v0 in range(0, V, BLOCK_V):
        w = tl.load(scr_p + v0 + lane, mask=v0 + lane < V, other=0.0)
        _cdf, carry = chunk_cdf(w, carry, lane, BLOCK_V)
    target = u * carry
    carry = tl.zeros((), tl.float32)
    first = tl.full((), NO_HIT, tl.int32)
    last = tl.full((), -1, tl.int32)
    for v0 in range(0, V, BLOCK_V):
        offs, mask = chunk_lanes(v0, lane, V)
        w = tl.load(scr_p + offs, mask=mask, other=0.0)
        cdf, carry = chunk_cdf(w, carry, lane, BLOCK_V)
        first = tl.minimum(first, tl.min(tl.where(mask & (cdf > target), offs, NO_HIT), 0).to(tl.int32))
        last = tl.maximum(last, tl.max(tl.where(w > 0, offs, -1), 0).to(tl.int32))
    return tl.where(first < V, first, last).to(tl.int64)


@triton.jit
def _children(children_ptr, s_kn, s_kr, node_ptr, s_nb, s_ns, cur, b, K, c_row, u_row, scr_p, scr_q, sib_row, s_sv,
              nb_ptr, s_nbr, nb_k, V, thr, amax, bad, h, tvd, informed, dist, st, off_lo, tag, k0, k1,
              HAS_UNCOND: tl.constexpr, GREEDY: tl.constexpr, RESTRICT: tl.constexpr, RULE: tl.constexpr,
              BLOCK_V: tl.constexpr):
    """RRS over node ``cur``'s children in rank order: (the accepted child's slot, its token, its a), slot -1 if
    every child is rejected. The main draft (rank 0) is decided as its level's slot (``informed``, the level's
    distortion ``dist``), the siblings strictly; each rejection updates the scratch's p and q (the siblings were
    drawn from ``sib_row``)."""
    params = st.params
    chosen = tl.full((), -1, tl.int64)
    chosen_x = tl.full((), -1, tl.int64)
    chosen_a = tl.zeros((), tl.float32)
    for r in range(0, K):
        slot = tl.load(children_ptr + cur * s_kn + r * s_kr)
        x = tl.load(node_ptr + b * s_nb + tl.maximum(slot, 0) * s_ns, mask=slot >= 0, other=-1).to(tl.int64)
        if (chosen < 0) & (x >= 0) & (x < V):
            sup = _in_support(c_row, u_row, x, thr, amax, bad, st.cfg_scale, st.inv_t, HAS_UNCOND, GREEDY, RESTRICT)
            q_x = tl.where(sup, tl.load(scr_q + x), 0.0)
            p_x = tl.load(scr_p + x)
            extra = tl.zeros((), tl.float32)
            if rules.is_lantern(RULE):  # the main draft's neighbours' mass, from the node's p in the scratch
                if r == 0:
                    extra = rules.lantern_bonus(nb_ptr, s_nbr, nb_k, tl.where(q_x > 0, x, -1),
                                                rules.lantern_limit(p_x, params[0], RULE), scr_p, scr_p, 0.0, 1.0, 0,
                                                0.0, 0, V, 1.0, 1.0, False, False, True, False, False)
            a_rule, a_strict = rules.acceptance(p_x, q_x, h, tvd, params, extra, RULE)
            u_acc, _u = tree_uniforms(slot, off_lo, tag, k0, k1)
            # the siblings carry no information of their own: the strict test
            a, accepted, _dist, _relaxed = rules.decide(a_rule, a_strict, (r == 0) & informed, dist,
                                                        st.max_distortion, True, u_acc)
            if accepted:
                chosen = slot
                chosen_x = x
                chosen_a = a
            else:
                if r == 0:  # the siblings were drawn from sibling_q: it is the next q
                    _rrs_update(scr_p, scr_q, sib_row, s_sv, x, V, BLOCK_V)
                else:
                    _rrs_update(scr_p, scr_q, scr_q, 1, x, V, BLOCK_V)
                tl.debug_barrier()
    return chosen, chosen_x, chosen_a


@triton.jit(do_not_specialize=["seed_stride", "offset_stride"])
def tree_kernel(
    logits_ptr, s_cb, s_cs,
    uncond_ptr, s_ub, s_us,
    q_ptr, s_qb, s_ql, s_qv,
    sib_ptr, s_sb, s_sl, s_sv,
    node_ptr, s_nb, s_ns,
    children_ptr, s_kn, s_kr,
    seed_ptr, seed_stride, offset_ptr, offset_stride,
    scratch_ptr,
    accept_len_ptr, path_ptr, tokens_ptr, acc_ptr, ent_ptr, tvd_ptr, dist_ptr, status_ptr,
    M, K, V, st, nb_ptr, s_nbr, nb_k, inf_ptr, s_ib, s_il,
    HAS_UNCOND: tl.constexpr, GREEDY: tl.constexpr, TOP_K: tl.constexpr, TOP_P: tl.constexpr, MIN_P: tl.constexpr,
    RULE: tl.constexpr, PER_ROW_SEED: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_M: tl.constexpr,
    GATHER_DIST: tl.constexpr = False, HAS_INFORMED: tl.constexpr = False,
):
    """Grid (B,): the tree walk of row b (module docstring). Outputs [B, M + 1] are kept in registers and stored once;
    ``scratch_ptr`` [B, 2, V] fp32 holds the walk's current p and q. The main draft is tested by ``RULE`` (not
    gsd: its groups need the node's row sorted), the siblings strictly (rules.py's parameters); a level whose
    ``inf_ptr`` byte [B, M] is 0 (HAS_INFORMED) has an uninformed main draft, tested strictly too."""
    b = tl.program_id(0).to(tl.int64)
    RESTRICT: tl.constexpr = TOP_K or TOP_P or MIN_P
    k0, k1, row_id = row_key(seed_ptr, seed_stride, b, PER_ROW_SEED)
    off_lo = (tl.load(offset_ptr + b * offset_stride) & 0xFFFFFFFF).to(tl.uint32)
    tag = (row_id & 0x3FFFFFFF) | TREE_TAG
    scr_p = scratch_ptr + b * 2 * V
    scr_q = scr_p + V
    inv_v = 1.0 / V  # fp32 (V may be specialised to the constant 1)
    idx = tl.arange(0, BLOCK_M)
    path_v = tl.where(idx == 0, 0, -1).to(tl.int64)
    tok_v = tl.full((BLOCK_M,), -1, tl.int64)
    acc_v = tl.zeros((BLOCK_M,), tl.float32)
    ent_v = tl.zeros((BLOCK_M,), tl.float32)
    tvd_v = tl.zeros((BLOCK_M,), tl.float32)
    dist_v = tl.zeros((BLOCK_M,), tl.float32)
    cur = tl.zeros((), tl.int64)
    done = tl.zeros((), tl.int32)
    accept_len = tl.zeros((), tl.int64)
    status = tl.zeros((), tl.int32)
    for i in range(0, M + 1):
        if done == 0:
            c_row = logits_ptr + b * s_cb + cur * s_cs
            u_row = uncond_ptr + b * s_ub + cur * s_us
            level = i  # the walk descends one level per step: node cur lies at depth i
            q_level = tl.minimum(level, M - 1)
            q_row = q_ptr + b * s_qb + q_level * s_ql
            thr, bad, m, z_sum, amax, h, tvd = _visit(c_row, u_row, q_row, s_qv, level < M, scr_p, scr_q, V, st, inv_v,
                                                      HAS_UNCOND, GREEDY, TOP_K, TOP_P, MIN_P, BLOCK_V)
            status |= tl.where(bad, S_BAD_LOGITS, 0)
            main = tl.load(children_ptr + cur * s_kn)
            x_main = tl.load(node_ptr + b * s_nb + tl.maximum(main, 0) * s_ns, mask=main >= 0, other=-1)
            informed = rules.slot_informed(inf_ptr, s_ib, s_il, b, q_level, HAS_INFORMED)
            dist = _main_distortion(c_row, u_row, q_row, s_qv, scr_p, nb_ptr, s_nbr, nb_k, V, thr, m, z_sum, amax, bad,
                                    inv_v, h, tvd, st, (x_main >= 0) & (level < M), informed, HAS_UNCOND, GREEDY,
                                    RESTRICT, RULE, GATHER_DIST, BLOCK_V)
            ent_v = tl.where(idx == i, h, ent_v)
            tvd_v = tl.where(idx == i, tvd, tvd_v)
            dist_v = tl.where(idx == i, tl.where(rules.relaxed_slot(informed, dist, st.max_distortion), dist, 0.0),
                              dist_v)
            chosen, chosen_x, chosen_a = _children(children_ptr, s_kn, s_kr, node_ptr, s_nb, s_ns, cur, b, K, c_row,
                                                   u_row, scr_p, scr_q, sib_ptr + b * s_sb + q_level * s_sl, s_sv,
                                                   nb_ptr, s_nbr, nb_k, V, thr, amax, bad, h, tvd, informed, dist, st,
                                                   off_lo, tag, k0, k1, HAS_UNCOND, GREEDY, RESTRICT, RULE, BLOCK_V)
            if chosen >= 0:
                acc_v = tl.where(idx == i, chosen_a, acc_v)
                path_v = tl.where(idx == i + 1, chosen, path_v)
                tok_v = tl.where(idx == i, chosen_x, tok_v)
                cur = chosen
            else:
                _u, u_smp = tree_uniforms(cur, off_lo, tag, k0, k1)
                tok_v = tl.where(idx == i, _draw(scr_p, u_smp, V, BLOCK_V), tok_v)
                accept_len = tl.zeros((), tl.int64) + i
                done = tl.full((), 1, tl.int32)
    out = b * (M + 1) + idx
    live = idx < M + 1
    tl.store(path_ptr + out, path_v, mask=live)
    tl.store(tokens_ptr + out, tok_v, mask=live)
    tl.store(acc_ptr + out, acc_v, mask=live)
    tl.store(ent_ptr + out, ent_v, mask=live)
    tl.store(tvd_ptr + out, tvd_v, mask=live)
    tl.store(dist_ptr + out, dist_v, mask=live)
    tl.store(accept_len_ptr + b, accept_len)
    tl.store(status_ptr + b, status)
