"""The package as a user installs it: a wheel built from the checkout ships every data file the
code reads at run time, and installed into a fresh virtualenv outside the checkout it runs
`dpatlas demo` and `dpatlas audit` (issue 19: the wheel lacked the selection thresholds and the
expectation suites; the demo worked only from an editable install)."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml
from tests.support.paths import REPO

ROOT = REPO  # the checkout
NOT_SHIPPED = ("tests", "benchmarks")  # top-level folders that are not part of the package


def package_roots() -> list[Path]:
    """The checkout's top-level Python packages (whatever the layout inside them)."""
    return sorted(d for d in ROOT.iterdir()
                  if (d / "__init__.py").is_file() and d.name not in NOT_SHIPPED)


def data_files() -> list[str]:
    """Every file under a package that is not Python source: what the wheel must carry besides
    the modules (thresholds, expectation suites, the web map and its vendored scripts, ...)."""
    found = []
    for top in package_roots():
        for path in top.rglob("*"):
            parts = path.relative_to(ROOT).parts
            if (path.is_file() and path.suffix not in (".py", ".pyc")
                    and "__pycache__" not in parts and not any(p.startswith(".") for p in parts)):
                found.append("/".join(parts))
    return sorted(found)


def build_wheel(tmp: Path) -> Path:
    """The wheel of a copy of the checkout's project files (building in place would write
    build/ and *.egg-info into the checkout, racing a parallel test). Built with the venv's
    pinned setuptools, without fetching a build environment."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for top in package_roots():
        shutil.copytree(top, src / top.name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp / "dist"
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                          "--no-build-isolation", "-q", "-w", str(out), str(src)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, (res.stdout + res.stderr + "\n(built with the venv's setuptools, "
                                 "pinned in requirements.lock: `make` installs it)")
    (wheel,) = out.glob("dpatlas-*.whl")
    return wheel


def test_the_wheel_holds_every_data_file(tmp_path):
    expected = data_files()
    assert any(f.endswith("/thresholds.yaml") for f in expected)  # the listing itself works
    # every GX suite the builder makes (input, tracts, counties, states) is a listed data file
    from data_contracts.build_suites import SUITE_BUILDERS

    suites = {f.rsplit("/", 1)[1] for f in expected if "/expectation_suites/" in f}
    assert suites == {f"{name}.json" for name in SUITE_BUILDERS}
    names = set(zipfile.ZipFile(build_wheel(tmp_path)).namelist())
    missing = [f for f in expected if f not in names]
    assert not missing, f"not in the wheel: {missing}"
    assert not [n for n in names if n.split("/")[0] in NOT_SHIPPED]


def _fresh_venv(tmp: Path, wheel: Path) -> Path:
    """A new virtualenv with the wheel installed, its dependencies taken from this venv's
    site-packages by a .pth line (a directory added that way is not processed as a site dir,
    so the editable install of the checkout there stays inactive)."""
    venv = tmp / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    res = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], capture_output=True, text=True, check=True)
    site_packages = Path(site.stdout.strip())
    (site_packages / "project_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


def _env(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PREFECT_HOME=str(tmp / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180", COLUMNS="200")
    return env


@pytest.mark.slow
def test_the_wheel_installed_outside_the_checkout_runs_the_demo_and_the_audit(tmp_path):
    venv = _fresh_venv(tmp_path, build_wheel(tmp_path))
    bin_dir = venv / "bin"
    work = tmp_path / "work"  # cwd outside the checkout: nothing is found relative to it
    work.mkdir()
    env = _env(tmp_path)

    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import dpatlas, data_contracts, sysconfig; "
         "print(dpatlas.__file__); print(data_contracts.__file__); "
         "print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, cwd=work, env=env, timeout=300)
    assert where.returncode == 0, where.stderr
    dpatlas_file, contracts_file, site_packages = map(Path, where.stdout.split())
    print("dpatlas imported from", dpatlas_file)
    for module in (dpatlas_file, contracts_file):
        assert module.is_relative_to(site_packages) and not module.is_relative_to(ROOT), module

    demo = subprocess.run([str(bin_dir / "dpatlas"), "demo", "--out", "demo"],
                          capture_output=True, text=True, cwd=work, env=env, timeout=900)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    # The selection thresholds came from the installed package, not the checkout (the demo
    # config names none: the loaded config names the shipped one).
    config = yaml.safe_load((work / "demo" / "config.yaml").read_text())
    assert "threshold_file" not in config["selection"], config
    loaded = subprocess.run(
        [str(bin_dir / "python"), "-c", "from dpatlas.core.config import load_config; "
         "print(load_config('demo/config.yaml').selection.threshold_file)"],
        capture_output=True, text=True, cwd=work, env=env, timeout=300)
    assert loaded.returncode == 0, loaded.stderr
    thresholds = Path(loaded.stdout.strip())
    assert thresholds.is_relative_to(site_packages) and thresholds.is_file(), thresholds

    (release,) = [d for d in (work / "demo" / "releases").iterdir()
                  if (d / "manifest.json").is_file() and not d.is_symlink()]
    internal = work / "demo" / "releases-internal" / release.name
    # Great Expectations ran the installed suites: a passing result of each, with expectations.
    results = {}
    for path in (internal / "gx").rglob("*.json"):
        if "validations" in path.parts:
            result = json.loads(path.read_text())
            results[result["suite_name"]] = result
    # (the demo publishes counties and states too: each level table has its own contract;
    # its input has no cell column, so the input suite runs without the cell's expectations;
    # every table's boundary coverage is checked by a suite of its own)
    assert set(results) == {"input_microdata-without-cell", "published_tracts",
                            "published_counties", "published_states",
                            "published_coverage"}, sorted(results)
    for result in results.values():
        assert result["success"] and result["statistics"]["evaluated_expectations"] > 0
    assert (internal / "data_docs" / "index.html").is_file()

    audit = subprocess.run(
        [str(bin_dir / "dpatlas"), "audit", str(release),
         "--ledger", f"sqlite:///{work / 'demo' / 'ledger.db'}",
         "--boundaries", str(work / "demo" / "data" / "tracts.parquet")],
        capture_output=True, text=True, cwd=work, env=env, timeout=600)
    assert audit.returncode == 0 and "PASSED" in audit.stdout, audit.stdout + audit.stderr
    print(audit.stdout[-600:])
