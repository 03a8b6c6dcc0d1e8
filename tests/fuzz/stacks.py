"""The grammar of transformation stacks around the function under test.

A stack is a tuple of :class:`Layer`, innermost first; ``render`` writes it as the body of
``run(g, args)`` in the repro script (``F = g``, then one ``F = ...`` line per layer). Every
layer keeps the positional arguments (their number and order); what a layer changes is their
shapes, which :func:`arg_states` tracks from the innermost layer out:

* ``jax.vmap`` (see ``_in_axes``): over the chunked data (an extra leading axis, or a new
  axis 1 behind it), over one unchunked argument (the temperature ``t``, or the parameters:
  an ensemble), or random ``in_axes`` (``None``, ``0``, or ``1`` for an array of rank >= 1);
  nested; the ``vmap_unchunked`` family maps ``t`` (or ``p``) only, in programs with a ``t``;
* ``jax.jit``, ``jax.checkpoint``;
* reverse mode: ``jax.grad``, ``jax.value_and_grad`` (the output as auxiliary data),
  ``jax.vjp`` with respect to a random subset of the floating arguments in random order
  (``argnums`` an int or a tuple);
* forward mode: ``jax.jvp``, and ``jax.jvp`` of ``jax.grad``, ``jax.hessian``;
* ``lax.scan``: the function called in a scan body over 3 steps (one argument scaled per
  step); ``lax.cond`` on the sign of an argument (both branches call it);
* ``jax.shard_map`` on 8 devices, ``in_specs`` ``P('d')`` for the data, ``P()`` for the
  rest, default ``check_vma=True`` (only in the ``shard`` family; only layers that keep the
  arguments' shapes may be below it).

The layer helpers (``L_grad`` and so on) are in ``runtime.py``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st

from .programs import Program

DATA = ("x", "y", "m")  # the arguments the serialized function chunks (leading axis)
FLOAT = ("p", "x", "t")  # the differentiable arguments
WRAPPERS = ("jit", "checkpoint")
REVERSE = ("grad", "value_and_grad", "vjp")
FORWARD = ("jvp", "hessian")
CONTROL = ("scan", "cond")
KEEPS_SHAPES = (*WRAPPERS, *REVERSE, "jvp", *CONTROL)


@dataclasses.dataclass(frozen=True)
class Layer:
    kind: str
    argnums: Any = None  # int or tuple, for differentiation; the argument index for scan/cond
    in_axes: tuple | None = None  # vmap
    size: int = 2  # vmap

    def render(self, names: list[str]) -> str:
        k = self.kind
        if k in WRAPPERS:
            return f"F = jax.{k}(F)"
        if k == "vmap":
            return f"F = jax.vmap(F, in_axes={_tuple(self.in_axes)})"
        if k in ("scan", "cond"):
            return f"F = L_{k}(F, {self.argnums})  # argument {names[self.argnums]}"
        if k == "shard_map":
            data = tuple(n in DATA for n in names)
            return f"F = L_shard(F, {_tuple(data)})"
        what = (
            names[self.argnums]
            if isinstance(self.argnums, int)
            else ", ".join(names[i] for i in self.argnums)
        )
        return f"F = L_{k}(F, argnums={self.argnums!r})  # w.r.t. {what}"

    def label(self, names: list[str]) -> str:
        if self.kind == "vmap":
            mapped = [n for n, a in zip(names, self.in_axes or (), strict=True) if a is not None]
            return f"vmap[{','.join(mapped)}]"
        if self.kind in REVERSE or self.kind in FORWARD:
            return self.kind
        return self.kind


def _tuple(t: tuple) -> str:
    return "(" + ", ".join(repr(a) for a in t) + ("," if len(t) == 1 else "") + ")"


@dataclasses.dataclass(frozen=True)
class ArgState:
    """How to build one argument at the outermost level: the ``vmap`` stackings
    ``(axis, size)`` innermost first, and its rank at the current level (``None``: a pytree)."""

    name: str
    ndim: int | None
    ops: tuple[tuple[int, int], ...] = ()


def base_states(program: Program) -> list[ArgState]:
    ndim = {"p": None, "x": 2, "y": 1, "m": 1, "t": 0}
    return [ArgState(n, ndim[n]) for n in program.args]


def arg_states(program: Program, layers: tuple[Layer, ...]) -> list[ArgState]:
    """The arguments' states outside ``layers``; ``ValueError`` if the stack is invalid."""
    states = base_states(program)
    seen_vmap = False
    for layer in layers:
        if layer.kind == "vmap":
            seen_vmap = True
            axes = layer.in_axes or ()
            if len(axes) != len(states) or all(a is None for a in axes):
                raise ValueError("vmap in_axes")
            new = []
            for s, a in zip(states, axes, strict=True):
                if a is None:
                    new.append(s)
                    continue
                if (s.ndim is None and a != 0) or (s.ndim is not None and a > s.ndim):
                    raise ValueError("vmap axis out of range")
                ndim = None if s.ndim is None else s.ndim + 1
                new.append(ArgState(s.name, ndim, (*s.ops, (a, layer.size))))
            states = new
        elif layer.kind == "shard_map" and seen_vmap:
            raise ValueError("shard_map above a vmap")
        elif layer.kind in ("scan", "cond") or layer.kind in REVERSE or layer.kind in FORWARD:
            idx = (layer.argnums,) if isinstance(layer.argnums, int) else layer.argnums
            if not idx or any(i >= len(states) or states[i].name not in FLOAT for i in idx):
                raise ValueError("argnums")
    return states


