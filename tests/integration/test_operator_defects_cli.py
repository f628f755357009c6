"""Operator defects D1, D2, D6, D11, D12 and D15 of issue 17: each reproduced first, then fixed.

The command line is driven in-process (typer's CliRunner) where exit codes and messages are the
whole story; a subprocess where a traceback or the interpreter's exit code matters.
"""

from __future__ import annotations

import errno
import math
import os
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dpatlas.core.config import load_config
from dpatlas.ledger import Charge, Ledger

from tests.support.cli import ENV
from tests.support.cli import invoke as cli  # in-process, a dead Prefect URL (NO_SERVER)
from tests.support.cli import run_subprocess as dpatlas
from tests.support.inputs import write_config
from tests.support.pg_server import pg  # noqa: F401  (fixture)
from tests.integration.test_preflight import charges, config, data, one_line_error  # noqa: F401
from tests.integration.test_synthesize import _microdata


def one_line(res) -> str:
    """The error of a refused command (exit 2, no traceback): one line starting ``error:``,
    and only indented lines (a config error's keys) after it."""
    out = res.output
    assert res.exit_code == 2, (res.exit_code, out, res.exception)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in out, out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    errors = [i for i, ln in enumerate(lines) if ln.startswith("error:")]
    assert len(errors) == 1, out
    assert all(ln.startswith(" ") for ln in lines[errors[0] + 1:]), out
    return "\n".join(lines[errors[0]:])


def nothing_written(tmp: Path) -> None:
    assert charges(tmp) == 0
    assert not (tmp / "releases").exists()
    assert not (tmp / "internal").exists()


def charge(cfg_path: Path, rid: str, eps: float, status: str = "published") -> None:
    """Put a release ``rid`` charged ``eps`` in the config's ledger, as the flow leaves it."""
    cfg = load_config(cfg_path)
    with Ledger(cfg.ledger.url) as ledger:
        ledger.begin_release(rid, cfg.ledger.dataset, [Charge("all", "primary", "pure", eps, 0.0)],
                             "cfg", "test-owner")
        if status == "published":
            ledger.complete_release(rid, "manifest-sha", "test-owner")


# --- D1: an id with a trailing newline -------------------------------------------------------

NEWLINE_IDS = ["x\n", "latest\n", "r1\n", "r1\r\n"]


@pytest.mark.parametrize("rid", NEWLINE_IDS)
def test_d1_release_id_with_trailing_newline_is_refused_before_anything(tmp_path, data, rid):
    cfg = config(tmp_path, data)
    assert "release id" in one_line(cli("release", "-c", cfg, "--release-id", rid))
    nothing_written(tmp_path)


def test_d1_release_id_with_trailing_newline_in_a_subprocess(tmp_path, data):
    # the repro as the issue states it: `dpatlas release --release-id $'x\n'`
    cfg = config(tmp_path, data)
    out = one_line_error(dpatlas("release", "-c", str(cfg), "--release-id", "x\n"))
    assert "release id" in out
    nothing_written(tmp_path)


def test_d1_newline_id_in_the_config_is_a_config_error(tmp_path, data):
    cfg = config(tmp_path, data)
    doc = yaml.safe_load(cfg.read_text())
    doc["release_id"] = "x\n"
    cfg.write_text(yaml.safe_dump(doc))
    assert "release_id" in one_line(cli("release", "-c", cfg))
    nothing_written(tmp_path)


@pytest.mark.parametrize("rid", NEWLINE_IDS)
def test_d1_withdraw_and_rerun_refuse_a_newline_id(tmp_path, data, rid):
    cfg = config(tmp_path, data)
    assert "release id" in one_line(cli("withdraw", rid, "-c", cfg, "--reason", "wrong"))
    assert "release id" in one_line(cli("rerun", rid, "-c", cfg))
    assert charges(tmp_path) == 0


def test_d1_the_ledger_refuses_a_newline_id(tmp_path):
    from dpatlas.core.ids import InvalidReleaseId, validate_release_id

    for rid in NEWLINE_IDS:
        with pytest.raises(InvalidReleaseId):
            validate_release_id(rid)
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        ledger.set_cap("ds", 5.0, 1e-5, reason="test")
        with pytest.raises(InvalidReleaseId):
            ledger.begin_release("x\n", "ds", [Charge("all", "p", "pure", 1.0, 0.0)], "c", "o")
        assert ledger.spent("ds")["epsilon"] == 0


