"""``jax.experimental.checkify`` over a serialized function reports what the original reports
(issue 46, item 1): every error set (``user_checks``, ``index_checks``, ``div_checks``,
``nan_checks``, ``float_checks``, ``all_checks``), every gradient mode, forward calls,
``grad``, ``value_and_grad``, ``jvp``, ``vmap`` (outside and inside ``checkify``) and
``grad`` of a checkified function, under ``jax.jit`` and eagerly. The text of ``err.get()``
is compared with the original's under the same stack; a clean program reports None and never
raises. The errors sit in rows of the axis chosen per case: in a full chunk, in the remainder,
in both (the first row in the axis's order is the one reported, an out-of-bounds index names
its row), or nowhere.

The default tier runs a few cases; the matrix is slow.
"""

from __future__ import annotations

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import checkify

import jaxpr_accum as ja

from .oracle import covering

N, D, CHUNK = 10, 3, 4  # chunks: rows 0-3, 4-7, and the remainder 8-9
W = jnp.asarray(np.random.RandomState(46).normal(size=(D, D)) * 0.3, jnp.float32)
NOT_WORTH_IT = "(?s).*not expected to save"


def index_program(w, x):
    h = jnp.tanh(x @ w)
    bad = x[:, 0] < 0
    idx = jnp.where(bad, 100 + jnp.arange(x.shape[0]), 0)  # names the erroring row
    return jnp.mean((h + jnp.take(w[0], idx, mode=None)[:, None]) ** 2)


