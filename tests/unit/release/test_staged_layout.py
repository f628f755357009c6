"""The staged partitions' layout: (cell, GEOID) order, small row groups, so that a chunk's
filtered read skips the row groups of the other tracts and cells."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest

from dpatlas.release import staged_layout
from dpatlas.release.estimate import Chunk, read_chunk


def _records(tracts: int, cells: int, per: int, seed: int = 0) -> pd.DataFrame:
    """``per`` records of each tract in each cell, in person order (every cell of a person
    together), as an input may come."""
    rng = np.random.default_rng(seed)
    geoids = [f"17{k:09d}" for k in range(tracts)]
    rows = [(g, f"c{c:02d}") for g, _, c in itertools.product(geoids, range(per), range(cells))]
    frame = pd.DataFrame(rows, columns=["geoid", "cell"])
    return frame.assign(row=np.arange(len(frame)), x=rng.random(len(frame)),
                        y=rng.random(len(frame)))


def _clustered_by_definition(frame: pd.DataFrame) -> bool:
    """Each cell one run of rows, its GEOIDs never falling (the definition, row by row)."""
    runs = (frame["cell"] != frame["cell"].shift()).cumsum()
    if runs.max() != frame["cell"].nunique():
        return False
    return all(list(g) == sorted(g) for _, g in frame.groupby(runs)["geoid"])


def test_is_clustered_agrees_with_its_definition():
    rng = np.random.default_rng(1)
    seen = set()
    for _ in range(300):
        n = int(rng.integers(2, 12))
        frame = pd.DataFrame({"cell": rng.choice(["a", "b", "c"], n),
                              "geoid": rng.choice(["01", "02", "03"], n)})
        expected = _clustered_by_definition(frame)
        seen.add(expected)
        assert staged_layout.is_clustered(frame) == expected, frame
    assert seen == {True, False}


def test_cells_in_their_own_order_are_not_sorted_again():
    """outcome-1, outcome-2, ..., outcome-10: not sorted as text, but each cell one run in
    GEOID order (what the national generator writes at 10 cells and more)."""
    frame = pd.concat([_records(tracts=5, cells=1, per=2).assign(cell=f"outcome-{k}")
                       for k in range(1, 12)], ignore_index=True)
    assert staged_layout.is_clustered(frame)
    assert staged_layout.clustered(frame) is frame


def test_clustered_sorts_by_cell_then_geoid_keeping_each_tract_cells_order():
    # a shuffled frame: sorted, each (tract, cell)'s records in the order they came
    frame = _records(tracts=30, cells=4, per=5).sample(frac=1.0, random_state=3)
    out = staged_layout.clustered(frame)
    assert staged_layout.is_clustered(out)
    assert sorted(out["row"]) == sorted(frame["row"])
    # each (tract, cell)'s records in the order they came: what the estimates read
    for key, rows in frame.groupby(["cell", "geoid"])["row"]:
        got = out.loc[(out["cell"] == key[0]) & (out["geoid"] == key[1]), "row"]
        assert list(got) == list(rows)


def test_an_ordered_frame_is_not_copied():
    frame = staged_layout.clustered(_records(tracts=10, cells=3, per=2))
    assert staged_layout.clustered(frame) is frame


def test_a_chunk_reads_only_the_row_groups_of_its_tracts_and_cells(tmp_path, monkeypatch):
    """What the layout is for: pyarrow keeps, by their statistics, the row groups that can
    hold the chunk's rows. Written in the order it came (here shuffled), in groups as small,
    every record is read."""
    monkeypatch.setattr(staged_layout, "ROW_GROUP_ROWS", 1_000)
    frame = _records(tracts=200, cells=6, per=10).sample(frac=1.0, random_state=5)
    laid_out = tmp_path / "staged.parquet"
    staged_layout.write(frame, laid_out)
    as_given = tmp_path / "as-given.parquet"
    frame.to_parquet(as_given, index=False, row_group_size=1_000)

    first, last, cells = "17000000050", "17000000099", ("c01", "c02")
    chunk_filter = ((ds.field("geoid") >= first) & (ds.field("geoid") <= last)
                    & ds.field("cell").isin(list(cells)))

    def rows_read(path) -> int:
        fragment = next(ds.dataset(path).get_fragments())
        return sum(group.num_rows for piece in fragment.split_by_row_group(chunk_filter)
                   for group in piece.row_groups)

    assert rows_read(as_given) == 12_000
    # the chunk's 1,000 rows (50 tracts x 2 cells x 10) lie in a group or two of each cell
    assert rows_read(laid_out) <= 4_000
    wanted = frame[(frame["geoid"] >= first) & (frame["geoid"] <= last)
                   & frame["cell"].isin(cells)]
    got = read_chunk(Chunk(laid_out, first, last, "input-17-0", cells))
    assert len(got) == len(wanted) == 1_000
    pd.testing.assert_frame_equal(
        got.sort_values(["cell", "geoid", "x"]).reset_index(drop=True),
        wanted[list(got.columns)].sort_values(["cell", "geoid", "x"]).reset_index(drop=True),
        check_dtype=False)


@pytest.mark.parametrize("column", ["cell", "geoid"])
def test_a_null_key_is_sorted_not_trusted(column):
    frame = pd.DataFrame({"cell": ["a", "a"], "geoid": ["1", "2"]})
    frame.loc[0, column] = None
    assert not staged_layout.is_clustered(frame)


def test_per_record_columns_are_written_plain_and_read_back_the_same(tmp_path):
    """Dictionary encoding for the columns whose values repeat (GEOID, cell, ranks), none for
    the per-record ones (``row``, ``person_id``); the records read back unchanged."""
    import pyarrow.parquet as pq

    frame = _records(30, 2, 5).assign(person_id=lambda f: [f"p{i:08d}" for i in range(len(f))])
    path = tmp_path / "staged.parquet"
    staged_layout.write(frame, path)
    meta = pq.ParquetFile(path).metadata
    columns = meta.row_group(0)
    encodings = {columns.column(i).path_in_schema: columns.column(i).encodings
                 for i in range(columns.num_columns)}
    for name in ("geoid", "cell", "x", "y"):
        assert "RLE_DICTIONARY" in encodings[name], (name, encodings[name])
    for name in staged_layout.PER_RECORD_COLUMNS:
        assert not any("DICTIONARY" in e for e in encodings[name]), (name, encodings[name])
    back = pd.read_parquet(path)
    want = staged_layout.clustered(frame)
    assert back.columns.tolist() == want.columns.tolist()
    for column in want.columns:
        assert back[column].astype(str).tolist() == want[column].astype(str).tolist(), column
