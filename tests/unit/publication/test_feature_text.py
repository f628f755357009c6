"""The published features' text (dpatlas.publication.geojson): what ``feature_texts`` writes
reads back as the row's values, whatever their kind, and ``geometry_texts`` rounds every
number GEOS prints with more decimals than published, and only those (issue 35: both made
cheaper; these check the text did not change in meaning)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import shapely
from shapely.geometry import Polygon

from dpatlas.publication.geojson import (_LONG_DECIMAL, feature_ids, feature_texts,
                                         geometry_texts, rfc7946_geometries)


def _rows() -> pd.DataFrame:
    return pd.DataFrame({
        "geoid": ["01001000100", "01001000200", "72001000300"],
        "name": ["Tract 1; Alabama", "réservé, «Nord» \"q\" \\ \u2028", "Añasco 𝔘"],
        "n": np.array([48, 0, 2**40], dtype=np.int64),
        "p25": [0.4383, 1.5e-05, float("nan")],
        "p75": [1e16, -0.0, float("inf")],
        "reason": ["", None, "fewer than 2 records"],
        "epsilon_spent": [0.999999900914715, 0.0, 1.0],
    })


def test_each_feature_reads_back_as_its_row():
    rows = _rows()
    geoms = np.array([Polygon([(0, 0), (1, 0), (1, 1), (0, 0)])] * 3, dtype=object)
    texts = feature_texts(rows, geoms, feature_ids(rows))
    for text, (_, row) in zip(texts, rows.iterrows()):
        feature = json.loads(text)  # strict JSON: no NaN or Infinity
        assert feature["type"] == "Feature" and feature["id"] == row["geoid"]
        assert feature["geometry"]["type"] == "Polygon"
        props = feature["properties"]
        assert list(props) == list(rows.columns)
        for name, value in row.items():
            if isinstance(value, float) and not math.isfinite(value):
                assert props[name] is None, name
            elif value is None:
                assert props[name] is None, name
            else:
                assert props[name] == value and type(props[name]) is type(value.item()
                    if hasattr(value, "item") else value), name
    assert "\\u" not in texts[1] and "»" in texts[1]  # UTF-8 text, as json with ensure_ascii off


def test_features_without_ids():
    rows = _rows().drop(columns=["geoid"])
    geoms = np.array([None] * 3, dtype=object)
    texts = feature_texts(rows, geoms, None)
    assert all('"id"' not in t and json.loads(t)["geometry"] is None for t in texts)


def test_every_long_number_is_rounded_and_no_other():
    rng = np.random.default_rng(7)
    raw = []
    for k in range(300):
        x, y = -120 + rng.uniform(0, 50), 25 + rng.uniform(0, 20)
        step = 0.01 + rng.uniform(0, 0.01)
        raw.append(Polygon([(x, y), (x + step, y), (x + step, y + step), (x, y + step)]))
    snapped = rfc7946_geometries(np.array(raw, dtype=object))
    # the unsnapped ones keep 13-17 digits; the snapped mostly six decimals, some not
    geoms = np.array([*raw[:50], *snapped], dtype=object)
    texts = geometry_texts(geoms)
    printed = shapely.to_geojson(geoms)
    every = [_LONG_DECIMAL.sub(lambda m: repr(round(float(m.group()), 6)), t) for t in printed]
    assert texts == every
    assert sum(t != p for t, p in zip(texts, printed)) >= 50  # the long ones were rewritten
    assert not any(_LONG_DECIMAL.search(t) for t in texts)


def test_text_columns_of_every_string_kind_give_text_or_null():
    from dpatlas.publication.geojson import json_columns

    labels = ["a", None, "ü 𝔘", ""]
    kinds = [pd.StringDtype("pyarrow"), pd.StringDtype("python"),
             pd.StringDtype("pyarrow", na_value=np.nan), pd.StringDtype("python", na_value=np.nan),
             object]
    for kind in kinds:
        got = json_columns(pd.DataFrame({"name": pd.Series(labels, dtype=kind)}))["name"]
        assert got == labels and all(type(v) is str for v in got if v is not None), kind
