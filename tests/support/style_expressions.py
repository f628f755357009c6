"""The subset of MapLibre's style expressions the web map writes, evaluated in Python for a
feature (its properties and its feature state), so a browser test can tell which features a
layer draws: queryRenderedFeatures returns every feature of a layer whose filter passes, also
those the layer's opacity expression hides (app.js sets a mark's opacity from feature state,
which a filter cannot read)."""

from __future__ import annotations

import math


def _number(value, *fallbacks):
    for v in (value, *fallbacks):
        if isinstance(v, bool):
            return 1.0 if v else 0.0
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, str):
            try:
                return float(v)
            except ValueError:
                continue
    return 0.0


def evaluate(expr, props: dict, state: dict):
    """``expr`` for a feature with ``props`` and feature ``state``."""
    if not isinstance(expr, list):
        return expr
    op, args = expr[0], expr[1:]

    def ev(e):
        return evaluate(e, props, state)

    if op == "get":
        return props.get(args[0])
    if op == "feature-state":
        return state.get(args[0])
    if op == "has":
        return args[0] in props
    if op == "literal":
        return args[0]
    if op == "all":
        return all(ev(a) for a in args)
    if op in ("==", "!="):
        same = ev(args[0]) == ev(args[1])
        return same if op == "==" else not same
    if op in (">", "<", ">=", "<="):
        a, b = ev(args[0]), ev(args[1])
        return {">": a > b, "<": a < b, ">=": a >= b, "<=": a <= b}[op]
    if op == "abs":
        return abs(ev(args[0]))
    if op == "to-number":
        return _number(*(ev(a) for a in args))
    if op == "step":
        value, out = ev(args[0]), ev(args[1])
        for i in range(2, len(args), 2):
            if value >= args[i]:
                out = ev(args[i + 1])
        return out
    if op == "case":
        for i in range(0, len(args) - 1, 2):
            if ev(args[i]):
                return ev(args[i + 1])
        return ev(args[-1])
    if op == "match":
        value = ev(args[0])
        for i in range(1, len(args) - 1, 2):
            labels = args[i] if isinstance(args[i], list) else [args[i]]
            if value in labels:
                return ev(args[i + 1])
        return ev(args[-1])
    raise ValueError(f"style expression operator {op!r} is not evaluated here")


def drawn(features: list[list], filter_expr, opacity) -> list[dict]:
    """The properties of the features (each [properties, state]) a layer draws: its filter
    passes and its opacity is above 0."""
    out = []
    for props, state in features:
        state = state or {}
        if filter_expr is not None and not evaluate(filter_expr, props, state):
            continue
        value = 1 if opacity is None else evaluate(opacity, props, state)
        if isinstance(value, (int, float)) and not math.isnan(value) and value > 0:
            out.append({**props, **state})
    return out


def rendered(page, layer: str) -> list[dict]:
    """What ``layer`` draws in view, from the map in ``page`` (a Playwright page)."""
    got = page.evaluate("""layer => {
        const map = window.dpatlas.map, type = map.getLayer(layer).type;
        return {features: map.queryRenderedFeatures({layers: [layer]})
                  .map(f => [f.properties, f.state]),
                filter: map.getFilter(layer) || null,
                opacity: map.getPaintProperty(layer, type + "-opacity") ?? null}; }""", layer)
    return drawn(got["features"], got["filter"], got["opacity"])
