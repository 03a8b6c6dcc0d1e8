"""``SerializedFunction.sweep``: what it measures (checked against direct measurements), its
rows, text, HTML and plot, its progress lines, and its argument checks. Tiny programs, one
timing repeat."""

from __future__ import annotations

import dataclasses
import io
import re
import sys
from html import escape

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpr_accum as ja
from jaxpr_accum._api import _method_args, _sweep, _sweep_view

W = jnp.asarray(np.random.RandomState(0).normal(size=(8, 16)) / 3, jnp.float32)
X = jnp.asarray(np.random.RandomState(1).normal(size=(2, 64, 8)), jnp.float32)  # 2 examples
#: one worker runs the module, so that its ``sweep`` fixture (a whole sweep) is computed once
pytestmark = pytest.mark.xdist_group("sweep")
KEYS = {"chunk", "grad", "temp_bytes", "time_s", "memory_ratio", "time_ratio", "max_rel_err"}


def loss(w, x):  # activations outweigh the parameters: chunks below the axis save memory
    return jnp.mean(jnp.tanh(jnp.tanh(x @ w) @ w.T) ** 2)


def temp_bytes(f, *args, argnums=0):
    compiled = jax.jit(jax.value_and_grad(f, argnums)).lower(*args).compile()
    return compiled.memory_analysis().temp_size_in_bytes


@pytest.fixture(scope="module")
def sweep():
    """The default chunks (powers of two up to the axis size, 2) in two modes."""
    sf = ja.serialize_axis(loss, chunk=2, argnums=1)
    return sf.sweep(W, X, grads=("auto", "remat"), repeats=1, progress=False)


def test_rows_are_the_original_then_every_chunk_and_mode(sweep):
    assert isinstance(sweep, ja.Sweep)
    assert [(r["chunk"], r["grad"]) for r in sweep.rows] == [
        (None, None), (1, "auto"), (2, "auto"), (1, "remat"), (2, "remat"),
    ]  # fmt: skip
    assert sweep.axis_size == 2 and sweep.grad_argnums == (0,) and sweep.repeats == 1
    for r in sweep.rows:
        assert set(r) >= KEYS, r
        assert r["error"] is None, r
        assert r["time_s"] > 0 and r["temp_bytes"] >= 0
        assert r["max_rel_err"] < 1e-5 and r["value_rel_err"] < 1e-5, r
    original = sweep.rows[0]
    assert original["memory_ratio"] == original["time_ratio"] == 1.0
    assert original["max_rel_err"] == 0.0 and original["mode"] is None
    for r in sweep.rows[1:]:
        assert r["memory_ratio"] == pytest.approx(r["temp_bytes"] / original["temp_bytes"])
        assert r["time_ratio"] == pytest.approx(r["time_s"] / original["time_s"])
        if r["grad"] == "auto" and r["chunk"] >= 2:  # one chunk: auto runs it as written
            assert r["mode"] == "none", r
        else:
            assert r["mode"] in ("remat", "fused"), r
            assert r["grad"] == "auto" or r["mode"] == "remat", r
    whole = [r for r in sweep.rows if r["chunk"] == 2]
    assert all("holds the whole axis" in r["warning"] for r in whole), whole


def test_memory_is_xla_temp_bytes_of_value_and_grad(sweep):
    """The numbers are those of ``jax.jit(jax.value_and_grad(g, argnums))`` compiled directly."""
    assert sweep.rows[0]["temp_bytes"] == temp_bytes(loss, W, X)
    sf = ja.serialize_axis(loss, chunk=1, argnums=1, grad="remat")
    (row,) = [r for r in sweep.rows if (r["chunk"], r["grad"]) == (1, "remat")]
    assert row["temp_bytes"] == temp_bytes(sf, W, X)
    assert row["temp_bytes"] < sweep.rows[0]["temp_bytes"]


