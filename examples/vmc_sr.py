"""Stochastic reconfiguration (natural gradient) for a neural-network wavefunction, in chunks.

Variational Monte Carlo as NetKet does it: a restricted Boltzmann machine gives the
log-amplitude ``log_psi(params, sigma)`` of spin configurations ``sigma`` [N, L], the
configurations are Monte-Carlo samples of ``|psi|^2`` (a Metropolis chain per sample), and
each step solves the stochastic-reconfiguration system ``(S + eps) dtheta = F`` for the update,
where, with ``O = d log_psi / d theta`` (the [N, P] Jacobian ``J``) centred over the samples,

    S v = J^T (J v - mean(J v)) / N            (the quantum geometric tensor, never formed)
    F   = J^T (E_loc - mean(E_loc)) / N        (the force)

and ``E_loc`` are the local energies of a transverse-field Ising chain,
``H = -sum_i Z_i Z_{i+1} - h sum_i X_i`` (periodic), computed from ``log_psi`` ratios of
single-spin flips. ``S v`` is a ``jax.jvp`` (``J v``) followed by a ``jax.vjp`` (``J^T u``),
as in NetKet's on-the-fly geometric tensor, and ``jax.scipy.sparse.linalg.cg`` solves the
system with it.

Every ``J v`` and ``J^T u`` holds the network's activations for all N samples. Here the
log-amplitude is decorated with ``ja.serialize_axis(chunk=N // 8, argnums=1)`` (the samples
axis of ``sigma``): the ``jax.jvp`` runs primal and tangent 1/8 of the samples at a time, the
``jax.vjp`` recomputes each chunk in its backward pass, and nothing else in the code changes.

The script prints the XLA temp memory and the time of ``jax.jit`` of the ``S v`` product
(jvp then vjp), serialized against the undecorated ``log_psi`` (``log_psi.original``), checks
one SR update against the same computation with the undecorated function (relative difference
per leaf), checks the matrix-free ``S v`` on a few samples against a dense ``S`` built from a
Jacobian computed by ``jax.jacrev`` serialized over its basis (a chunked Jacobian), and runs a
few SR steps, printing the energy per site (the exact ground-state energy of the infinite chain at
``h = 1`` is ``-4/pi = -1.2732`` per site).

Run: ``python examples/vmc_sr.py`` (``--quick``: smaller sizes, fewer steps).
"""

import statistics
import sys
import time
from functools import partial

import jax
import jax.numpy as jnp
from jax.scipy.sparse.linalg import cg

import jaxpr_accum as ja
from jaxpr_accum.testing import tree_difference

QUICK = "--quick" in sys.argv[1:]
L, ALPHA = (10, 4) if QUICK else (16, 4)  # spins; hidden units per spin
N = 1024 if QUICK else 4096  # Monte-Carlo samples
CHUNK = N // 8
N_DENSE, DENSE_CHUNK = 256, 32  # the dense-S check: samples, Jacobian rows per chunk
H_FIELD, DIAG_SHIFT, LEARNING_RATE, CG_ITERS = 1.0, 0.01, 0.05, 30
STEPS = 3 if QUICK else 10
SWEEPS = 2  # Metropolis sweeps of L single-spin flips between SR steps


# ---- the wavefunction: the one decorated function --------------------------------------------


@ja.serialize_axis(chunk=CHUNK, argnums=1)
def log_psi(params, sigma):
    """log psi(sigma) of an RBM, one value per configuration (sigma: [n, L] of +-1)."""
    theta = sigma @ params["w"] + params["b"]
    return sigma @ params["a"] + jnp.sum(jnp.logaddexp(theta, -theta) - jnp.log(2.0), axis=-1)


def init_params(key):
    k1, k2 = jax.random.split(key)
    return {
        "a": jnp.zeros(L),
        "b": 0.01 * jax.random.normal(k1, (ALPHA * L,)),
        "w": 0.01 * jax.random.normal(k2, (L, ALPHA * L)),
    }


# ---- Monte Carlo: samples and local energies -------------------------------------------------


@partial(jax.jit, static_argnums=0)
def metropolis(log_psi, params, sigma, key):
    """``SWEEPS * L`` single-spin-flip Metropolis steps of every chain (one chain per sample)."""
    rows = jnp.arange(sigma.shape[0])

    def step(carry, key):
        sigma, lp = carry
        k_site, k_accept = jax.random.split(key)
        site = jax.random.randint(k_site, (sigma.shape[0],), 0, L)
        proposal = sigma.at[rows, site].multiply(-1.0)
        lp_new = log_psi(params, proposal)
        accept = jnp.log(jax.random.uniform(k_accept, lp.shape)) < 2.0 * (lp_new - lp)
        return (jnp.where(accept[:, None], proposal, sigma), jnp.where(accept, lp_new, lp)), None

    keys = jax.random.split(key, SWEEPS * L)
    (sigma, _), _ = jax.lax.scan(step, (sigma, log_psi(params, sigma)), keys)
    return sigma


