"""The draw-once checkpoint (dpatlas/release/draws.py): each crash point of its order, the
header that replaced ``state.json``, tampering, and the migration of a release begun by the
version with ``state.json``. Draws are counted by a draw function that counts its calls."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pandas as pd
import pytest

from dpatlas.core.errors import OperatorError, ReleaseRefused
from dpatlas.core.hashing import sha256_file
from dpatlas.release import crash
from dpatlas.release.draws import (DRAWS_FILE, DrawLog, PersistedDrawChanged, draw_once,
                                   noise_source)
from dpatlas.release.run_state import InputChanged

CFG, INP = "c" * 64, "i" * 64


class Draws:
    """A draw function per (stage, chunk) that counts its calls; each call new numbers."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []

    def __call__(self, stage: str, chunk: str):
        def draw() -> pd.DataFrame:
            self.calls.append((stage, chunk))
            return pd.DataFrame({"geoid": ["17001000100"], "noise": [float(len(self.calls))]})
        return draw


class Crash(Exception):
    pass


@pytest.fixture
def internal(tmp_path) -> Path:
    folder = tmp_path / "r1"
    folder.mkdir()
    return folder


def opened(internal: Path, cfg: str = CFG, inp: str = INP, said: list | None = None) -> DrawLog:
    DrawLog.open(internal, internal.name, cfg, inp, clock=lambda: "2026-11-26T00:00:00+00:00",
                 say=(said if said is not None else []).append)
    return DrawLog(internal)


def run(log: DrawLog, draws: Draws, stage: str, chunk: str, said: list | None = None) -> Path:
    out = log.internal / {"select": "selection", "estimate": "results"}[stage] / f"{chunk}.parquet"
    path, _ = draw_once(log, stage, chunk, out, draws(stage, chunk), noise_source(7),
                        (said if said is not None else []).append)
    return path


def crash_at(point: str):
    def hook(name: str) -> None:
        if name == point:
            raise Crash(name)
    return hook


def test_the_header_is_written_once_and_a_resume_keeps_the_original_start(internal):
    DrawLog.open(internal, "r1", CFG, INP, clock=lambda: "2026-01-01T00:00:00+00:00")
    header = DrawLog.open(internal, "r1", CFG, INP, clock=lambda: "2026-12-31T00:00:00+00:00")
    assert header == {"release_id": "r1", "config_sha256": CFG, "input_sha256": INP,
                      "started": "2026-01-01T00:00:00+00:00", "protocol": 2}
    assert len((internal / DRAWS_FILE).read_text().splitlines()) == 1
    assert not (internal / "state.json").exists()


@pytest.mark.parametrize("cfg, inp, changed", [
    ("x" * 64, INP, ["config"]), (CFG, "y" * 64, ["input"]),
    ("x" * 64, "y" * 64, ["input", "config"])])
def test_a_resume_with_another_config_or_input_is_refused(internal, cfg, inp, changed):
    opened(internal)
    with pytest.raises(InputChanged) as err:
        opened(internal, cfg, inp)
    assert err.value.changed == changed
    what = " and ".join(changed)
    assert f"the {what} changed since release r1 began" in str(err.value)
    assert f"restore the original {what}" in str(err.value)
    assert DrawLog(internal).header()["config_sha256"] == CFG  # the original kept


def test_a_recorded_draw_is_reused_and_never_drawn_again(internal):
    log, draws = opened(internal), Draws()
    first = run(log, draws, "select", "c0")
    said = []
    again = run(opened(internal), draws, "select", "c0", said)  # a resumed run
    assert again == first and draws.calls == [("select", "c0")]
    assert "reusing the recorded select draw" in said[0]
    (line,) = DrawLog(internal).lines()[1:]
    assert line["path"] == "selection/c0.parquet" and line["sha256"] == sha256_file(first)
    assert line["stage"] == "select" and line["chunk"] == "c0"
    assert line["noise"] == "seeded 7 (test only)"