def div_program(w, x):
    h = jnp.tanh(x @ w)
    return jnp.mean((h + 1 // (x[:, :1] >= 0).astype(jnp.int32)) ** 2)


def nan_program(w, x):
    h = jnp.log(jnp.abs(x @ w) + x[:, :1])  # NaN where the row's first entry is negative
    return jnp.mean(jnp.where(jnp.isnan(h), 0.0, h) ** 2)


def user_program(w, x):
    h = jnp.tanh(x @ w)
    checkify.check(jnp.all(x[:, 0] >= 0), "a negative row, min {m}", m=jnp.min(x[:, 0]))
    return jnp.mean(h**2)


def backward_program(w, x):
    """Clean forward; the gradient of ``sqrt`` at 0 makes a NaN in the backward pass."""
    h = jnp.where(x[:, :1] < 0, 0.0, x @ w)
    return jnp.mean(jnp.sqrt(h * h))


def order_program(w, x):
    """Two out-of-bounds lookups: the first fires in row 9 only (the remainder), the second in
    every negative row; the original reports the first (it runs on every row before the
    second), and so does the chunk loop, though the second fires in an earlier chunk."""
    h = jnp.tanh(x @ w)
    first = jnp.where(x[:, 0] < -9.5, 100 + jnp.arange(x.shape[0]), 0)
    second = jnp.where(x[:, 0] < 0, 200 + jnp.arange(x.shape[0]), 0)
    looked_up = jnp.take(w[0], first, mode=None) + jnp.take(w[0], second, mode=None)
    return jnp.mean((h + looked_up[:, None]) ** 2)


def kinds_program(w, x):
    """Two kinds of error: a NaN from ``log`` in row 9 only (the remainder), then an
    out-of-bounds lookup in every negative row; the original reports the NaN (its check runs
    on every row first), though the lookup fires in an earlier chunk."""
    h = jnp.tanh(x @ w) + jnp.log(x[:, :1] + 9.5)
    idx = jnp.where(x[:, 0] < 0, 100 + jnp.arange(x.shape[0]), 0)
    return jnp.mean((h + jnp.take(w[0], idx, mode=None)[:, None]) ** 2)


def row_program(w, x):
    """An out-of-bounds lookup along each row of a chunked operand: the report names the
    operand's shape as written, (10, 3), not the chunk's."""
    h = jnp.tanh(x @ w)
    idx = jnp.where(x[:, :1] < 0, 7, 0)
    return jnp.mean((h + jnp.take_along_axis(h, idx, axis=1, mode=None)) ** 2)


def after_program(w, x):
    """A NaN only in the backward pass (the derivative of ``sqrt`` at 0), then one after the
    region in the forward pass: the original reports the forward pass's ``log``, though
    fused finds the backward pass's NaN first (it computes the gradient with the value)."""
    h = jnp.where(x[:, :1] < 0, 0.0, x @ w)
    return jnp.log(jnp.mean(jnp.sqrt(h * h)) - 100.0)


def derivative_program(w, x):
    """``sqrt`` at 0, whose derivative divides by zero in the original's forward pass, then
    a NaN from ``log`` (row 9): the original reports the division, which remat and native
    make when the backward pass recomputes the chunk."""
    h = jnp.where(x[:, :1] < 0, 0.0, x @ w)
    return jnp.mean((jnp.sqrt(h * h) + jnp.log(x[:, :1] + 9.5)) ** 2)


def infinities_program(w, x):
    """``+inf`` in the negative rows above -5 (row 2, the first chunk) and ``-inf`` in those
    below (row 9, the remainder): their sum over the axis is a NaN, which the original makes
    in its one ``reduce_sum`` and the chunk loop where it adds the chunks' sums."""
    inf = jnp.where(x[:, :1] < -5, -jnp.inf, jnp.inf)
    h = jnp.tanh(x @ w) + jnp.where(x[:, :1] < 0, inf, 0.0)
    return jnp.sum(h)


def infinities_dot_program(w, x):
    """As ``infinities_program``, summed over the axis by a product (``dot_general``)."""
    inf = jnp.where(x[:, :1] < -5, -jnp.inf, jnp.inf)
    h = jnp.tanh(x @ w) + jnp.where(x[:, :1] < 0, inf, 0.0)
    return jnp.sum(jnp.ones(x.shape[0]) @ h)


@jax.custom_vjp
def _index_in_backward(h, bad):
    return h


def _index_forward(h, bad):
    return h, bad


def _index_backward(bad, ct):
    idx = jnp.where(bad, 100 + jnp.arange(bad.shape[0])[:, None], 0)
    return ct + jnp.take(jnp.ones(3), idx, mode=None), None


_index_in_backward.defvjp(_index_forward, _index_backward)


def backward_index_program(w, x):
    """A custom VJP whose backward rule alone looks up out of bounds in the negative rows:
    the first row is reported (JAX's transpose of native's loop visits the chunks from the
    last), and the error names the line of the call."""
    return jnp.mean(_index_in_backward(jnp.tanh(x @ w), x[:, :1] < 0) ** 2)


PROGRAMS = {
    "index": index_program,
    "div": div_program,
    "nan": nan_program,
    "user": user_program,
    "backward": backward_program,
    "order": order_program,
    "kinds": kinds_program,
    "row": row_program,
    "after": after_program,
    "derivative": derivative_program,
    "backward_index": backward_index_program,
    "infinities": infinities_program,
    "infinities_dot": infinities_dot_program,
}
ERRORS = {
    "user": checkify.user_checks,
    "index": checkify.index_checks,
    "div": checkify.div_checks,
    "nan": checkify.nan_checks,
    "float": checkify.float_checks,
    "all": checkify.all_checks,
}
#: which rows are negative: a full chunk's row, the remainder's, both, none
ROWS = {"chunk": (5,), "remainder": (9,), "both": (9, 2), "clean": ()}


def data(rows: tuple[int, ...]) -> jax.Array:
    x = np.abs(np.random.RandomState(7).normal(size=(N, D))) + 0.1
    for r in rows:
        x[r] = -(r + 1.0)
    return jnp.asarray(x, jnp.float32)


def _grad_of_checkified(f, errors):
    def loss_with_error(w, x):
        err, out = checkify.checkify(f, errors=errors)(w, x)
        return out, err

    def run(w, x):
        g, err = jax.grad(loss_with_error, argnums=(0, 1), has_aux=True)(w, x)
        return err, g

    return run


def stack(f, how: str, errors):
    """``(w, x) -> Error``: the program under the stack ``how``."""
    ones = (jnp.ones((D, D)), jnp.ones((N, D)))
    inner = {
        "forward": f,
        "grad": jax.grad(f, argnums=(0, 1)),
        "value_and_grad": jax.value_and_grad(f),
        "jvp": lambda w, x: jax.jvp(f, (w, x), ones),
        "vmap_inside": jax.vmap(f, in_axes=(None, 0)),
    }
    if how == "vmap_outside":
        run = jax.vmap(checkify.checkify(f, errors=errors), in_axes=(None, 0))
    elif how == "grad_of_checkify":
        run = _grad_of_checkified(f, errors)
    else:
        run = checkify.checkify(inner[how], errors=errors)
    return lambda w, x: run(w, x)[0]


def report(f, how: str, errors, rows: tuple[int, ...], jit: bool) -> str | None:
    x = data(rows)
    if how.startswith("vmap"):
        x = jnp.stack([data(()), x])  # the second row of the vmapped axis errs
    run = stack(f, how, errors)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", NOT_WORTH_IT, ja.PlanWarning)
        return (jax.jit(run) if jit else run)(W, x).get()


def check_case(program: str, errors: str, mode: str, how: str, rows: str, jit: bool) -> None:
    f = PROGRAMS[program]
    expected = report(f, how, ERRORS[errors], ROWS[rows], jit)
    sf = ja.serialize_axis(f, chunk=CHUNK, argnums=1, grad=mode)
    got = report(sf, how, ERRORS[errors], ROWS[rows], jit)
    assert got == expected, (program, errors, mode, how, rows, jit)
    if rows == "clean":
        assert expected is None


FAST = [
    ("index", "index", "remat", "forward", "both", True),
    ("order", "index", "remat", "forward", "both", True),
]


@pytest.mark.parametrize("case", FAST, ids=lambda c: "-".join(map(str, c)))
def test_checkify_reports_as_the_original(case):
    check_case(*case)


def test_the_order_case_can_fail():
    """In ``order_program`` the two checks report different rows: a chunk loop that kept the
    check firing in the earlier chunk would differ from the original."""
    expected = report(order_program, "forward", checkify.index_checks, (9, 2), jit=True)
    assert expected and "index 109 " in expected
    assert "index 202 " in report(order_program, "forward", checkify.index_checks, (2,), True)


#: the chunk loops that JAX derives from the region's passes, or that native emits, which
#: JAX's checkify interprets equation by equation: ``grad="native"``'s, ``jax.jvp``'s and
#: ``jax.vmap``'s loops inside ``checkify``, fused's forward that computes the gradient, and
#: a backward pass
DERIVED_LOOPS = [
    ("native", "forward"),
    ("remat", "jvp"),
    ("auto", "vmap_inside"),
    ("fused", "value_and_grad"),
    ("native", "grad"),
]


#: (program, error set, mode, how): every derived loop with two checks of one kind and of two kinds;
#: the chunked operand's shape where the original runs (JAX's checkify of the original
#: raises under a derivative of ``take_along_axis``); the first in the default tier
DERIVED_CASES = [
    (program, "all", mode, how)
    for mode, how in DERIVED_LOOPS
    for program in ("order", "kinds", "row")
    if not (program == "row" and how in ("grad", "value_and_grad"))
] + [  # the order of the forward and the backward pass (``after``: NaNs only, since under
    # all_checks the derivative of ``sqrt`` divides by zero first, in the forward pass)
    ("after", "nan", "fused", "value_and_grad"),
    ("after", "nan", "auto", "grad"),
    ("derivative", "all", "remat", "grad"),
    ("derivative", "all", "native", "value_and_grad"),
    ("backward_index", "all", "native", "grad"),
    ("backward_index", "all", "remat", "value_and_grad"),
]


@pytest.mark.parametrize(
    "program, errors, mode, how",
    DERIVED_CASES[:1] + [pytest.param(*c, marks=pytest.mark.slow) for c in DERIVED_CASES[1:]],
)
def test_derived_loops_report_as_the_original(program, errors, mode, how):
    """Of two checks that fire, the first in the program is reported, with its first erroring
    row (``order``: one kind; ``kinds``: the earlier kind fires only in the remainder; the
    forward pass's before the backward pass's: ``after``, ``derivative``); an out-of-bounds
    index into a chunked operand names its shape as written (``row``)."""
    check_case(program, errors, mode, how, "both", True)


def test_the_derived_cases_can_fail():
    """``kinds`` reports the NaN of the remainder, not the lookup of the earlier chunk;
    ``row`` names the shape (10, 3); ``after`` the forward pass's ``log``, ``derivative``
    the division, ``backward_index`` row 2."""
    expected = report(kinds_program, "forward", checkify.all_checks, (9, 2), jit=True)
    assert expected and expected.startswith("nan generated by primitive: log")
    assert "(10, 3)" in report(row_program, "forward", checkify.index_checks, (9, 2), True)
    after = report(after_program, "grad", checkify.nan_checks, (9, 2), True)
    assert after and after.startswith("nan generated by primitive: log")
    derivative = report(derivative_program, "grad", checkify.all_checks, (9, 2), True)
    assert derivative == "division by zero"
    index = report(backward_index_program, "grad", checkify.index_checks, (9, 2), True)
    assert index and "index 102 " in index


def test_the_comparison_can_fail():
    """The first erroring row is in the report: a case whose serialized copy reported another
    row, or dropped the error, would differ from the original."""
    f = index_program
    first = report(f, "forward", checkify.index_checks, (2,), jit=True)
    second = report(f, "forward", checkify.index_checks, (9,), jit=True)
    assert first and second and first != second and "index 102 " in first


HOWS = ("forward", "grad", "value_and_grad", "jvp", "vmap_inside", "vmap_outside")
PAIRS = [  # (program, error set): each program's own set, and all_checks
    ("index", "index"), ("div", "div"), ("nan", "nan"), ("nan", "float"), ("user", "user"),
    ("backward", "nan"), ("index", "all"), ("user", "all"), ("div", "all"),
]  # fmt: skip
STACKS = [("both", True), ("clean", True), ("both", False)]
#: the slow tier's rows: every mode meets every transformation, each with one of the
#: (program, error set) pairs and one stack in rotation (every pair and stack met); every
#: mode meets every pair with an error in a full chunk and in the remainder (the whole
#: product: JAXPR_ACCUM_FULL_MATRIX=1)
SLOW = [
    (program, errors, mode, how, rows, jit)
    for param in covering(list(itertools.product(ja.GRAD_MODES, HOWS)), PAIRS, STACKS, per=1)
    for mode, how, (program, errors), (rows, jit) in [param.values]
] + [
    (program, errors, mode, "forward", rows, True)
    for param in covering(ja.GRAD_MODES, PAIRS, ("chunk", "remainder"))
    for mode, (program, errors), rows in [param.values]
]


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW, ids=lambda c: "-".join(map(str, c)))
def test_checkify_matrix(case):
    check_case(*case)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ja.GRAD_MODES)
