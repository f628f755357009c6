"""The command line as an operator uses it: exit codes and messages."""

import pandas as pd
import yaml

from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic
from tests.support.cli import OWN_SERVER
from tests.support.cli import run_in_process as dpatlas  # exit codes and messages only
from tests.support.inputs import set_test_cap


def test_config_example_is_valid(tmp_path):
    import shutil

    from dpatlas.release.thresholds import DEFAULT_THRESHOLDS

    res = dpatlas("config", "example")
    assert res.returncode == 0
    (tmp_path / "c.yaml").write_text(res.stdout)
    # config check opens every file the release would read: none exist yet
    missing = dpatlas("config", "check", str(tmp_path / "c.yaml"))
    assert missing.returncode == 2 and "input not found" in missing.stdout, missing.stdout
    write_synthetic(tmp_path / "data", ["17"], seed=3, params=StateParams(n_tracts=20,
                                                                          counties=2))
    shutil.copy(DEFAULT_THRESHOLDS, tmp_path / "thresholds.yaml")
    # without a lifetime cap a release would be refused, so config check says so (exit 2)
    uncapped = dpatlas("config", "check", str(tmp_path / "c.yaml"))
    assert uncapped.returncode == 2 and "no lifetime budget cap" in uncapped.stdout
    set_test_cap(tmp_path / "c.yaml")
    check = dpatlas("config", "check", str(tmp_path / "c.yaml"))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "one record per person and cell: not read here; each release checks it" in check.stdout


def test_demo_into_an_unwritable_folder_is_one_line_and_exit_2(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    res = dpatlas("demo", "--out", str(blocker / "demo"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stdout.startswith("error:") and "Traceback" not in res.stdout + res.stderr
    assert blocker.read_text() == "not a folder"  # nothing lost


def test_bad_config_exits_nonzero_with_the_key(tmp_path):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(
        {"input": {"path": "x"}, "boundaries": {"path": "y"},
         "selection": {"rule": "dp", "threshold": 2.0}, "publish": {"root": "out"},
         "validation": {"policy": "ignore"}}))
    res = dpatlas("release", "--config", str(tmp_path / "c.yaml"))
    assert res.returncode == 2
    assert "validation.policy" in res.stdout and "'fail', 'clip' or 'drop'" in res.stdout
    assert not (tmp_path / "out").exists()


def test_release_with_bad_input_exits_nonzero_and_publishes_nothing(tmp_path):
    data = tmp_path / "data"
    write_synthetic(data, ["17"], seed=3, params=StateParams(n_tracts=40, counties=3))
    part = data / "microdata" / "state=17" / "part-0.parquet"
    df = pd.read_parquet(part)
    df.loc[0, "child_rank"] = None
    df.to_parquet(part, index=False)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(
        {"input": {"path": str(data / "microdata"), "columns": {"person_id": "person_id"}},
         "boundaries": {"path": str(data / "tracts.parquet")},
         "selection": {"rule": "public", "threshold": 100}, "publish": {"root": "out"}}))
    set_test_cap(tmp_path / "c.yaml")  # else refused for the missing cap, before validation
    res = dpatlas("release", "--config", str(tmp_path / "c.yaml"), cwd=tmp_path,
                  env=OWN_SERVER)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "expect_column_values_to_not_be_null" in res.stdout
    assert "no noise was drawn" in res.stdout
    assert not (tmp_path / "out").exists()
    assert (tmp_path / "out-internal").exists()  # the quarantine and report, kept internal