def local_energy(log_psi, params, sigma):
    """E_loc(sigma) = <sigma|H|psi> / <sigma|psi> for the transverse-field Ising chain."""
    n = sigma.shape[0]
    zz = jnp.sum(sigma * jnp.roll(sigma, -1, axis=1), axis=1)
    flips = sigma[:, None, :] * (
        1.0 - 2.0 * jnp.eye(L, dtype=sigma.dtype)
    )  # [n, L, L]: each spin flipped once
    lp = log_psi(params, sigma)
    lp_flips = log_psi(params, flips.reshape(n * L, L)).reshape(n, L)
    return -zz - H_FIELD * jnp.sum(jnp.exp(lp_flips - lp[:, None]), axis=1)


# ---- stochastic reconfiguration -------------------------------------------------------------


def s_dot_v(log_psi, params, sigma, v):
    """S v = J^T (J v - mean(J v)) / N: a jvp, then a vjp, of ``log_psi`` over the samples."""

    def f(p):
        return log_psi(p, sigma)

    jv = jax.jvp(f, (params,), (v,))[1]
    return jax.vjp(f, params)[1]((jv - jv.mean()) / sigma.shape[0])[0]


@partial(jax.jit, static_argnums=0)
def sr_update(log_psi, params, sigma):
    """The SR update dtheta, solving (S + DIAG_SHIFT) dtheta = F, and the mean energy."""
    e_loc = jax.lax.stop_gradient(local_energy(log_psi, params, sigma))
    e_mean = e_loc.mean()
    _, pullback = jax.vjp(lambda p: log_psi(p, sigma), params)
    force = pullback((e_loc - e_mean) / sigma.shape[0])[0]

    def matvec(v):
        sv = s_dot_v(log_psi, params, sigma, v)
        return jax.tree.map(lambda s, x: s + DIAG_SHIFT * x, sv, v)

    update, _ = cg(matvec, force, maxiter=CG_ITERS, tol=0.0)  # a fixed number of iterations
    return update, e_mean


# ---- the checks ------------------------------------------------------------------------------


def temp_bytes(compiled):
    return compiled.memory_analysis().temp_size_in_bytes


def paired_time_ratio(f, g, args, rounds=15):
    """Median over interleaved rounds of time(f) / time(g) (both compiled)."""
    ratios = []
    for i in range(rounds + 1):
        times = {}
        for name, h in (("f", f), ("g", g)) if i % 2 else (("g", g), ("f", f)):
            t0 = time.perf_counter()
            jax.block_until_ready(h(*args))
            times[name] = time.perf_counter() - t0
        if i:  # round 0 warms up
            ratios.append(times["f"] / times["g"])
    return statistics.median(ratios)


def check_s_dot_v(params, sigma, v):
    compiled = {
        name: jax.jit(partial(s_dot_v, f)).lower(params, sigma, v).compile()
        for name, f in (("serialized", log_psi), ("original", log_psi.original))
    }
    m_ser, m_orig = temp_bytes(compiled["serialized"]), temp_bytes(compiled["original"])
    ratio = paired_time_ratio(compiled["serialized"], compiled["original"], (params, sigma, v))
    print(
        f"XLA temp memory of jit(S v) (jvp then vjp over {N} samples): original {m_orig:,} B, "
        f"serialized {m_ser:,} B ({m_ser / m_orig:.2f}x); time {ratio:.2f}x the original's "
        "(median of 15 paired rounds)"
    )
    diff = tree_difference(
        compiled["serialized"](params, sigma, v), compiled["original"](params, sigma, v)
    )
    print(f"S v: largest relative difference per leaf {diff.max_rel:.1e}")
    assert diff.max_rel <= 2e-4, diff


