"""The tracts' values published apart from their polygons (dpatlas.publication.tract_values):
names, documents and the archive's input."""

import json

import pytest

from dpatlas.publication import tract_values as V
from dpatlas.publication.tract_files import PublishError

NOT_IN_TILES = ("p25_se",)


def _values():
    """Two cells of three tracts in two states, as geojson.json_columns gives them."""
    return {
        "geoid": ["01001000100", "01001000200", "02013000100"] * 2,
        "state": ["01", "01", "02"] * 2,
        "name": ["Census Tract 1; Alabama", "Tract 2 \u00e9 \"q\"", None] * 2,
        "cell": ["a"] * 3 + ["b c/d"] * 3,
        "p25": [0.25, None, 1e-5, 0.5, 0.75, -0.0],
        "p25_se": [0.1] * 6,
        "n": [3, 0, 2**40, 4, 5, 6],
    }


def test_a_cells_folder_is_its_name_or_a_digest_no_plain_name_can_be():
    assert V.cell_folder("outcome-1") == "tract-values/outcome-1"
    odd = V.cell_folder("b c/d")
    assert odd.startswith("tract-values/-") and "/" not in odd.removeprefix("tract-values/")
    assert V.cell_folder("b c/d") != V.cell_folder("b c/e")
    assert V.values_file("outcome-1", "06") == "tract-values/outcome-1/06.json"
    for state in ("6", "060", "ab", "../06"):
        with pytest.raises(ValueError, match="two-digit FIPS"):
            V.values_file("outcome-1", state)


def test_the_geometry_cell_is_all_when_there_else_the_first_sorted():
    assert V.geometry_cell(["b", "all", "a"]) == "all"
    assert V.geometry_cell(["outcome-2", "outcome-10", "outcome-1"]) == "outcome-1"


def test_the_columns_leave_out_geometry_what_the_map_never_shows_and_the_head():
    columns = V.value_columns(["state", "geoid", "name", "cell", "p25", "p25_se", "geometry"],
                              NOT_IN_TILES)
    assert columns == ["geoid", "name", "p25"]
    with pytest.raises(ValueError, match="no geoid"):
        V.value_columns(["name"], NOT_IN_TILES)


def test_one_document_per_cell_and_state_holding_its_rows_in_order():
    values = _values()
    columns = V.value_columns(list(values), NOT_IN_TILES)
    docs = V.documents(values, columns)
    assert sorted(docs) == sorted([V.values_file("a", "01"), V.values_file("a", "02"),
                                   V.values_file("b c/d", "01"), V.values_file("b c/d", "02")])
    for name, text in docs.items():
        doc = json.loads(text)  # the standard library reads it: no reader of ours needed
        assert name == V.values_file(doc["cell"], doc["state"])
        assert doc["columns"] == ["geoid", "name", "p25", "n"]
        expected = [[values[c][i] for c in doc["columns"]] for i in range(6)
                    if values["cell"][i] == doc["cell"] and values["state"][i] == doc["state"]]
        assert doc["rows"] == expected and expected
    first = json.loads(docs[V.values_file("a", "01")])
    assert first["rows"][1] == ["01001000200", "Tract 2 \u00e9 \"q\"", None, 0]
    assert json.loads(docs[V.values_file("a", "02")])["rows"][0][2:] == [1e-5, 2**40]


def test_without_a_state_column_the_state_is_the_geoids_first_two_digits():
    values = {k: v for k, v in _values().items() if k != "state"}
    docs = V.documents(values, V.value_columns(list(values), NOT_IN_TILES))
    assert V.values_file("a", "02") in docs and len(docs) == 4


def test_a_document_is_never_written_over(tmp_path):
    values = _values()
    columns = V.value_columns(list(values), NOT_IN_TILES)
    written = V.write_documents(tmp_path, values, columns)
    assert len(written) == 4 and all((tmp_path / name).is_file() for name in written)
    assert V.read_document(tmp_path / written[0])["columns"] == columns
    with pytest.raises(PublishError, match="in two groups of cells"):
        V.write_documents(tmp_path, values, columns)


def test_published_names_are_told_apart_and_titled():
    name = V.values_file("outcome-1", "06")
    assert V.is_values_document(name)
    assert V.document_title(name) == ("Tract values of cell outcome-1, state 06: the web "
                                      "map's (JSON)")
    assert "one cell" in V.document_title(V.values_file("b c/d", "06"))
    for other in ("tract-values/outcome-1/6.json", "tracts/state=06/part-0.parquet",
                  "tract-values/06.json", "tract-values/a/b/06.json"):
        assert not V.is_values_document(other)


def test_the_archives_input_is_the_geometry_cells_polygons_with_the_geoid_alone():
    values = _values()
    geometry = [json.dumps({"type": "Point", "coordinates": [i, i]}) for i in range(6)]
    texts = V.geometry_input_texts(values, geometry, "b c/d")
    features = [json.loads(t) for t in texts]
    assert [f["properties"] for f in features] == [{"geoid": g} for g in values["geoid"][:3]]
    assert [f["geometry"]["coordinates"][0] for f in features] == [3, 4, 5]
    assert all("id" not in f for f in features)
