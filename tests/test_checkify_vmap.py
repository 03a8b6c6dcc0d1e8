"""``jax.vmap`` inside ``checkify`` (``checkify(jax.vmap(sf))``): where a check fires in two
elements of the batch, the report is the original's, the first element's, though the other
element's row comes in an earlier chunk. The chunk loop, batched, is one equation that
``checkify`` checks element by element (``_compat/_loop_call.py``), each element's loop a
batch of one, so an out-of-bounds operand that the vmap batches keeps the batched shape in
the message. Compared: ``err.get()``'s text and the values, against the original under the
same stack; every mode, under ``jit`` and eagerly."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import jaxpr_accum as ja

from .test_checkify import CHUNK, W, data, index_program, row_program, user_program


def _slow_but(fast: list, cases: list) -> list:
    """``cases`` as parameters, all but the ``fast`` ones in the slow tier."""
    return [pytest.param(*c, marks=() if c in fast else pytest.mark.slow) for c in cases]


def _two_elements(first: tuple[int, ...], second: tuple[int, ...]) -> jax.Array:
    return jnp.stack([data(first), data(second)])


def _checked_vmap(f, errors, jit: bool = True, **vmap_kw):
    run = checkify.checkify(jax.vmap(f, in_axes=(None, 0), **vmap_kw), errors=errors)
    return jax.jit(run) if jit else run


def _compare(f, xs, errors, mode: str, jit: bool = True, **vmap_kw) -> str | None:
    """The serialized function's report and values against the original's; the report."""
    sf = ja.serialize_axis(f, chunk=CHUNK, argnums=1, grad=mode)
    (got_err, got), (want_err, want) = (
        _checked_vmap(g, errors, jit, **vmap_kw)(W, xs) for g in (sf, f)
    )
    assert got_err.get() == want_err.get(), (mode, got_err.get(), want_err.get())
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=1e-6)
    return want_err.get()


#: (program, error set): a lookup whose index names the row, a lookup along a batched row
#: (its message names the batched operand's shape), a check whose message names a value
PROGRAMS = {
    "index": (index_program, checkify.index_checks),
    "row": (row_program, checkify.all_checks),
    "user": (user_program, checkify.user_checks),
}


@pytest.mark.parametrize(
    "mode, program",
    _slow_but(
        [("remat", "index"), ("native", "row")],
        list(itertools.product(ja.GRAD_MODES, sorted(PROGRAMS))),
    ),
)
def test_one_check_in_two_elements_of_a_vmap(mode, program):
    """The first element errs in the remainder (row 9), the second in the first chunk (row
    1): the original reports the first element's."""
    f, errors = PROGRAMS[program]
    reported = _compare(f, _two_elements((9,), (1,)), errors, mode)
    assert reported is not None


def test_the_first_elements_report_is_not_the_sooner_chunks():
    """The comparison can fail: the original's report names the first element's row (109),
    not the second's (101), which a loop that checks every element per chunk reports."""
    f, errors = PROGRAMS["index"]
    (err, _) = _checked_vmap(f, errors)(W, _two_elements((9,), (1,)))
    assert "index 109 " in err.get(), err.get()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ja.GRAD_MODES)
def test_eagerly_and_a_batched_operands_shape(mode):
    """Eagerly, and the lookup along a batched row: its message names ``(2, 10, 3)``."""
    reported = _compare(row_program, _two_elements((9,), (1,)), checkify.index_checks, mode, False)
    assert "shape (2, 10, 3)" in reported, reported


def _collective_program(w, x):
    """A check, and each row centred on its mean over the vmapped axis (``'b'``: the region
    stops at the ``psum``)."""
    idx = jnp.where(x[:, 0] < 0, 100 + jnp.arange(x.shape[0]), 0)
    h = jnp.tanh(x @ w) + jnp.take(w[0], idx, mode=None)[:, None]
    return jnp.mean((h - jax.lax.pmean(h, "b")) ** 2)


