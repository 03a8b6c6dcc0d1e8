"""Collectives in a compiled program's HLO text: where they are (inside a ``while`` loop's
computations, or outside) and of which kind.

``hlo_facts`` finds the ``while`` loops (their ``body=`` and ``condition=`` computations and,
transitively, every computation they call through ``calls=``, ``to_apply=``, ...) and the
collectives inside them; ``collectives_by_place`` counts every collective instruction by kind
(``all-reduce``, ``all-gather``, ``reduce-scatter``, ...; an asynchronous ``-start``/``-done``
pair counts once, as its ``-start``) and by place (``loop`` or ``outside``); ``all_reduce_shapes``
lists the array shapes each all-reduce outside the loops produces. Shared by
``benchmarks/sharding.py`` and the multi-device tests (``tests/sharding_cases.py``).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

COLLECTIVES = (
    "all-reduce",
    "all-gather",
    "all-to-all",
    "ragged-all-to-all",
    "collective-permute",
    "collective-broadcast",
    "reduce-scatter",
)
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?(\S+)\s+\(.*\{\s*$")
_OPCODE = re.compile(
    r"\s(" + "|".join(COLLECTIVES) + r")(-start|-done)?\("
)  # an instruction's opcode is followed by "(", a name by " =", "," or ")"
_CALLED = re.compile(
    r"\b(?:calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
)
_CALLED_LIST = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_WHILE = re.compile(r"\swhile\(.*?condition=%?([\w.\-]+), body=%?([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def hlo_computations(text: str) -> dict[str, str]:
    """``{name: body text}`` for every computation of an HLO module's text."""
    comps: dict[str, str] = {}
    name, lines = None, []
    for line in text.splitlines():
        if name is None:
            m = _HEADER.match(line)
            if m and not line.startswith("HloModule"):
                name, lines = m.group(1), []
        elif line.startswith("}"):
            comps[name] = "\n".join(lines)
            name = None
        else:
            lines.append(line)
    return comps


def called(body: str) -> set[str]:
    names = set(_CALLED.findall(body))
    for group in _CALLED_LIST.findall(body):
        names.update(n.strip().lstrip("%") for n in group.split(",") if n.strip())
    return names


def reachable(comps: dict[str, str], roots: set[str]) -> set[str]:
    """``roots`` and every computation they call, transitively."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        n = todo.pop()
        if n in seen or n not in comps:
            continue
        seen.add(n)
        todo.extend(called(comps[n]) - seen)
    return seen


def collectives_in(body: str) -> list[str]:
    return [op + suffix for op, suffix in _OPCODE.findall(body)]


def hlo_facts(text: str) -> dict[str, Any]:
    """While loops, the collectives inside them, and the module's all-reduce count."""
    comps = hlo_computations(text)
    loops = [(c, b) for body in comps.values() for c, b in _WHILE.findall(body)]
    roots = {n for pair in loops for n in pair}
    missing = sorted(r for r in roots if r not in comps)
    in_loops = reachable(comps, roots)
    loop_collectives = sorted({f"{op} in {n}" for n in in_loops for op in collectives_in(comps[n])})
    everywhere = [op for body in comps.values() for op in collectives_in(body)]
    return {
        "n_computations": len(comps),
        "n_while": len(loops),
        "loop_computations_missing": missing,
        "n_loop_computations": len(in_loops),
        "loop_collectives": loop_collectives,
        "all_reduce_total": sum(op in ("all-reduce", "all-reduce-start") for op in everywhere),
        "collectives_total": sorted(set(everywhere)),
        "trip_counts": sorted({int(n) for n in _TRIP.findall(text)}),
    }


_RESULT = re.compile(r"=\s*(\(.*?\)|\S+)\s+(" + "|".join(COLLECTIVES) + r")(-start)?\(")
_ARRAY = re.compile(r"[a-z]+\d*\[([\d,]*)\]")


def _places(text: str) -> tuple[dict[str, str], set[str]]:
    comps = hlo_computations(text)
    roots = {n for body in comps.values() for pair in _WHILE.findall(body) for n in pair}
    return comps, reachable(comps, roots)


def collectives_by_place(text: str) -> dict[str, dict[str, int]]:
    """``{"loop": {kind: n}, "outside": {kind: n}}`` (an async pair counted once)."""
    comps, in_loops = _places(text)
    out: dict[str, Counter] = {"loop": Counter(), "outside": Counter()}
    for name, body in comps.items():
        place = "loop" if name in in_loops else "outside"
        out[place].update(op for op, suffix in _OPCODE.findall(body) if suffix != "-done")
    return {place: dict(sorted(c.items())) for place, c in out.items()}


def all_reduce_shapes(text: str) -> list[tuple[int, ...]]:
    """The shape of every array that an all-reduce outside the loops produces."""
    comps, in_loops = _places(text)
    shapes = []
    for name, body in comps.items():
        if name in in_loops:
            continue
        for result, op, _ in _RESULT.findall(body):
            if op == "all-reduce":
                shapes += [tuple(int(d) for d in s.split(",") if d) for s in _ARRAY.findall(result)]
    return shapes
