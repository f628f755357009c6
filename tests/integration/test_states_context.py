"""The map's context layer (issue 33 item 4): the 48 contiguous states' outlines, public
geography from libpysal's bundled Census outlines, small enough to ship with every map."""

from __future__ import annotations

import json

import shapely

from dpatlas.publication import stac
from dpatlas.publication.context import CONTEXT_FILE, states_context, states_context_bytes
from dpatlas.publication.webmap import write_web_map


def test_the_context_is_the_48_contiguous_states_named_simplified_and_small():
    frame = states_context()
    assert len(frame) == 48 and frame["state"].is_unique
    assert not {"02", "15", "11", "72"} & set(frame["state"])
    row = frame.set_index("state").loc["37"]
    assert (row["name"], row["postal"]) == ("North Carolina", "NC")
    assert frame.geometry.is_valid.all() and (frame.geometry.area > 0).all()
    doc = json.loads(states_context_bytes())
    assert doc["type"] == "FeatureCollection" and len(doc["features"]) == 48
    assert len(states_context_bytes()) < 150_000  # simplified: it loads with every map


def test_every_web_map_ships_the_context_as_map_support_not_a_download(tmp_path):
    files = write_web_map(tmp_path, "20261129T000000Z-ctx")
    assert CONTEXT_FILE in files
    assert (tmp_path / CONTEXT_FILE).read_bytes() == states_context_bytes()
    assert stac.asset_roles(CONTEXT_FILE) == ["visual"] and not stac.is_download(CONTEXT_FILE)