@pytest.mark.parametrize("rows", ["chunk", "clean"])
def test_grad_of_a_checkified_function(mode, rows):
    for program in ("index", "nan", "backward"):
        check_case(program, "all", mode, "grad_of_checkify", rows, True)


@pytest.mark.slow
@pytest.mark.parametrize("mode, how", [("auto", "forward"), ("fused", "vmap_outside")])
def test_two_checks_of_one_kind(mode, how):
    """Of two checks of one kind that fire, the first in the program is reported, wherever
    the region's own checkify rule runs the loop (docs/errors.md; remat: ``FAST``)."""
    check_case("order", "all", mode, how, "both", True)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ja.GRAD_MODES)
def test_float64(mode):
    with jax.enable_x64(True):
        for program in ("nan", "index"):
            check_case(program, "all", mode, "value_and_grad", "both", True)


def _scan_program(w, x):
    """Two NaN checks in a loop of the user's: the first in the body (``mul`` of the carried
    value) fires from step 1, the second (``log``, row 7) at step 0."""

    def body(c, _):
        return c * 2.0 + 1.0 + jnp.log(x[:, 0] + 5.0), None

    c, _ = jax.lax.scan(body, jnp.zeros(x.shape[0]), jnp.arange(3))
    return jnp.mean(jnp.tanh(x @ w) ** 2) + jnp.mean(c)