@pytest.mark.slow
def test_a_wrong_gradient_is_measured():
    """A copy whose outputs are off by 1e-3 shows errors of 1e-3 (the measure can fail)."""

    class Scaled(ja.SerializedFunction):
        def __call__(self, *args):
            out = super().__call__(*args)
            return out * 1.001 if self.chunk == 2 else out

    sf = Scaled(loss, ja.serialize_axis(loss, chunk=2, argnums=1).settings)
    (_, row) = sf.sweep(W, X, chunks=2, repeats=1, progress=False).rows
    assert row["max_rel_err"] == pytest.approx(1e-3, rel=0.05)
    assert row["value_rel_err"] == pytest.approx(1e-3, rel=0.05)


def test_copies_keep_every_setting_but_chunk_and_grad_and_a_failure_is_a_row():
    made = []

    class Recorded(ja.SerializedFunction):
        def __init__(self, fun, settings):
            made.append(settings)
            super().__init__(fun, settings)

        def explain(self, *args):
            if self.chunk == 3:
                raise RuntimeError("chunk 3 <is> broken")
            return super().explain(*args)

    settings = ja.serialize_axis(loss, chunk=2, argnums=(1,), accum_dtype=jnp.float32).settings
    sf = Recorded(loss, settings)
    made.clear()
    sweep = sf.sweep(W, X, chunks=[3, 2], grads="native", repeats=1, progress=False)
    assert made == [dataclasses.replace(settings, chunk=k, grad="native") for k in (2, 3)]
    ok, broken = sweep.rows[1:]
    assert ok["error"] is None and ok["mode"] == "native"
    assert broken["error"] == "RuntimeError: chunk 3 <is> broken"
    assert broken["temp_bytes"] is broken["time_s"] is broken["max_rel_err"] is None
    text = str(sweep)
    assert re.search(r"^3\s+native\s+error", text, re.M), text
    assert "chunk 3 (native): RuntimeError: chunk 3 <is> broken" in text
    assert "chunk 3 &lt;is&gt; broken" in sweep._repr_html_()


@pytest.mark.slow
def test_an_automatic_axis_is_pinned_by_its_size_in_every_copy():
    """Review finding: the default chunks end at the axis's length, where automatic selection
    (which wants an axis longer than the chunk) found none: the last row was an error. The
    copies keep the axis found, by its size."""

    def sampled(w, mu, key):
        z = mu + jax.random.normal(key, (8, *mu.shape))
        return jnp.mean(jax.vmap(lambda z: jnp.tanh(z @ w))(z) ** 2)

    sf = ja.serialize_axis(sampled, chunk=4)
    args = (W[:, :8], jnp.zeros((3, 8)), jax.random.key(0))
    sweep = sf.sweep(*args, grads="remat", repeats=1, progress=False)
    assert [r["chunk"] for r in sweep.rows[1:]] == [1, 2, 4, 8]
    assert all(r["error"] is None and r["max_rel_err"] < 1e-5 for r in sweep.rows[1:]), sweep
    assert {r["axis"] for r in sweep.rows} == {sweep.rows[0]["axis"]}, sweep
    assert sf.settings.at(8, "remat", 8) == dataclasses.replace(
        sf.settings, chunk=8, grad="remat", size=8
    )


def test_the_text_table_has_a_line_per_row(sweep):
    lines = str(sweep).splitlines()
    assert lines[0].startswith("jaxpr_accum sweep of loss: axis of size 2")
    assert lines[1].split()[:3] == ["chunk", "grad", "temp"]
    body = lines[3 : 3 + len(sweep.rows)]
    assert body[0].startswith("original")
    assert [ln.split()[0] for ln in body[1:]] == ["1", "2", "1", "2"]
    r = sweep.rows[2]
    assert f"{r['memory_ratio']:.3f}" in body[2] and f"{r['time_ratio']:.3f}" in body[2]