@pytest.mark.filterwarnings("ignore:(?s).*not expected to save")
@pytest.mark.parametrize("mode", _slow_but([("remat",)], [(m,) for m in ja.GRAD_MODES]))
def test_a_collective_over_the_named_vmapped_axis(mode):
    """Each element is checked inside a ``jax.vmap`` of the user's axis name: the user's
    ``pmean`` over it averages the whole batch (the values are the original's)."""
    xs = _two_elements((9,), (1,))
    _compare(_collective_program, xs, checkify.index_checks, mode, axis_name="b")


def _loop_program(w, x):
    """Two NaN checks in a loop of the user's: ``log`` fires at the last step only, where the
    first column is below -15; ``sqrt``, from step 0, where the second is below -1.5."""

    def body(c, s):
        return c + jnp.log(x[:, 0] + 15.0 + 10.0 * (s < 2)) + jnp.sqrt(x[:, 1] + 1.5), None

    c, _ = jax.lax.scan(body, jnp.zeros(x.shape[0]), jnp.arange(3))
    return jnp.mean(jnp.tanh(x @ w) ** 2) + jnp.mean(c)


@pytest.mark.parametrize("mode", _slow_but([("fused",)], [(m,) for m in ja.GRAD_MODES]))
def test_two_checks_in_a_loop_of_the_users_in_two_elements(mode):
    """``log`` fires in the first element (row 9) at step 2, ``sqrt`` in the second (row 1)
    from step 0: the elements' errors are made one check site at a time, the soonest firing
    first, so the report is the original's ``sqrt``, though ``log`` is first in the body
    and in the first element."""
    xs = np.array(_two_elements((), ()))
    xs[0, 9, 0], xs[1, 1, 1] = -20.0, -2.0
    reported = _compare(_loop_program, jnp.asarray(xs), checkify.nan_checks, mode)
    assert reported is not None and "sqrt" in reported, reported


def _vmapped(f):
    return jax.vmap(f, in_axes=(None, 0))


#: derivatives of a ``jax.vmap`` inside ``checkify``: the chunk loop's forward pass (of a
#: linearization, or a JVP) stays one equation that ``checkify`` checks per element
DIFFERENTIATED = {
    "grad_of_vmap": lambda f: jax.grad(lambda w, x: _vmapped(f)(w, x).sum(), argnums=(0, 1)),
    "value_and_grad_of_vmap": lambda f: jax.value_and_grad(lambda w, x: _vmapped(f)(w, x).sum()),
    "jvp_of_vmap": lambda f: (
        lambda w, x: jax.jvp(_vmapped(f), (w, x), (jnp.ones_like(w), jnp.ones_like(x)))
    ),
    "vmap_of_jvp": lambda f: _vmapped(
        lambda w, x: jax.jvp(f, (w, x), (jnp.ones_like(w), jnp.ones_like(x)))
    ),
    "vmap_of_grad": lambda f: _vmapped(jax.grad(f, argnums=(0, 1))),
}


def _differentiated_report(f, stack: str, errors, xs) -> str | None:
    return jax.jit(checkify.checkify(DIFFERENTIATED[stack](f), errors=errors))(W, xs)[0].get()


@pytest.mark.parametrize(
    "mode, stack",
    _slow_but(
        [("remat", "grad_of_vmap"), ("native", "vmap_of_jvp")],
        list(itertools.product(ja.GRAD_MODES, sorted(DIFFERENTIATED))),
    ),
)
def test_one_check_in_two_elements_of_a_differentiated_vmap(mode, stack):
    """As without the derivative: the first element errs in the remainder (row 9), the
    second in the first chunk (row 1), and the first element's error is reported."""
    f, errors = PROGRAMS["index"]
    sf = ja.serialize_axis(f, chunk=CHUNK, argnums=1, grad=mode)
    xs = _two_elements((9,), (1,))
    try:
        expected = _differentiated_report(f, stack, errors, xs)
    except IndexError:  # JAX 0.9's checkify of the lookup's transpose under vmap: so does ours
        with pytest.raises(IndexError):
            _differentiated_report(sf, stack, errors, xs)
        return
    assert expected is not None and "index 109 " in expected, expected
    assert _differentiated_report(sf, stack, errors, xs) == expected


@jax.custom_vjp
def _identity(h):
    return h


_identity.defvjp(lambda h: (h, None), lambda _, ct: (ct,))