def test_a_crash_between_the_rename_and_the_record_redraws_the_unseen_draw(internal,
                                                                           monkeypatch):
    log, draws = opened(internal), Draws()
    run(log, draws, "select", "c0")
    monkeypatch.setattr(crash, "fault_hook", crash_at("before-record-select-c1"))
    with pytest.raises(Crash):
        run(log, draws, "select", "c1")
    # persisted under its pending name, never recorded: nothing may have read it
    unseen = internal / "selection" / "c1.parquet.unrecorded"
    assert unseen.exists() and ("select", "c1") not in DrawLog(internal).draws()
    assert not (internal / "selection" / "c1.parquet").exists()
    monkeypatch.setattr(crash, "fault_hook", None)

    said = []
    log = opened(internal)
    run(log, draws, "select", "c0", said)
    run(log, draws, "select", "c1", said)
    # c0, recorded before the crash, was not drawn again; c1 was never recorded, so never
    # read: drawn once more, over the unseen file, and the log says so
    assert draws.calls == [("select", "c0"), ("select", "c1"), ("select", "c1")]
    assert any("never recorded" in s and "c1.parquet" in s for s in said)
    recorded = DrawLog(internal).draws()
    assert sorted(recorded) == [("select", "c0"), ("select", "c1")]
    kept = internal / "selection" / "c1.parquet"
    assert recorded[("select", "c1")]["sha256"] == sha256_file(kept) and not unseen.exists()
    assert pd.read_parquet(kept)["noise"].tolist() == [3.0]  # the redraw is what is kept


def test_a_crash_in_the_draw_leaves_nothing_and_draws_once_on_resume(internal,
                                                                           monkeypatch):
    log, draws = opened(internal), Draws()

    def crash_in_draw():
        draws.calls.append(("select", "c0"))
        raise Crash("in the draw")

    with pytest.raises(Crash):
        draw_once(log, "select", "c0", internal / "selection" / "c0.parquet", crash_in_draw,
                  noise_source(None))
    assert not (internal / "selection" / "c0.parquet").exists()
    run(opened(internal), draws, "select", "c0")
    run(opened(internal), draws, "select", "c0")
    assert draws.calls == [("select", "c0")] * 2  # the one in the crash drew nothing persisted
    assert len(DrawLog(internal).draws()) == 1


def test_a_torn_last_line_is_reported_cut_off_and_its_draw_made_again(internal):
    log, draws = opened(internal), Draws()
    run(log, draws, "select", "c0")
    run(log, draws, "select", "c1")
    whole = (internal / DRAWS_FILE).read_bytes()
    torn = whole[:-40]  # a crash in the middle of c1's append
    (internal / DRAWS_FILE).write_bytes(torn)
    c1 = internal / "selection" / "c1.parquet"  # which came before c1's rename
    c1.rename(c1.with_name("c1.parquet.unrecorded"))
    assert list(DrawLog(internal).draws()) == [("select", "c0")]  # read: the torn line ignored

    said = []
    log = opened(internal, said=said)
    assert any("torn last line" in s for s in said)
    assert (internal / DRAWS_FILE).read_bytes().endswith(b"\n")
    run(log, draws, "select", "c0")
    run(log, draws, "select", "c1")
    run(log, draws, "estimate", "c0")
    assert draws.calls.count(("select", "c0")) == 1 and draws.calls.count(("select", "c1")) == 2
    assert sorted(DrawLog(internal).draws()) == [("estimate", "c0"), ("select", "c0"),
                                                 ("select", "c1")]


def test_a_tampered_recorded_draw_is_refused_never_reused_or_redrawn(internal):
    log, draws = opened(internal), Draws()
    path = run(log, draws, "select", "c0")
    pd.DataFrame({"geoid": ["17001000100"], "noise": [0.0]}).to_parquet(path, index=False)
    tampered = path.read_bytes()
    with pytest.raises(PersistedDrawChanged) as err:
        run(opened(internal), draws, "select", "c0")
    message = str(err.value)
    assert str(path) in message and "differs from the one recorded" in message
    assert "never drawn again" in message and "restore c0.parquet" in message
    assert "\n" not in message
    assert draws.calls == [("select", "c0")] and path.read_bytes() == tampered
    assert isinstance(err.value, OperatorError) and not isinstance(err.value, ReleaseRefused)


def test_a_lost_recorded_draw_is_refused_not_redrawn(internal):
    log, draws = opened(internal), Draws()
    path = run(log, draws, "estimate", "c0")
    path.unlink()
    with pytest.raises(PersistedDrawChanged, match="results/c0.parquet, is missing"):
        run(opened(internal), draws, "estimate", "c0")
    assert draws.calls == [("estimate", "c0")] and not path.exists()