def family_label(program: Program, layers: tuple[Layer, ...]) -> str:
    """The stack without jit/checkpoint, for grouping failures: ``vmap[t]>grad``."""
    names = program.args
    parts = [lyr.label(names) for lyr in layers if lyr.kind not in WRAPPERS]
    dedup = [p for i, p in enumerate(parts) if i == 0 or parts[i - 1] != p]
    return ">".join(dedup) or "plain"


# ------------------------------------------------------------------------------------------
# Strategies
# ------------------------------------------------------------------------------------------


def _float_args(states: list[ArgState]) -> list[int]:
    return [i for i, s in enumerate(states) if s.name in FLOAT]


@st.composite
def _argnums(draw: Any, states: list[ArgState], single: bool = False) -> Any:
    floats = _float_args(states)
    if single:
        return draw(st.sampled_from(floats))
    chosen = draw(st.lists(st.sampled_from(floats), min_size=1, max_size=len(floats), unique=True))
    if len(chosen) == 1 and draw(st.booleans()):
        return chosen[0]
    return tuple(chosen)


@st.composite
def _in_axes(draw: Any, states: list[ArgState], target: str | None = None) -> tuple:
    """``in_axes`` for a ``vmap``: over the chunked data (an extra leading axis, or a new
    axis 1 behind the data axis), over one unchunked argument (``t`` preferred, else ``p``),
    or at random over every argument (``None``, ``0``, or ``1`` for arrays of rank >= 1)."""
    target = target or draw(st.sampled_from(["data", "unchunked", "random"]))
    names = [s.name for s in states]
    axes: list[Any] = [None] * len(states)
    if target == "data":
        for i, s in enumerate(states):
            if s.name in DATA and (s.name == "x" or draw(st.booleans())):
                axes[i] = draw(st.sampled_from([0, 1] if s.ndim else [0]))
    elif target == "unchunked":
        choice = "t" if "t" in names and draw(st.sampled_from([True, True, False])) else "p"
        axes[names.index(choice)] = 0
    else:
        for i, s in enumerate(states):
            options: list[Any] = [None, 0] + ([1] if s.ndim else [])
            axes[i] = draw(st.sampled_from(options))
        if all(a is None for a in axes):
            axes[draw(st.sampled_from(range(len(states))))] = 0
    return tuple(axes)