def test_a_custom_vjp_in_a_differentiated_vmap():
    """The documented difference (docs/errors.md): JAX cannot batch the linear part a custom
    VJP leaves in a derivative apart from its loop, so the loop is differentiated batched
    and the element whose row comes in the earlier chunk is reported; the values are the
    original's."""
    f, errors = PROGRAMS["index"]

    def with_custom_vjp(w, x):
        return f(w, _identity(x))

    sf = ja.serialize_axis(with_custom_vjp, chunk=CHUNK, argnums=1, grad="remat")
    xs = _two_elements((9,), (1,))
    expected = _differentiated_report(with_custom_vjp, "grad_of_vmap", errors, xs)
    assert "index 109 " in expected, expected
    assert "index 101 " in _differentiated_report(sf, "grad_of_vmap", errors, xs)
    got, want = (DIFFERENTIATED["grad_of_vmap"](g)(W, xs) for g in (sf, with_custom_vjp))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)


@jax.custom_jvp
def _softplus(z):
    return jnp.logaddexp(z, 0.0)


_softplus.defjvp(lambda p, t: (_softplus(p[0]), t[0] * jax.nn.sigmoid(p[0])))


def _with_custom_jvp(w, x):
    return jnp.mean(_softplus(x @ w)) + index_program(w, x)  # its checks before the lookup


def _with_a_scan(w, x):
    def step(total, t):
        idx = jnp.where(x[:, 0] < 0, 100 + 10 * t + jnp.arange(x.shape[0]), 0)
        return total + jnp.take(w[0], idx, mode=None) + jnp.tanh(x @ w).sum(1) * t, None

    total, _ = jax.lax.scan(step, jnp.zeros(x.shape[0]), jnp.arange(3))
    return total.mean()


@pytest.mark.parametrize(
    "mode, program",
    _slow_but(
        [("remat", "custom_jvp")],
        list(itertools.product(("remat", "native"), ("custom_jvp", "scan"))),
    ),
)
def test_a_jaxpr_of_yours_in_a_differentiated_vmap_with_nan_checks(mode, program):
    """A custom JVP (or a scan) in the region, under ``jax.grad`` of the ``jax.vmap``, with
    the NaN checks on: JAX linearizes the chunks' body and the remainder apart (it inlines
    the custom JVP's rule in one), with different checks before the lookup; the clock counts
    steps of loops, not checks, so the first element's lookup (row 9, the remainder) is as
    soon as the second's (row 1) and is reported, as by the original."""
    f = {"custom_jvp": _with_custom_jvp, "scan": _with_a_scan}[program]
    errors = checkify.index_checks | checkify.nan_checks
    sf = ja.serialize_axis(f, chunk=CHUNK, argnums=1, grad=mode)
    xs = _two_elements((9,), (1,))
    expected = _differentiated_report(f, "grad_of_vmap", errors, xs)
    assert expected is not None and "index 109 " in expected, expected
    assert _differentiated_report(sf, "grad_of_vmap", errors, xs) == expected


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["remat", "native"])
def test_two_checks_in_a_loop_of_yours_under_grad_with_respect_to_the_rows(mode):
    """As ``test_two_checks_in_a_loop_of_the_users_in_two_elements``, under ``jax.grad`` with
    respect to the chunked input inside the ``jax.vmap``: remat's backward pass recomputes
    each chunk batched over the elements, and its checks made again reported ``log`` (step
    2 of the first element) until they kept the forward pass's error (the original's
    ``sqrt``, step 0 of the second)."""
    xs = np.array(_two_elements((), ()))
    xs[0, 9, 0], xs[1, 1, 1] = -20.0, -2.0
    sf = ja.serialize_axis(_loop_program, chunk=CHUNK, argnums=1, grad=mode)
    stacked = lambda g: _vmapped(jax.grad(g, argnums=1))  # noqa: E731
    want, got = (
        jax.jit(checkify.checkify(stacked(g), errors=checkify.nan_checks))(W, jnp.asarray(xs))
        for g in (_loop_program, sf)
    )
    assert want[0].get() is not None and "sqrt" in want[0].get(), want[0].get()
    assert got[0].get() == want[0].get()
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=2e-5, atol=1e-6)