def test_d1_the_input_contract_refuses_a_geoid_with_a_trailing_newline(tmp_path):
    from dpatlas.release.validate import ValidationFailed, apply_policy

    df = pd.DataFrame({"row": [0, 1], "geoid": ["17001000100\n", "17001000100"],
                       "x": [0.5, 0.4], "y": [0.5, 0.6], "cell": "all"})
    with pytest.raises(ValidationFailed, match="geoid"):
        apply_policy(df, "fail", "17", tmp_path / "internal")


@pytest.fixture
def source(tmp_path, request):
    """A config and a published release (id: the test's parameter, default ``r1``) as the
    release flow leaves it: staged input, validation report, published ledger entry."""
    rid = getattr(request, "param", "r1")
    (tmp_path / "data").mkdir()
    df = _microdata()
    df.drop(columns="row").to_parquet(tmp_path / "data" / "microdata.parquet")
    (tmp_path / "data" / "tracts.parquet").write_bytes(b"")  # never read here
    cfg_path = write_config(tmp_path / "config.yaml", {
        "input": {"path": str(tmp_path / "data" / "microdata.parquet")},
        "boundaries": {"path": str(tmp_path / "data" / "tracts.parquet")},
        "selection": {"rule": "dp", "threshold": 3.0},
        "publish": {"root": str(tmp_path / "releases"),
                    "internal_root": str(tmp_path / "internal"), "min_n": 10},
        "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"}})
    staged = load_config(cfg_path).publish.internal / rid / "staged"
    staged.mkdir(parents=True)
    df.to_parquet(staged / "input-17.parquet")
    (staged.parent / "validation.json").write_text("{}")
    charge(cfg_path, rid, 1.0)
    return cfg_path, rid


def test_d1_synthesize_refuses_a_newline_synthetic_id(source, tmp_path):
    cfg, rid = source
    res = cli("synthesize", "-c", cfg, "--release-id", rid, "--epsilon", "2",
              "--synthetic-id", "syn\n")
    assert "release id" in one_line(res)
    assert charges(tmp_path) == 1  # the source release's only
    assert not (tmp_path / "releases").exists()


# --- D2: user text printed as Rich markup --------------------------------------------------------

@pytest.mark.parametrize("rid", ["a[/]", "[bold]x", "a[red]b"])
def test_d2_an_id_with_brackets_is_printed_literally(tmp_path, data, rid):
    cfg = config(tmp_path, data)
    line = one_line(cli("release", "-c", cfg, "--release-id", rid))
    assert repr(rid) in line, line
    nothing_written(tmp_path)


def test_d2_an_id_with_brackets_in_a_subprocess_is_no_traceback(tmp_path, data):
    cfg = config(tmp_path, data)
    out = one_line_error(dpatlas("release", "-c", str(cfg), "--release-id", "a[/]"))
    assert "'a[/]'" in out


def test_d2_a_config_path_with_brackets_is_printed_literally(tmp_path):
    missing = tmp_path / "x[/]" / "c.yaml"
    line = one_line(cli("config", "check", missing))
    assert str(missing) in line, line


def test_d2_a_folder_named_like_a_style_does_not_vanish(tmp_path, data):
    import shutil

    folder = tmp_path / "[red]"
    shutil.copytree(data, folder)
    cfg = config(tmp_path, folder)
    res = cli("config", "check", cfg)
    assert res.exit_code == 0, res.output
    said = [ln for ln in res.output.splitlines() if ln.startswith(("ok input", "ok boundaries"))]
    assert len(said) == 2 and all(str(folder) in ln for ln in said), res.output
    # and a path with an emoji code stays text too
    odd = tmp_path / "a:red_circle:b"
    line = one_line(cli("config", "check", odd / "c.yaml"))
    assert ":red_circle:" in line, line


# --- D6: a PostgreSQL password in the URL's query ------------------------------------------------

SECRET = "s3cret-pw-q"


@pytest.mark.parametrize("url", [
    f"postgresql+psycopg://op@127.0.0.1:1/ledger?password={SECRET}",
    f"postgresql+psycopg://op@127.0.0.1:1/ledger?sslmode=disable&password={SECRET}",
    f"postgresql+psycopg://op:{SECRET}@127.0.0.1:1/ledger",
    f"postgresql+psycopg:///ledger?host=127.0.0.1&port=1&user=op&password={SECRET}",
])
def test_d6_connection_errors_and_config_check_hide_the_password(tmp_path, data, url):
    cfg = config(tmp_path, data, ledger={"url": f"sqlite:///{tmp_path / 'ledger.db'}"})
    doc = yaml.safe_load(cfg.read_text())
    doc["ledger"]["url"] = url
    cfg.write_text(yaml.safe_dump(doc))
    for args in (("config", "check", cfg), ("ledger", "show", "-c", cfg),
                 ("ledger", "set-cap", "-c", cfg, "--dataset", "il", "--epsilon", "1",
                  "--reason", "x")):
        res = cli(*args)
        assert SECRET not in res.output, (args, res.output)
        assert res.exit_code == 2, (args, res.output)