@st.composite
def _layer(draw: Any, kind: str, states: list[ArgState]) -> Layer:
    if kind == "vmap_unchunked":
        axes = draw(_in_axes(states, "unchunked"))
        return Layer("vmap", in_axes=axes, size=draw(st.sampled_from([2, 3])))
    if kind in WRAPPERS:
        return Layer(kind)
    if kind in ("scan", "cond"):
        return Layer(kind, argnums=draw(st.sampled_from(_float_args(states))))
    if kind == "hessian":
        return Layer(kind, argnums=draw(_argnums(states, single=True)))
    if kind in REVERSE or kind == "jvp":
        return Layer(kind, argnums=draw(_argnums(states)))
    if kind == "vmap":
        return Layer("vmap", in_axes=draw(_in_axes(states)), size=draw(st.sampled_from([2, 3])))
    if kind == "shard_map":
        return Layer(kind)
    raise AssertionError(kind)


FAMILIES = ("plain", "reverse", "vmap", "vmap_unchunked", "forward", "mixed", "shard")
_ANY = (*WRAPPERS, *REVERSE, "jvp", "hessian", "vmap", *CONTROL)


@st.composite
def _kinds(draw: Any, family: str) -> list[str]:
    one = st.sampled_from
    opt = lambda kinds: st.lists(one(kinds), max_size=1)  # noqa: E731
    if family == "plain":
        return draw(st.lists(one((*WRAPPERS, *CONTROL)), max_size=2))
    if family == "reverse":
        pre = draw(opt((*WRAPPERS, *CONTROL)))
        post = draw(opt((*WRAPPERS, *CONTROL)))
        return [*pre, draw(one(REVERSE)), *post]
    if family == "vmap":
        pre = draw(opt((*WRAPPERS, *REVERSE)))
        vmaps = ["vmap"] * draw(st.integers(1, 2))
        post = draw(one([[], ["jit"], ["grad"], ["value_and_grad"], ["vjp"]]))
        if set(pre) & set(REVERSE):  # first order only here (``mixed`` has second order)
            post = [k for k in post if k not in REVERSE]
        return [*pre, *vmaps, *post]
    if family == "vmap_unchunked":  # a vmap over t (or p) only; the programs have a t
        pre = draw(one([[], ["jit"], ["checkpoint"]]))
        post = draw(one([["grad"], ["value_and_grad"], ["vjp"], ["jit"], []]))
        return [*pre, "vmap_unchunked", *post]
    if family == "forward":
        core = draw(one((("jvp",), ("grad", "jvp"), ("hessian",), ("vjp", "jvp"))))
        pre = draw(opt(("jit", "checkpoint")))
        post = draw(opt(("jit", "vmap")))
        return [*pre, *core, *post]
    if family == "shard":
        inner = draw(opt((*WRAPPERS, "grad", "value_and_grad")))
        outer = draw(opt(("jit", "grad", "value_and_grad")))
        return [*inner, "shard_map", *outer]
    if family == "mixed":
        kinds = draw(st.lists(one(_ANY), min_size=1, max_size=3))
        # at most two differentiations (second order is enough, and compiles stay small)
        diff = [k for k in kinds if k in REVERSE or k in FORWARD]
        if len(diff) > 2 or ("hessian" in kinds and len(diff) > 1):
            kinds = [k for k in kinds if k not in REVERSE and k not in FORWARD] + diff[:1]
        return kinds
    raise ValueError(family)


@st.composite
def stacks(draw: Any, program: Program, family: str) -> tuple[Layer, ...]:
    """A valid stack of the family for ``program``, innermost layer first."""
    layers: list[Layer] = []
    for kind in draw(_kinds(family)):
        states = arg_states(program, tuple(layers))
        layers.append(draw(_layer(kind, states)))
    arg_states(program, tuple(layers))  # validates
    return tuple(layers)
