"""``SerializedFunction``: the plan cache and dispatch (see ``jaxpr_accum._api``).

Each call signature (avals, placements, static leaves) is checked (``_arguments``), traced,
planned, built and validated once (``_planner``), in an LRU cache like ``jax.jit``'s. A call
first traces and compiles the built program (``_fallback.ready``: an internal error there runs
the original instead), then runs it uncaught: what that raises (a callback, ``checkify``,
``jax_debug_nans``) is the user's, and nothing runs twice. NNX graph nodes go via ``_nnx``;
the plan's warning is issued once per function, with what caused it (``_messages``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Generic, NoReturn, ParamSpec, TypeVar

import jax

from jaxpr_accum import _compat
from jaxpr_accum._api import _messages
from jaxpr_accum._api._calls import CallPlans
from jaxpr_accum._api._method_args import check_grad_argnums
from jaxpr_accum._api._naming import non_defaults, unexpected
from jaxpr_accum._api._sweep import Sweep, measure_sweep
from jaxpr_accum._assembly._assemble import run_as_written
from jaxpr_accum._base import _nnx
from jaxpr_accum._base._errors import warn
from jaxpr_accum._base._settings import SETTING_NAMES, Settings
from jaxpr_accum._compat import ClosedJaxpr
from jaxpr_accum._planning import _budget, _fallback
from jaxpr_accum._report._plan import Plan

P = ParamSpec("P")
R = TypeVar("R")


def _setting(name: str) -> property:
    return property(lambda self: getattr(self.settings, name), doc=f"The `{name}` setting.")


class SerializedFunction(Generic[P, R]):
    """A function with one axis run in chunks: what ``serialize_axis`` returns.

    Call it as the original (also under ``jax.jit``, ``jax.grad``, ``jax.vmap``); ask it what
    it does with ``explain``, ``jaxpr`` and ``sweep``. Its settings are read-only (plans are
    cached); the ``repr`` shows every setting not at its default.

    Attributes:
        original: The wrapped function, undecorated (the oracle in tests).
        settings: The validated settings, an immutable dataclass.

    Examples:
        >>> import jax.numpy as jnp, jaxpr_accum as ja
        >>> ja.serialize_axis(lambda w, x: jnp.sum(x @ w), chunk=2, argnums=1)
        serialize_axis('<lambda>', chunk=2, argnums=(1,))
    """

    settings: Settings
    original: Callable[P, R]
    _plans: CallPlans
    _pure: SerializedFunction | None
    _warned: set[str]

    chunk = _setting("chunk")
    memory = _setting("memory")
    axis = _setting("axis")
    argnums = _setting("argnums")
    size = _setting("size")
    grad = _setting("grad")
    accum_dtype = _setting("accum_dtype")
    mesh_axis = _setting("mesh_axis")
    in_axes = _setting("in_axes")
    param_specs = _setting("param_specs")
    gather = _setting("gather")

    def __init__(self, fun: Callable[P, R], settings: Settings):
        object.__setattr__(self, "settings", settings)
        object.__setattr__(self, "original", fun)
        object.__setattr__(self, "_plans", CallPlans(fun, settings))
        object.__setattr__(self, "_pure", None)
        object.__setattr__(self, "_warned", set())  # the plan warnings given (each once)
        functools.update_wrapper(self, fun)

    def __setattr__(self, name: str, value: object) -> None:
        if name in SETTING_NAMES or name in ("settings", "original"):
            raise AttributeError(
                f"`{name}` of a SerializedFunction is read-only (its plans are cached); make "
                f"a new one instead: `serialize_axis(sf.original, {name}=...)`"
            )
        object.__setattr__(self, name, value)

    # -- public --------------------------------------------------------------------------
    @_compat.api_boundary
    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run the function with its axis in chunks: the original's values, as the original.

        Args:
            *args: The original's positional arguments.
            **kwargs: The original's keyword arguments.

        Returns:
            What the original returns, computed chunk by chunk (equal up to floating-point
            reassociation; random draws bit-identical).

        Raises:
            SerializeError: The program has no chunkable axis for these argument shapes.
            ArgumentError: The arguments do not match the settings.
            MissingInternal: On an untested JAX, an internal this package needs has moved.

        Examples:
            >>> import jax, jax.numpy as jnp, jaxpr_accum as ja
            >>> loss = lambda w, x: jnp.mean(jnp.tanh(x @ w) ** 2)
            >>> sf = ja.serialize_axis(loss, chunk=4, argnums=1)
            >>> w, x = jnp.ones((3, 2)), jnp.ones((10, 3))
            >>> bool(jnp.allclose(jax.grad(sf)(w, x), jax.grad(loss)(w, x)))
            True
        """
        nnx = self._on_nnx_state(args, kwargs)
        if nnx is not None:
            out, new_states, new_kw = nnx.function(*nnx.args, **nnx.kwargs)
            _nnx.write_back(args, kwargs, new_states, new_kw)
            return out
        prepared, inputs = self._plans.prepare(args, kwargs)
        split = prepared.split
        _messages.warn_once(self._warned, repr(self), prepared.plan, split)
        original = functools.partial(run_as_written, prepared.traced.jaxpr)
        try:  # the library's stages of the call, before anything of the user's runs
            compiles = prepared.staged and _fallback.ready(
                prepared.jitted,
                inputs,
                self._plans.compiled_for.setdefault(prepared, set()),
                original,
            )
        except Exception as error:
            if prepared.as_written or _fallback.strict():
                raise
            warn(_fallback.at_call(error))
            return self.original(*args, **kwargs)
        if not compiles:  # not staged, or the function as written fails too: run it as is
            return self.original(*args, **kwargs)
        outs = prepared.jitted(*inputs)  # runs the user's code: what it raises is the user's
        return jax.tree_util.tree_unflatten(prepared.traced.out_tree, outs)

    @_compat.api_boundary
    def explain(
        self, *args: object, grad_argnums: int | Sequence[int] | None = None, **kwargs: object
    ) -> Plan:
        """The plan for a call with these arguments, without running it.

        The plan is the one the call makes, by the same path: where the choice depends on
        what is differentiated (``grad="auto"`` measures fused against remat, ``memory=``
        measures the chunks), a call under ``jax.grad`` plans for the arguments it
        differentiates, and ``explain`` for every floating argument unless told
        ``grad_argnums``. ``Plan.planned_for`` says which.

        Args:
            *args: The original's positional arguments.
            grad_argnums: The positional arguments the call's ``jax.grad`` (or
                ``jax.value_and_grad``) differentiates, as its ``argnums`` (not
                ``serialize_axis``'s ``argnums``, which names the arguments that carry the
                axis); None: every floating argument.
            **kwargs: The original's keyword arguments.

        Returns:
            The ``Plan``: the axis and where it is born, the chunk, the gradient mode and why,
            the differentiation planned for, what stops the region (with source lines), the
            estimated saving. ``print`` it for a report; in a notebook it renders as HTML.

        Raises:
            SerializeError: The program has no chunkable axis for these argument shapes.
            ArgumentError: The arguments do not match the settings.
            TypeError: ``grad_argnums`` is not an int or a sequence of ints.
            ValueError: ``grad_argnums`` is out of range.

        Examples:
            >>> import jax.numpy as jnp, jaxpr_accum as ja
            >>> sf = ja.serialize_axis(lambda x: jnp.sum(jnp.sin(x)), chunk=4)
            >>> plan = sf.explain(jnp.ones(16))
            >>> plan.axis_size, plan.chunk
            (16, 4)
        """
        nnx = self._on_nnx_state(args, kwargs)
        if nnx is not None:
            return nnx.function.explain(*nnx.args, grad_argnums=grad_argnums, **nnx.kwargs)
        nums = None if grad_argnums is None else check_grad_argnums(grad_argnums, args)
        prepared, inputs = self._plans.prepare(args, kwargs, nums)
        budget = prepared.plan.budget
        if budget is None:
            return prepared.plan
        originals = self._plans.original_bytes
        if prepared not in originals:  # compiled once per signature, when asked
            traced = prepared.traced
            floats = traced.float_arguments(inputs)
            originals[prepared] = _budget.original_memory(traced.jaxpr, inputs, floats)
        budget = dataclasses.replace(budget, original=originals[prepared])
        return dataclasses.replace(prepared.plan, budget=budget)

    @_compat.api_boundary
    def jaxpr(self, *args: P.args, **kwargs: P.kwargs) -> ClosedJaxpr:
        """The rewritten program for these arguments, as ``jax.make_jaxpr`` shows it.

        Args:
            *args: The original's positional arguments.
            **kwargs: The original's keyword arguments.

        Returns:
            A ``jax.extend.core.ClosedJaxpr``; the chunked region is a ``scan``.

        Raises:
            SerializeError: The program has no chunkable axis for these argument shapes.
            ArgumentError: The arguments do not match the settings.

        Examples:
            >>> import jax.numpy as jnp, jaxpr_accum as ja
            >>> sf = ja.serialize_axis(lambda x: jnp.sum(jnp.sin(x)), chunk=4)
            >>> "scan" in str(sf.jaxpr(jnp.ones(16)))
            True
        """
        nnx = self._on_nnx_state(args, kwargs)
        if nnx is not None:
            return nnx.function.jaxpr(*nnx.args, **nnx.kwargs)
        prepared, inputs = self._plans.prepare(args, kwargs)
        return jax.make_jaxpr(prepared.run)(*inputs)

    @_compat.api_boundary
    def sweep(
        self,
        *args: object,
        chunks: int | Sequence[int] | None = None,
        grads: str | Sequence[str] = ("auto",),
        grad_argnums: int | Sequence[int] = 0,
        repeats: int = 3,
        progress: bool | None = None,
        **removed: NoReturn,
    ) -> Sweep:
        """Measure the original and a copy per ``(chunk, grad)`` pair, side by side.

        Each copy is ``serialize_axis(sf.original, chunk=c, grad=g)`` with ``sf``'s other
        settings. For each, ``jax.jit(jax.value_and_grad(g, grad_argnums))`` (``g`` sums the
        floating outputs) is compiled at ``args`` and measured: XLA's temp bytes, the median
        time of ``repeats`` interleaved rounds, the largest relative difference of value and
        gradients from the original's.

        Args:
            *args: The original's positional arguments (keyword arguments are not taken).
            chunks: The chunk sizes to measure; None: the powers of two up to the axis size,
                and the axis size.
            grads: The gradient modes to measure (``"auto"``, ``"remat"``, ``"fused"``,
                ``"native"``), each at every chunk.
            grad_argnums: The positional arguments to differentiate, as ``jax.grad``'s
                ``argnums`` (not ``serialize_axis``'s ``argnums``, which names the arguments
                that carry the axis).
            repeats: Rounds of timed calls; each round calls every compiled program once.
            progress: A line per step on stderr; None: when stderr is a terminal.

        Returns:
            The ``Sweep``, a row per function, the original first: a table with notes when
            printed, HTML in a notebook, a figure with ``.plot()``.

        Raises:
            TypeError: A bad argument type, or the old spelling ``argnums=`` (renamed
                ``grad_argnums`` in 0.1.0).
            ValueError: A bad argument value (an empty ``chunks``, an unknown mode, a
                ``grad_argnums`` out of range or naming an argument with no arrays).
            SerializeError: The program has no chunkable axis for these argument shapes.

        Examples:
            >>> import jax.numpy as jnp, jaxpr_accum as ja
            >>> sf = ja.serialize_axis(lambda w, x: jnp.sum(jnp.tanh(x @ w)), chunk=2, argnums=1)
            >>> sweep = sf.sweep(jnp.ones((3, 2)), jnp.ones((8, 3)), chunks=(2, 4), repeats=1)
            >>> [row["chunk"] for row in sweep.rows]
            [None, 2, 4]
        """
        if removed:
            raise TypeError(unexpected("sweep", removed))
        return measure_sweep(
            self, args, chunks=chunks, grads=grads, grad_argnums=grad_argnums,
            repeats=repeats, progress=progress,
        )  # fmt: skip

    def __repr__(self) -> str:
        name = getattr(self.original, "__name__", self.original)
        settings = ", ".join(f"{k}={v}" for k, v in non_defaults(self.settings))
        return f"serialize_axis({name!r}, {settings})"

    # -- internals -----------------------------------------------------------------------
    def _on_nnx_state(self, args: tuple, kwargs: dict) -> _nnx.NnxCall[SerializedFunction] | None:
        """For a call with Flax NNX graph nodes: the call of the same serialization of fun as a
        pure function of NNX state, on their state (see ``_nnx``); else None."""
        if self._pure is self or not _nnx.has_graph_nodes(args, kwargs):
            return None
        pure = self._pure
        if pure is None:
            pure = SerializedFunction(_nnx.purify(self.original), self.settings)
            object.__setattr__(pure, "_pure", pure)  # its arguments are already pure state
            object.__setattr__(self, "_pure", pure)
        states, kw_states = _nnx.pure_arguments(args, kwargs)
        return _nnx.NnxCall(function=pure, args=states, kwargs=kw_states)