def _steps_body(x):
    """A step whose first check (``sqrt``, row 1) fires at step 3 only, and whose second
    (``log``, row 9: the remainder) fires from step 0."""

    def body(c, t):
        return c + jnp.sqrt(jnp.abs(x[:, 1] + 2.0) + 2.5 - t) * jnp.log(x[:, 0] + 5.0)

    return body


def _scan_across_chunks(w, x):
    body = _steps_body(x)
    c, _ = jax.lax.scan(lambda c, t: (body(c, t), None), jnp.zeros(x.shape[0]), jnp.arange(4.0))
    return jnp.mean(jnp.tanh(x @ w) ** 2) + jnp.mean(c)


def _while_across_chunks(w, x):
    body = _steps_body(x)
    c, _ = jax.lax.while_loop(
        lambda s: s[1] < 4.0, lambda s: (body(s[0], s[1]), s[1] + 1.0), (jnp.zeros(x.shape[0]), 0.0)
    )
    return jnp.mean(jnp.tanh(x @ w) ** 2) + jnp.mean(c)


LOOPS = {
    "scan, one chunk": (_scan_program, (7,)),
    "scan, two chunks": (_scan_across_chunks, (1, 9)),
    "while, two chunks": (_while_across_chunks, (1, 9)),
}


def test_two_checks_in_a_loop_of_the_users_fast():
    """The original reports the check that fires at the earlier step (``log``), not the one
    first in the loop's body: each chunk's checks carry the step at which they first fired
    (``_sites``' clock)."""
    check_case_of(_scan_program, "nan", "remat", "forward", (7,))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["remat", "fused", "native"])