def test_d6_redact_url_hides_every_password():
    from dpatlas.ledger import redact_url

    for url in (f"postgresql+psycopg://op@h/db?password={SECRET}",
                f"postgresql+psycopg://op@h/db?PassWord={SECRET}&sslmode=require",
                f"postgresql+psycopg://op:{SECRET}@h/db",
                f"postgresql://op@h/db?sslpassword={SECRET}"):
        shown = redact_url(url)
        assert SECRET not in shown and "://op" in shown and "@h/db" in shown, shown
        assert "***" in shown, shown
    assert "sslmode=require" in redact_url(f"postgresql://op@h/db?password=x&sslmode=require")


def test_d6_ledger_show_on_postgresql_hides_a_query_password(pg, tmp_path, data):
    from sqlalchemy.engine import make_url

    db = make_url(pg.create_database("d6_show"))
    url = db.set(password=None).update_query_dict({"password": db.password})
    plain = url.render_as_string(hide_password=False)
    assert db.password in plain  # the URL really carries it in the query
    cfg = config(tmp_path, data, ledger={"url": plain})
    res = cli("ledger", "show", "-c", cfg)
    assert res.exit_code == 0, res.output
    assert "privacy-budget ledger at" in res.output and db.password not in res.output
    check = cli("config", "check", cfg)
    assert check.exit_code == 0, check.output
    assert db.password not in check.output


# --- D11: the cap --------------------------------------------------------------------------------

def _cap(cfg_path: Path):
    cfg = load_config(cfg_path)
    with Ledger(cfg.ledger.url, create=False) as ledger:
        return ledger.cap(cfg.ledger.dataset)


def set_cap(cfg, *extra, eps="1", dataset="il"):
    return cli("ledger", "set-cap", "-c", cfg, "--dataset", dataset, "--epsilon", eps,
               "--reason", "test", *extra)


def test_d11_a_cap_below_the_spend_needs_force(tmp_path, data):
    cfg = config(tmp_path, data)  # cap 10, 1e-5
    charge(cfg, "r1", 3.0)
    line = one_line(set_cap(cfg, "--delta", "1e-5", eps="2"))
    assert "spent" in line and "--force" in line, line
    assert _cap(cfg) == (10.0, 1e-5)
    forced = set_cap(cfg, "--delta", "1e-5", "--force", eps="2")
    assert forced.exit_code == 0, forced.output
    said = " ".join(forced.output.split())
    assert "below what is already spent" in said and "no release" in said, said
    assert _cap(cfg) == (2.0, 1e-5)
    show = cli("ledger", "show", "-c", cfg)
    assert "over the cap" in " ".join(show.output.split()), show.output


@pytest.mark.parametrize("delta", ["1", "1.5", "-1e-6", "nan", "inf"])
def test_d11_bad_deltas_are_refused_before_the_database_exists(tmp_path, data, delta):
    cfg = config(tmp_path, data, ledger={"url": f"sqlite:///{tmp_path / 'fresh.db'}"})
    (tmp_path / "fresh.db").unlink()  # write_config gave it a cap: start from nothing
    assert "delta" in one_line(set_cap(cfg, "--delta", delta))
    assert not (tmp_path / "fresh.db").exists()


@pytest.mark.parametrize("eps", ["-1", "nan", "inf"])
def test_d11_bad_epsilons_are_refused_before_the_database_exists(tmp_path, data, eps):
    cfg = config(tmp_path, data, ledger={"url": f"sqlite:///{tmp_path / 'fresh.db'}"})
    (tmp_path / "fresh.db").unlink()
    assert "epsilon" in one_line(set_cap(cfg, "--delta", "1e-6", eps=eps))
    assert not (tmp_path / "fresh.db").exists()


def test_d11_a_delta_of_one_is_refused_by_the_ledger(tmp_path):
    from dpatlas.ledger import LedgerError

    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        with pytest.raises(LedgerError, match="delta"):
            ledger.set_cap("ds", 1.0, 1.0, reason="x")
        assert ledger.cap("ds") is None