def test_a_damaged_line_before_the_last_is_refused(internal):
    log, draws = opened(internal), Draws()
    run(log, draws, "select", "c0")
    run(log, draws, "select", "c1")
    lines = (internal / DRAWS_FILE).read_text().splitlines(keepends=True)
    lines[1] = lines[1][:20] + "\n"
    (internal / DRAWS_FILE).write_text("".join(lines))
    with pytest.raises(PersistedDrawChanged, match="line 2 is not a record"):
        run(opened(internal), draws, "select", "c1")
    assert len(draws.calls) == 2


def test_appends_from_parallel_chunks_are_whole_lines(internal):
    log = opened(internal)
    threads = [threading.Thread(target=run, args=(log, Draws(), "select", f"c{k}"))
               for k in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(DrawLog(internal).draws()) == sorted(("select", f"c{k}") for k in range(24))


def legacy_release(internal: Path, started: str | None = "2026-11-20T08:00:00+00:00") -> Draws:
    """A release as the previous version left it: ``state.json`` and persisted stage files."""
    state = {"input_sha256": INP, "config_sha256": CFG}
    if started:
        state["started"] = started
    (internal / "state.json").write_text(json.dumps(state))
    draws = Draws()
    for folder, stage in (("selection", "select"), ("results", "estimate")):
        (internal / folder).mkdir()
        draws(stage, "input-17-0")().to_parquet(internal / folder / "input-17-0.parquet",
                                                index=False)
    # chunk 1: selected, not yet estimated when the old run stopped
    (internal / "selection" / "input-17-1.parquet").write_bytes(
        (internal / "selection" / "input-17-0.parquet").read_bytes())
    return draws


def test_a_release_begun_with_state_json_resumes_from_its_persisted_draws(internal):
    draws = legacy_release(internal)
    said = []
    header = DrawLog.open(internal, "r1", CFG, INP, clock=lambda: "later", say=said.append)
    assert header == {"release_id": "r1", "config_sha256": CFG, "input_sha256": INP,
                      "started": "2026-11-20T08:00:00+00:00",  # the original start
                      "protocol": 2}  # every persisted file is recorded: the pending rule holds
    assert not (internal / "state.json").exists() and "migrated state.json" in said[0]
    log, before = DrawLog(internal), len(draws.calls)
    recorded = log.draws()
    assert sorted(recorded) == [("estimate", "input-17-0"), ("select", "input-17-0"),
                                ("select", "input-17-1")]
    for (stage, chunk), line in recorded.items():
        assert line["sha256"] == sha256_file(internal / line["path"])
    run(log, draws, "select", "input-17-0")
    run(log, draws, "select", "input-17-1")
    run(log, draws, "estimate", "input-17-0")
    run(log, draws, "estimate", "input-17-1")
    assert draws.calls[before:] == [("estimate", "input-17-1")]  # only what was never drawn


def test_a_legacy_release_resumed_with_another_input_is_refused_and_keeps_its_header(internal):
    legacy_release(internal, started=None)
    with pytest.raises(InputChanged, match="the input changed since release r1 began"):
        DrawLog.open(internal, "r1", CFG, "y" * 64, clock=lambda: "now")
    header = DrawLog(internal).header()
    assert header["input_sha256"] == INP and header["started"] == "now"
    assert DrawLog.open(internal, "r1", CFG, INP)["started"] == "now"  # restored: resumes


# -- issue 31: the plan in the header, and draw once without trusting the log alone ------------

def layout(*chunks: tuple, levels: tuple = ()) -> dict:
    """A draw layout (``plan_record.draw_layout``) of chunks (name, first, last, cells)."""
    return {"draw_layout_version": 1, "chunks": [list(c) for c in chunks],
            "levels": [list(u) for u in levels]}


ONE_RANGE = (("c0", "17001000100", "17001000900", None), ("c1", "17001001000", "17001009900", None))
LAYOUT = layout(*ONE_RANGE)  # the draws these tests make: c0


def entry(epsilon: float = 0.31, package: str = "1.0") -> dict:
    from dpatlas.core.plan_record import plan_sha256

    plan = {"levels": {"county": {"epsilon": epsilon}}, "steps": {"level county": {"e": epsilon}}}
    return {"plan": plan, "plan_sha256": plan_sha256(plan),
            "code_version": {"package": package, "git_commit": None, "source_sha256": "s"}}


def test_the_charge_records_the_plan_in_the_header_and_a_resume_under_another_is_refused(
        internal):
    from dpatlas.core.plan_record import PlanChanged

    log, draws = opened(internal), Draws()
    log.settle_plan(entry(), LAYOUT)
    header = DrawLog(internal).header()
    assert header["plan"] == entry()["plan"] and header["plan_sha256"] == entry()["plan_sha256"]
    assert header["code_version"]["package"] == "1.0"
    run(log, draws, "select", "c0")
    before = (internal / DRAWS_FILE).read_bytes()

    with pytest.raises(PlanChanged) as err:
        opened(internal).settle_plan(entry(0.45, package="2.0"), LAYOUT)
    assert "levels/county/epsilon: 0.31 → 0.45" in str(err.value)
    assert "dpatlas 1.0" in str(err.value)  # the version that began it can finish it
    assert isinstance(err.value, OperatorError)
    assert (internal / DRAWS_FILE).read_bytes() == before  # nothing written

    opened(internal).settle_plan(entry(package="2.0"), LAYOUT)  # same plan, new code: resumes
    assert (internal / DRAWS_FILE).read_bytes() == before  # the code version is not compared


def test_a_plan_no_draw_was_made_under_is_replaced(internal):
    log = opened(internal)
    log.settle_plan(entry(), LAYOUT)
    said = []
    log.settle_plan(entry(0.45), LAYOUT, say=said.append)  # e.g. refused over the cap, then upgraded
    assert DrawLog(internal).header()["plan"] == entry(0.45)["plan"]
    assert "no draw was made under the plan" in said[0]


def test_a_header_from_before_plans_with_draws_is_left_to_the_ledger(internal):
    log, draws = opened(internal), Draws()
    run(log, draws, "select", "c0")
    before = (internal / DRAWS_FILE).read_bytes()
    log.settle_plan(entry(), LAYOUT)  # nothing to compare here: the ledger compares the charges
    assert (internal / DRAWS_FILE).read_bytes() == before


# -- issue 35: the draw layout in the header -------------------------------------------------

def test_a_resume_whose_draws_are_grouped_otherwise_is_refused(internal):
    from dpatlas.release.draws import DrawLayoutChanged

    log, draws = opened(internal), Draws()
    log.settle_plan(entry(), layout(*ONE_RANGE, levels=[("state-17", "17", None)]))
    header = DrawLog(internal).header()
    assert header["draw_layout"]["chunks"][0] == ["c0", "17001000100", "17001000900", None]
    run(log, draws, "select", "c0")
    before = (internal / DRAWS_FILE).read_bytes()

    # the same name over other tracts (a version that chunks otherwise), and a level task
    # split by cells: both named, nothing written
    moved = (("c0", "17001000100", "17001001500", None), ("c1", "17001001600", "17001009900", None))
    with pytest.raises(DrawLayoutChanged) as err:
        opened(internal).settle_plan(entry(package="2.0"), layout(
            *moved, levels=[("state-17-c0", "17", ["a"]), ("state-17-c1", "17", ["b"])]))
    text = str(err.value)
    assert "chunks/c0/geoids" in text and "chunks/c1/geoids" in text
    assert "levels/state-17: " in text and "levels/state-17-c0: (none) →" in text
    assert "dpatlas 1.0" in text  # the version that began it can finish it
    assert isinstance(err.value, ReleaseRefused) and isinstance(err.value, OperatorError)
    assert (internal / DRAWS_FILE).read_bytes() == before

    # the same tasks in another order seed otherwise in test mode: refused too
    with pytest.raises(DrawLayoutChanged, match="the order of the tasks"):
        opened(internal).settle_plan(entry(), layout(*reversed(ONE_RANGE),
                                                     levels=[("state-17", "17", None)]))
    # the same layout under new code resumes, and writes nothing
    opened(internal).settle_plan(entry(package="2.0"),
                                 layout(*ONE_RANGE, levels=[("state-17", "17", None)]))
    assert (internal / DRAWS_FILE).read_bytes() == before


def test_a_layout_no_draw_was_made_under_is_replaced(internal):
    log = opened(internal)
    log.settle_plan(entry(), layout(*ONE_RANGE))
    log.settle_plan(entry(), layout(ONE_RANGE[0]))  # same plan, other tasks, nothing drawn
    assert DrawLog(internal).header()["draw_layout"]["chunks"] == [list(ONE_RANGE[0])]


def test_a_header_from_before_layouts_is_refused_only_for_draws_with_no_task(internal):
    from dpatlas.release.draws import DrawLayoutChanged

    log, draws = opened(internal), Draws()
    log.settle_plan(entry(), LAYOUT)
    header = log.header()  # as the version before layouts recorded it:
    log._write({k: v for k, v in header.items() if not k.startswith("draw_layout")})
    run(log, draws, "select", "c0")
    before = (internal / DRAWS_FILE).read_bytes()
    with pytest.raises(DrawLayoutChanged, match="select c0: recorded, not a task of this run"):
        opened(internal).settle_plan(entry(), layout(("c0-c0", "1", "2", ["a"])))
    opened(internal).settle_plan(entry(), layout(*ONE_RANGE))  # its names: all it can check
    assert (internal / DRAWS_FILE).read_bytes() == before  # and no layout is claimed for it


def test_a_missing_log_of_a_charged_release_is_refused_never_begun_afresh(internal):
    from dpatlas.release.draws import DrawLogMissing

    log, draws = opened(internal), Draws()
    run(log, draws, "select", "c0")
    (internal / DRAWS_FILE).unlink()
    with pytest.raises(DrawLogMissing, match="charged in the ledger but .*draws.jsonl is missing"):
        DrawLog.open(internal, "r1", CFG, INP, charged=True)
    assert not (internal / DRAWS_FILE).exists() and draws.calls == [("select", "c0")]
    # whatever the ledger says, draw files the new log would not record are refused too
    with pytest.raises(PersistedDrawChanged, match="selection/c0.parquet"):
        DrawLog.open(internal, "r1", CFG, INP)
    assert not (internal / DRAWS_FILE).exists()  # refused before a new log is begun


def test_a_cut_log_is_refused_when_opened_and_its_draws_never_redrawn(internal):
    log, draws = opened(internal), Draws()
    run(log, draws, "select", "c0")
    run(log, draws, "select", "c1")
    lines = (internal / DRAWS_FILE).read_text().splitlines(keepends=True)
    (internal / DRAWS_FILE).write_text(lines[0])  # header intact, every draw's line cut
    with pytest.raises(PersistedDrawChanged, match="does not record 2 persisted noise draw"):
        opened(internal)
    with pytest.raises(PersistedDrawChanged, match="is not recorded in the log"):
        run(DrawLog(internal), draws, "select", "c1")  # and draw_once refuses it too
    assert draws.calls == [("select", "c0"), ("select", "c1")]


def test_a_recorded_draw_still_under_its_pending_name_is_renamed_and_reused(internal):
    log, draws = opened(internal), Draws()
    path = run(log, draws, "select", "c0")
    path.rename(path.with_name("c0.parquet.unrecorded"))  # a crash between record and rename
    again = run(opened(internal), draws, "select", "c0")
    assert again == path and path.exists() and draws.calls == [("select", "c0")]


def test_require_recorded_names_the_draws_the_log_does_not_hold(internal):
    log, draws = opened(internal), Draws()
    run(log, draws, "select", "c0")
    log.require_recorded({("select", "c0")}, "published")
    with pytest.raises(PersistedDrawChanged, match="published, but .* does not record 1 .*"
                                                   "estimate c0"):
        log.require_recorded({("select", "c0"), ("estimate", "c0")}, "published")


def test_the_noise_sources_are_counted_from_the_log(internal):
    log = opened(internal)
    for k, seed in enumerate((7, None, None)):
        out = internal / "selection" / f"c{k}.parquet"
        draw_once(log, "select", f"c{k}", out, Draws()("select", f"c{k}"), noise_source(seed))
    assert DrawLog(internal).noise_sources() == {"os.urandom": 2, "seeded 7 (test only)": 1}