def check_update(params, sigma):
    """One SR update, serialized against undecorated, each leaf relative to its own largest
    entry. Both are float32 solves whose rounding CG amplifies, most visibly on the small bias
    leaf ``b``: against a float64 solve of the same system (default sizes), the original's own
    error on ``b`` is 6.2e-4 and the serialized's 1.2e-4 (2.7e-4 and 2.6e-4 with ``--quick``).
    So each leaf is compared to 2e-3 of its own scale, and to 2e-4 of the whole update's."""
    got, e_got = sr_update(log_psi, params, sigma)
    ref, e_ref = sr_update(log_psi.original, params, sigma)
    diff = {k: float(jnp.max(jnp.abs(got[k] - ref[k]))) for k in ref}
    rel = {k: diff[k] / float(jnp.max(jnp.abs(ref[k]))) for k in ref}
    scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(ref))
    print(
        "SR update, relative difference per leaf (max |serialized - original| / max |original|): "
        + ", ".join(f"{k} {r:.1e}" for k, r in rel.items())
        + f"; energy {float(e_got):.6f} vs {float(e_ref):.6f}"
    )
    assert max(rel.values()) <= 2e-3 and max(diff.values()) <= 2e-4 * scale, rel
    assert abs(float(e_got - e_ref)) <= 1e-5 * abs(float(e_ref)), (e_got, e_ref)


def check_dense_s(params, sigma, v):
    """A small check of the matrix-free S v on the first ``N_DENSE`` samples: the dense S from
    the Jacobian O = jax.jacrev(log_psi) [N_DENSE, P], computed with ``serialize_axis`` over the
    Jacobian's basis (the ``N_DENSE`` outputs, an axis born inside ``jax.jacrev``, named by
    ``size=``): ``jax.jacrev`` pulls back every basis vector through all the samples'
    activations at once, the serialized Jacobian ``DENSE_CHUNK`` basis vectors at a time."""
    sub = sigma[:N_DENSE]

    def jacobian(params, sigma):
        return jax.jacrev(log_psi.original)(params, sigma)

    chunked = ja.serialize_axis(jacobian, chunk=DENSE_CHUNK, size=N_DENSE)
    m = {
        name: temp_bytes(jax.jit(f).lower(params, sub).compile())
        for name, f in (("serialized", chunked), ("original", jacobian))
    }
    print(
        f"XLA temp memory of jit(jacrev(log_psi)) on {N_DENSE} samples (a basis of {N_DENSE} "
        f"in chunks of {DENSE_CHUNK}): original {m['original']:,} B, serialized "
        f"{m['serialized']:,} B ({m['serialized'] / m['original']:.2f}x)"
    )
    jac = chunked(params, sub)
    diff = tree_difference(jac, jacobian(params, sub))
    print(f"chunked Jacobian: largest relative difference per leaf {diff.max_rel:.1e}")
    assert diff.max_rel <= 2e-4, diff
    o = jnp.concatenate([j.reshape(N_DENSE, -1) for j in jax.tree.leaves(jac)], axis=1)
    o = o - o.mean(0)  # centred O: [N_DENSE, P]
    s = o.T @ o / N_DENSE
    dense = s @ jnp.concatenate([x.ravel() for x in jax.tree.leaves(v)])
    # (the undecorated log_psi: 256 samples are a single chunk of the decorated one)
    sv = s_dot_v(log_psi.original, params, sub, v)
    sv = jnp.concatenate([x.ravel() for x in jax.tree.leaves(sv)])
    rel = float(jnp.max(jnp.abs(dense - sv)) / jnp.max(jnp.abs(dense)))
    print(f"dense S ({s.shape[0]} x {s.shape[1]}) @ v against the matrix-free S v: {rel:.1e}")
    assert rel <= 1e-4, rel


def main():
    k_init, k_sigma, k_v, k_chain = jax.random.split(jax.random.key(0), 4)
    params = init_params(k_init)
    sigma = jax.random.choice(k_sigma, jnp.array([-1.0, 1.0]), (N, L))
    v = jax.tree.map(lambda x: jax.random.normal(k_v, x.shape), params)
    print(
        f"RBM with {sum(x.size for x in jax.tree.leaves(params))} parameters, {L} spins, "
        f"{N} samples in chunks of {CHUNK}"
    )
    print(log_psi.explain(params, sigma))

    sigma = metropolis(log_psi, params, sigma, k_chain)
    check_s_dot_v(params, sigma, v)
    check_update(params, sigma)
    check_dense_s(params, sigma, v)

    for step in range(STEPS):
        k_chain, key = jax.random.split(k_chain)
        sigma = metropolis(log_psi, params, sigma, key)
        update, energy = sr_update(log_psi, params, sigma)
        params = jax.tree.map(lambda p, u: p - LEARNING_RATE * u, params, update)
        print(f"step {step}: energy per site {float(energy) / L:.4f}")
        assert jnp.isfinite(energy)


if __name__ == "__main__":
    main()