@pytest.mark.parametrize("name", ["il\n", "two\nlines", "tab\there", " lead", "trail "])
def test_d11_a_dataset_name_must_be_one_clean_line(tmp_path, data, name):
    from dpatlas.ledger import LedgerError

    cfg = config(tmp_path, data, ledger={"url": f"sqlite:///{tmp_path / 'fresh.db'}"})
    (tmp_path / "fresh.db").unlink()
    assert "dataset" in one_line(set_cap(cfg, "--delta", "1e-6", dataset=name))
    assert not (tmp_path / "fresh.db").exists()
    with Ledger(f"sqlite:///{tmp_path / 'l.db'}") as ledger:
        with pytest.raises(LedgerError, match="dataset"):
            ledger.set_cap(name, 1.0, 1e-6, reason="x")
    doc = yaml.safe_load(cfg.read_text())
    doc["ledger"]["dataset"] = name
    cfg.write_text(yaml.safe_dump(doc))
    assert "ledger.dataset" in one_line(cli("config", "check", cfg))


def test_d11_config_check_reports_a_stated_cap_the_ledger_does_not_have(tmp_path, data):
    cfg = config(tmp_path, data)  # the ledger's cap: 10, 1e-5
    doc = yaml.safe_load(cfg.read_text())
    doc["ledger"]["cap_epsilon"] = 4.0
    cfg.write_text(yaml.safe_dump(doc))
    line = one_line(cli("config", "check", cfg))
    assert "eps=4" in line and "eps=10" in line, line
    doc["ledger"]["cap_epsilon"] = 10.0
    cfg.write_text(yaml.safe_dump(doc))
    assert cli("config", "check", cfg).exit_code == 0


# --- D12: misleading messages --------------------------------------------------------------------

@pytest.fixture
def integer_geoids(tmp_path) -> Path:
    """A California CSV written from an integer GEOID column: 10 digits, leading zero lost."""
    from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic

    write_synthetic(tmp_path / "ca", ["06"], seed=3, params=StateParams(n_tracts=6, counties=1))
    df = pd.read_parquet(tmp_path / "ca" / "microdata")
    df["geoid"] = df["geoid"].astype("int64")
    df.drop(columns=[c for c in df.columns if c == "state"]).to_csv(tmp_path / "m.csv",
                                                                     index=False)
    return tmp_path / "m.csv"


def test_d12_ten_digit_geoids_are_not_put_under_another_state(integer_geoids):
    from dpatlas.core.config import InputConfig
    from dpatlas.release.ingest import partitions

    keys = {p.key for p in partitions(InputConfig(path=integer_geoids, format="csv"))}
    assert "60" not in keys and keys == {"other"}, keys


def test_d12_ten_digit_geoids_get_a_leading_zero_hint(integer_geoids, tmp_path):
    from dpatlas.core.config import InputConfig
    from dpatlas.release.ingest import read_partition
    from dpatlas.release.validate import ValidationFailed, apply_policy

    df = read_partition(InputConfig(path=integer_geoids, format="csv"), "other")
    with pytest.raises(ValidationFailed) as err:
        apply_policy(df, "fail", "other", tmp_path / "internal")
    said = " ".join(str(err.value).split())
    assert "10 digits" in said and "leading zero" in said and "text" in said, said


def test_d12_ten_digit_boundary_geoids_get_a_leading_zero_hint():
    from dpatlas.release.boundaries import geoid_problems

    said = " ".join(geoid_problems(pd.Series(["6001000100", "06001000200"])))
    assert "leading zero" in said, said