def test_the_text_carries_the_notes_of_the_html(sweep):
    """``str(sweep)`` and its HTML list the same notes, the plans' warnings among them."""
    notes = _sweep_view.notes(sweep)
    html = sweep._repr_html_()
    assert any("holds the whole axis" in n for n in notes), notes
    assert str(sweep).splitlines()[3 + len(sweep.rows) :] == notes
    assert all(escape(n) in html for n in notes), html


def _fake(name: str = "loss") -> ja.Sweep:
    def row(chunk, grad, temp, t, mode=None):
        return _sweep._row(chunk, grad) | {
            "temp_bytes": temp, "time_s": t, "memory_ratio": temp / 4096,
            "time_ratio": t / 2e-3, "max_rel_err": 0.0, "value_rel_err": 0.0, "mode": mode,
        }  # fmt: skip

    rows = [row(None, None, 4096, 2e-3)]
    rows += [row(k, "auto", 512 * k, 1e-3 * k, "fused") for k in (1, 2, 4)]
    rows += [row(k, "remat", 600 * k, 1.5e-3 * k, "remat") for k in (1, 2, 4)]
    return ja.Sweep(rows, name, 4, (0,), 1)


def test_a_copy_that_chunks_another_axis_is_noted():
    sweep = _fake()
    for r in sweep.rows:
        r["axis"] = "size 4 born at x at axis 0"
    assert "another axis" not in str(sweep)
    sweep.rows[3]["axis"] = "size 16 born at w at axis 1"
    (note,) = [ln for ln in str(sweep).splitlines() if "another axis" in ln]
    assert note.startswith("chunk 4 (auto): chunks another axis, size 16 born at w at axis 1")
    assert "another axis, size 16" in sweep._repr_html_()


def test_html_is_a_table_with_everything_escaped():
    html = _fake("<script>&")._repr_html_()
    assert html.count("<tr>") == 1 + 7 and "<table" in html
    assert "&lt;script&gt;&amp;" in html and "<script>" not in html
    assert "auto (fused)" in html and "0.125" in html


def test_plot_draws_memory_and_time_by_chunk_and_writes_a_png(tmp_path):
    from matplotlib.figure import Figure

    path = tmp_path / "sweep.png"
    fig = _fake().plot(str(path))
    assert isinstance(fig, Figure)
    mem, tim = fig.axes
    for ax, values in ((mem, [0.5, 1.0, 2.0]), (tim, [1.0, 2.0, 4.0])):
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        assert set(lines) == {"grad=auto", "grad=remat", "original"}
        assert list(lines["grad=auto"].get_xdata()) == [1, 2, 4]
        assert list(lines["grad=auto"].get_ydata()) == pytest.approx(values)
        assert len(set(lines["original"].get_ydata())) == 1  # a horizontal line
    assert "(KiB)" in mem.get_title() and "(ms)" in tim.get_title()
    assert mem.get_yscale() == tim.get_yscale() == "linear"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_has_a_log_scale_for_a_spread_over_10x():
    sweep = _fake()
    sweep.rows[-1]["time_s"] = 1.0  # 500x the original's
    sweep.rows[-1]["temp_bytes"] = 10**6  # memory stays linear: a spread is its point
    mem, tim = sweep.plot().axes
    assert (mem.get_yscale(), tim.get_yscale()) == ("linear", "log")
    assert "(s)" in tim.get_title()


def test_plot_without_matplotlib_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=re.escape("needs matplotlib: pip install -e '.[plot]'")):
        _fake().plot()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    "progress, tty, shown",
    [(None, True, True), (False, True, False)]
    + [
        pytest.param(*c, marks=pytest.mark.slow)
        for c in [(None, False, False), (True, False, True)]
    ],
)
def test_progress_lines_on_a_terminal_or_when_forced(monkeypatch, progress, tty, shown):
    err = _Terminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    sf = ja.serialize_axis(lambda x: jnp.sum(jnp.sin(x)), chunk=2, argnums=0)  # fast to compile
    sf.sweep(X, chunks=2, repeats=2, progress=progress)
    lines = err.getvalue().splitlines()
    if not shown:
        assert lines == []
        return
    assert len(lines) == 2 + 2, lines  # a compile per function, then a line per timing round
    assert "compiling and checking original" in lines[0] and "chunk 2 (auto)" in lines[1]
    assert "timing round 1/2" in lines[2] and "timing round 2/2" in lines[3]