@pytest.mark.parametrize("how", ["forward", "value_and_grad"])
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_two_checks_in_a_loop_of_the_users(loop, how, mode):
    """As ``..._fast``, in every mode, with the earlier step's check in another chunk (the
    remainder) than the check first in the body, in a ``scan`` and a ``while_loop``."""
    program, rows = LOOPS[loop]
    check_case_of(program, "nan", mode, how, rows)


#: (mode, how, program): a NaN made by adding ``+inf`` and ``-inf`` of different chunks;
#: every mode with every transformation, the two reductions in rotation
SUMS = [
    (mode, how, program)
    for i, (mode, how) in enumerate(
        itertools.product(ja.GRAD_MODES, ("forward", "value_and_grad", "jvp", "vmap_inside"))
    )
    for program in [("infinities", "infinities_dot")[i % 2]]
]


@pytest.mark.parametrize(
    "mode, how, program",
    [SUMS[1]] + [pytest.param(*c, marks=pytest.mark.slow) for c in SUMS[:1] + SUMS[2:]],
)
def test_a_nan_made_by_adding_the_chunks_sums(mode, how, program):
    """The NaN that ``+inf`` and ``-inf`` make where the chunks' sums are added is reported
    as the original's, made by its reduction (``reduce_sum``, ``dot_general``) at its line."""
    check_case(program, "nan", mode, how, "both", True)
    f, sf = PROGRAMS[program], ja.serialize_axis(PROGRAMS[program], chunk=CHUNK, argnums=1)
    assert _line_reported(sf, how) == _line_reported(f, how) is not None


def _line_reported(f, how: str) -> int | None:
    """The line of this file that the NaN's report names."""
    x = data(ROWS["both"])
    x = jnp.stack([data(()), x]) if how.startswith("vmap") else x
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", NOT_WORTH_IT, ja.PlanWarning)
        exc = stack(f, how, checkify.nan_checks)(W, x).get_exception()
    lines = [fr.line_num for fr in exc.traceback_info.frames if fr.file_name == __file__]
    return lines[0] if lines else None


def test_the_sums_case_can_fail():
    """The original names its reduction: a chunk loop that named its own ``add`` differs."""
    for program, made_by in [("infinities", "reduce_sum"), ("infinities_dot", "dot_general")]:
        expected = report(PROGRAMS[program], "forward", checkify.nan_checks, (9, 2), True)
        assert expected == f"nan generated by primitive: {made_by}."
    chunk_only = report(infinities_program, "forward", checkify.nan_checks, (2,), True)
    assert chunk_only is None  # ``+inf`` alone: no NaN


def check_case_of(f, errors: str, mode: str, how: str, rows: tuple[int, ...]) -> None:
    expected = report(f, how, ERRORS[errors], rows, True)
    sf = ja.serialize_axis(f, chunk=CHUNK, argnums=1, grad=mode)
    assert report(sf, how, ERRORS[errors], rows, True) == expected