def test_d12_a_full_disk_names_the_stage_the_path_and_the_rerun(tmp_path, monkeypatch):
    """`[Errno 28]` alone said neither where nor what to do: the message names the stage, the
    path and how to finish the release."""
    import contextlib

    import flows.release
    import dpatlas.cli.prefect_server as ps
    from tasks import publish

    class Api:
        used = "a stand-in Prefect API"
        url = "http://127.0.0.1:9/api"  # watched (the run ends long before it counts as gone)  # the command names the API it used

        def ready(self):
            pass

    monkeypatch.setattr(ps, "prefect_api", lambda *a, **k: contextlib.nullcontext(Api()))
    monkeypatch.setattr("dpatlas.cli.release_commands._checked_release",
                        lambda c, rid, seed: (load_config(c), rid))

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    def flow(config, rid, seed):  # the publish stage runs into the full disk
        publish.publish_release.fn(load_config(config), rid, None, [], [], [], None, "", "",
                                   "", tmp_path / "out-internal" / rid, {}, {})

    monkeypatch.setattr(publish, "release_folder", full_disk)
    monkeypatch.setattr(flows.release, "release", flow)
    cfg = write_config(tmp_path / "c.yaml", {"input": {"path": "x"}, "boundaries": {"path": "y"},
                                              "selection": {"rule": "public", "threshold": 3},
                                              "publish": {"root": str(tmp_path / "out")},
                                              "ledger": {"url": f"sqlite:///{tmp_path}/l.db"}})
    line = one_line(cli("release", "-c", cfg, "--release-id", "r7"))
    assert "No space left on device" in line
    assert "the publish stage" in line
    assert str(tmp_path / "out") in line  # where it was writing
    assert "--release-id r7" in line or "dpatlas rerun r7" in line  # how to finish it


_FULL_DISK_AT_PUBLISH = """
import errno, sys
import tasks.publish

def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")

tasks.publish.stage_release = full_disk  # the publish stage's writes hit a full disk
from dpatlas.cli.commands import main
sys.argv = ["dpatlas", *sys.argv[1:]]
main()
"""


@pytest.mark.slow
def test_d12_a_full_disk_in_a_real_run_then_the_rerun_finishes_it(tmp_path, data):
    import subprocess
    import sys


    cfg = config(tmp_path, data)
    args = ["release", "-c", str(cfg), "--release-id", "r1", "--noise-seed", "3"]
    res = subprocess.run([sys.executable, "-c", _FULL_DISK_AT_PUBLISH, *args], env=ENV,
                         capture_output=True, text=True, timeout=600)
    out = one_line_error(res)
    assert "No space left on device in the publish stage" in out, out
    assert "--release-id r1" in out and str(tmp_path / "releases") in out, out
    charged = charges(tmp_path)  # one row per budget step
    assert charged > 0 and not (tmp_path / "releases" / "r1").exists()
    again = dpatlas(*args)  # as the message says: the same id finishes it, charged once
    assert again.returncode == 0, again.stdout + again.stderr
    assert (tmp_path / "releases" / "r1" / "manifest.json").is_file()
    assert charges(tmp_path) == charged


def test_d12_synthesize_with_a_zero_delta_cap_says_delta_is_the_problem(source, tmp_path):
    cfg, rid = source
    c = load_config(cfg)
    with Ledger(c.ledger.url) as ledger:
        ledger.set_cap(c.ledger.dataset, 100.0, 0.0, reason="pure DP only")
    line = one_line(cli("synthesize", "-c", cfg, "--release-id", rid, "--epsilon", "2"))
    assert "delta" in line and "smaller --epsilon" not in line, line
    assert charges(tmp_path) == 1


def test_d12_withdraw_of_an_in_progress_release_says_so(tmp_path, data):
    cfg = config(tmp_path, data)
    charge(cfg, "r1", 1.0, status="in_progress")  # its run was killed before publishing
    line = one_line(cli("withdraw", "r1", "-c", cfg, "--reason", "stop it"))
    assert "in progress" in line and "config" not in line, line


# --- D15: the default synthetic id of a long release id ------------------------------------------

LONG_ID = "r" + "0123456789" * 6 + "abc"  # 64 characters: the longest release id


@pytest.mark.parametrize("source", [LONG_ID], indirect=True)
def test_d15_a_64_character_release_id_can_be_synthesized(source, tmp_path):
    from dpatlas.core.ids import validate_release_id
    from dpatlas.release.synthetic_data import synthetic_release_id

    cfg, rid = source
    assert len(rid) == 64
    sid = synthetic_release_id(rid)
    assert validate_release_id(sid) == sid and sid.endswith("-synthetic")
    assert synthetic_release_id(rid) == sid  # deterministic
    assert synthetic_release_id(rid[:-1] + "x") != sid  # distinct sources, distinct ids
    assert synthetic_release_id("r1") == "r1-synthetic"  # short ids keep the plain default
    res = cli("synthesize", "-c", cfg, "--release-id", rid, "--epsilon", "2")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "releases" / sid / "synthetic.parquet").is_file()
    cfgd = load_config(cfg)
    with Ledger(cfgd.ledger.url, create=False) as ledger:
        assert ledger.release(sid)["status"] == "published"