def test_default_chunks_are_powers_of_two_and_the_axis_size():
    assert _method_args.check_chunks(None, 16) == [1, 2, 4, 8, 16]
    assert _method_args.check_chunks(None, 12) == [1, 2, 4, 8, 12]
    assert _method_args.check_chunks(None, 1) == [1]
    assert _method_args.check_chunks((8, 2, 2), 16) == [2, 8]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"chunks": [0]}, ValueError, "`chunks`"),
        ({"chunks": [2, -1]}, ValueError, "`chunks`"),
        ({"chunks": [1.5]}, TypeError, "`chunks`"),
        ({"chunks": "4"}, TypeError, "`chunks`"),
        ({"chunks": [True]}, TypeError, "`chunks`"),
        ({"chunks": [jnp.array(4.0)]}, TypeError, "`chunks` must hold positive ints"),
        ({"chunks": []}, ValueError, "`chunks`"),
        ({"grads": ("auto", "bogus")}, ValueError, "`grads`.*'bogus'"),
        ({"grads": ()}, ValueError, "`grads`"),
        ({"repeats": 0}, ValueError, "`repeats`"),
        ({"repeats": 1.0}, TypeError, "`repeats`"),
        ({"grad_argnums": 2}, ValueError, "`grad_argnums` 2 is out of range"),
        ({"grad_argnums": -3}, ValueError, "`grad_argnums`"),
        ({"grad_argnums": "0"}, TypeError, "`grad_argnums`"),
        ({"argnums": 0}, TypeError, "unexpected keyword argument 'argnums': .*`grad_argnums`"),
        ({"chunk": 2}, TypeError, "unexpected keyword argument 'chunk'"),
        ({"progress": "yes"}, TypeError, "`progress`"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, match):
    sf = ja.serialize_axis(loss, chunk=2, argnums=1)
    with pytest.raises(error, match=match):
        sf.sweep(W, X, **kwargs)


# -- Plan._repr_html_ ----------------------------------------------------------------------------


def stops_at_a_cumsum(x):
    h = jnp.sin(x)
    return jnp.sum(jnp.tanh(jnp.cumsum(h, 0))) + jnp.sum(h)  # the region stops at `cumsum`


def test_plan_html_shows_the_plan_at_a_glance():
    sf = ja.serialize_axis(stops_at_a_cumsum, chunk=4, argnums=0, grad="remat")
    plan = sf.explain(jnp.ones((10, 10)))  # an explicit mode keeps the loop (and the warning)
    html = plan._repr_html_()
    line = stops_at_a_cumsum.__code__.co_firstlineno + 2
    assert plan.stops and plan.warning, str(plan)
    for shown in (
        "size 10, born at x at axis 0",
        "4 (3 chunks, the last of 2)",
        f"remat: {plan.grad_reason}",
        "0 hoisted before the loop, 2 chunked, 4 left after the loop",
        "estimated saving",
        "-404 B (costs memory)",
        f"test_sweep.py:{line}",
        "the region stopped at (1)",
        "note: this plan is not expected to save memory",
    ):
        assert escape(shown) in html, (shown, html)


def test_plan_html_escapes_everything():
    plan = ja.serialize_axis(stops_at_a_cumsum, chunk=4, argnums=0).explain(jnp.ones((10, 10)))
    odd = dataclasses.replace(
        plan, warning="<b>w&</b>", born="<i>x</i>", stops=["<script>s</script>"]
    )
    html = odd._repr_html_()
    assert "<b>" not in html and "<i>" not in html and "<script>" not in html
    assert "&lt;b&gt;w&amp;&lt;/b&gt;" in html and "&lt;script&gt;s&lt;/script&gt;" in html