def as_written_first_program(w, x):
    """A NaN in a part that runs as written (a ``lax.cond`` whose branch sums over the axis),
    then one in the region's negative rows: the original reports the part's ``log``, which
    runs before the loop since it comes before the region in the program."""
    s = jax.lax.cond(x[0, 0] > -1e9, lambda v: jnp.log(jnp.sum(v) - 1e6), jnp.sum, x)
    h = jnp.sqrt(jnp.tanh(x @ w) + x[:, :1])
    return jnp.mean(h**2) + s


def parameters_last_program(w, x):
    """A NaN in the region's negative rows, then one in a value of the parameters alone,
    which the loop does not need: the original reports the region's ``sqrt``, and the
    penalty runs after the loop since it comes after the region in the program."""
    h = jnp.sqrt(jnp.tanh(x @ w) + x[:, :1])
    penalty = jnp.log(jnp.sum(w) - 1e3)
    return jnp.mean(h**2) + penalty


def parameters_between_program(w, x):
    """A penalty between the region's operations runs after the loop: its ``log`` is
    reported, before the region's ``sqrt`` after it, as in the original."""
    h = jnp.tanh(x @ w)
    penalty = jnp.log(jnp.sum(w) - 1e3)
    h = jnp.sqrt(h + x[:, :1])
    return jnp.mean(h**2) + penalty


def sorted_first_program(w, x):
    """The sort reads the column the loop takes per chunk, so it runs after the loop: its
    ``log`` is reported, before the region's ``sqrt``, as in the original."""
    s = jnp.log(jnp.sort(x[:, 1])[0] - 1e3)
    h = jnp.sqrt(jnp.tanh(x @ w) + x[:, :1])
    return jnp.mean(h**2) + s


def region_before_the_penalty_program(w, x):
    """The region's ``sqrt``, then a penalty that runs after the loop, then more of the
    region: the ``sqrt`` is reported (the penalty's ``log`` replaces only what the region
    finds after it)."""
    h = jnp.sqrt(jnp.tanh(x @ w) + x[:, :1])
    penalty = jnp.log(jnp.sum(w) - 1e3)
    h = jnp.log(h + x[:, 1:2])
    return jnp.mean(h**2) + penalty


def division_between_program(w, x):
    """An integer division by zero between the region's operations, then the region's NaN:
    the division is reported (of two kinds, the first in the program)."""
    h = jnp.tanh(x @ w)
    q = 1 // (jnp.sum(w) > 1e3).astype(jnp.int32)
    h = jnp.sqrt(h + x[:, :1])
    return jnp.mean(h**2) + q


def derivative_after_the_penalty_program(w, x):
    """A penalty that runs after the loop, then a ``sqrt`` at 0 whose derivative alone makes
    an error (a division, a NaN): the penalty's ``log`` is reported, as in the original."""
    h = jnp.tanh(x @ w)
    penalty = jnp.log(jnp.sum(w) - 1e3)
    h = jnp.sqrt(jnp.maximum(h + x[:, :1], 0.0))
    return jnp.mean(h**2) + penalty


def derivative_before_the_penalty_program(w, x):
    """The ``sqrt`` at 0 before the penalty: under a derivative its errors are reported."""
    h = jnp.sqrt(jnp.maximum(jnp.tanh(x @ w) + x[:, :1], 0.0))
    penalty = jnp.log(jnp.sum(w) - 1e3)
    h = jnp.tanh(h)
    return jnp.mean(h**2) + penalty


OUTSIDE = {
    "as_written_first": as_written_first_program,
    "parameters_last": parameters_last_program,
    "parameters_between": parameters_between_program,
    "sorted_first": sorted_first_program,
    "region_before_the_penalty": region_before_the_penalty_program,
    "division_between": division_between_program,
    "derivative_after_the_penalty": derivative_after_the_penalty_program,
    "derivative_before_the_penalty": derivative_before_the_penalty_program,
}
OUTSIDE_CASES = [
    (program, mode, how)
    for program in sorted(OUTSIDE)
    for mode in ja.GRAD_MODES
    for how in ("forward", "value_and_grad", "vmap_inside")
]
OUTSIDE_FAST = [
    ("as_written_first", "remat", "forward"),
    ("parameters_last", "native", "value_and_grad"),
    ("parameters_between", "fused", "forward"),
]


@pytest.mark.parametrize(
    "program, mode, how",
    [pytest.param(*c, marks=() if c in OUTSIDE_FAST else pytest.mark.slow) for c in OUTSIDE_CASES],
)
def test_what_the_loop_does_not_need_runs_where_the_program_has_it(program, mode, how):
    """Of an error outside the region and one inside it, the first in the program is
    reported: before the region's first operation, after its last, or between them, where it
    runs after the loop (``_analysis/_order.py``, ``_compat/_checks/_merges.py``)."""
    check_case_of(OUTSIDE[program], "all", mode, how, ROWS["both"])


def test_the_outside_cases_can_fail():
    """The programs report different operations: a loop that ran its outside equations all
    before it, or all after it, would differ from one of them; one whose checks after the
    loop came after the region's (between the region's operations, or reading what the loop
    computes) would report the region's ``sqrt`` where the original reports the ``log`` or
    the division; one whose checks there replaced every error of the region would report
    the penalty's ``log`` where the original reports the region's ``sqrt``."""
    expected = {
        as_written_first_program: "nan generated by primitive: log.",
        parameters_last_program: "nan generated by primitive: sqrt.",
        parameters_between_program: "nan generated by primitive: log.",
        sorted_first_program: "nan generated by primitive: log.",
        region_before_the_penalty_program: "nan generated by primitive: sqrt.",
    }
    for program, first in expected.items():
        assert report(program, "forward", checkify.nan_checks, ROWS["both"], True) == first
    division = report(division_between_program, "forward", checkify.all_checks, ROWS["both"], True)
    assert division.startswith("division by zero")
    derivative = {
        derivative_after_the_penalty_program: "nan generated by primitive: log.",
        derivative_before_the_penalty_program: "division by zero",
    }
    for program, first in derivative.items():
        assert report(program, "grad", checkify.all_checks, ROWS["both"], True) == first
    # after the loop: the penalty's three equations, and the mean's division and the sum
    sf = ja.serialize_axis(parameters_between_program, chunk=CHUNK, argnums=1)
    assert sf.explain(W, data(ROWS["both"])).counts == {"prologue": 0, "body": 7, "epilogue": 5}


def _division_per_row(w, x):
    q = 1 // (x[:, :1] >= 0.5).astype(jnp.int32)
    return jnp.sum(q.astype(jnp.float32) * w[0, 0]) + jnp.sum(jnp.tanh(x @ w))


@pytest.mark.slow
@pytest.mark.parametrize("errors", ["float", "all"])
def test_grad_of_a_loop_of_yours_that_takes_the_gradient_at_each_step(errors):
    """``jax.value_and_grad`` of a ``lax.scan`` whose step takes ``jax.grad`` of the serialized
    function (native, chunk 3), an integer division by zero at steps 1 and 2: the backward
    passes of the chunks and of the remainder meet different checks the forward pass lacks,
    which took one code (a breaker's find): the division's code then named another
    exception's message, so ``err.get()`` raised, or reported a NaN of ``add``. Each place
    now has a code of its own."""
    xs = np.random.RandomState(0).uniform(0.6, 1.0, size=(4, 6, 3)).astype(np.float32)
    xs[1, 4, 1] = xs[2, 1, 0] = 0.1
    w = jnp.asarray(np.random.RandomState(1).normal(size=(3, 3)).astype(np.float32) * 0.5)

    def trained(g):
        def loss(w, xs):
            step = lambda c, x: (c - 0.1 * jax.grad(g)(c, x), 0.0)  # noqa: E731
            return jnp.sum(jax.lax.scan(step, w, xs)[0])

        return checkify.checkify(jax.value_and_grad(loss), errors=ERRORS[errors])

    sf = ja.serialize_axis(_division_per_row, chunk=3, argnums=1, grad="native")
    (want, _), (got, _) = (trained(g)(w, jnp.asarray(xs)) for g in (_division_per_row, sf))
    assert want.get() == "division by zero"
    assert got.get() == want.get()
