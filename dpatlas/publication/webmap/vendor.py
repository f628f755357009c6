"""Vendor the web map's JavaScript from npm, pinned and checked by sha256.

The web map must work offline from any static host, so MapLibre GL JS and the PMTiles
decoder are copied into the package (``dpatlas/publication/webmap/vendor/``) rather than loaded from a CDN.

    python -m dpatlas.publication.webmap.vendor           # fetch with `npm pack`, check, copy
    python -m dpatlas.publication.webmap.vendor --check   # only check the committed files (no network)

Both the npm tarball and every file taken from it are checked against the sha256 pinned
below; a mismatch stops with a one-line error and copies nothing. maplibre-gl stays on 5.x:
6.x ships only ES modules with a separate worker module, which a static host must serve with
a JavaScript MIME type for ``.mjs``; the 5.x UMD bundle needs nothing of the host.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VENDOR_DIR = Path(__file__).resolve().parent / "vendor"

# package -> (version, sha256 of the npm tarball, {path in tarball: (vendored name, sha256)})
PINS: dict[str, tuple[str, str, dict[str, tuple[str, str]]]] = {
    "maplibre-gl": (
        "5.24.1",
        "b84d7fdf7fba5922fd3fff9a92733936c7a03b99165afc6c84f41c311bdbfa9d",
        {
            "package/dist/maplibre-gl.js": (
                "maplibre-gl.js",
                "a9c9e2aa36d4d5b63b131f27c1272f1a28883eeecc0eddd1e0dbfae4033bc7c9"),
            "package/dist/maplibre-gl.css": (
                "maplibre-gl.css",
                "ab1e70d59ec40465bae7e7030da2f3ccf28133fd502e62bd598eefbadfd7a732"),
            "package/LICENSE.txt": (
                "LICENSE-maplibre-gl.txt",
                "ee5fc05a0677eaf69601d2c7db0d9ecd6cc27c3abc1d0733bc9ed34707cf8ef2"),
        },
    ),
    "pmtiles": (
        "4.5.0",
        "23ae7c575578ad24cd579377d69c46550631da219e6f179997ec2cf3b8c937e5",
        {
            "package/dist/pmtiles.js": (
                "pmtiles.js",
                "caf981bc46f6327ee7e65d5dc964d89d38a69f60edca2bd4c5c890c21b554c6c"),
        },
    ),
}
# Kept in the repository, not taken from npm: the pmtiles package ships no license file, so
# this is its declared BSD-3-Clause licence with the upstream copyright notice.
STATIC_FILES = {
    "LICENSE-pmtiles.txt": "65777134ab0aac7bdcbcbff98ea8de3c3074da125d9d4da2af5dc08c767bcc9c",
}


class VendorError(RuntimeError):
    """A vendored file is missing or does not match its pin."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_files() -> dict[str, str]:
    """Every vendored file name and its pinned sha256."""
    files = dict(STATIC_FILES)
    for _version, _tar_sha, members in PINS.values():
        files.update({name: digest for name, digest in members.values()})
    return files


def check(folder: Path = VENDOR_DIR) -> dict[str, str]:
    """Check the vendored files against their pins; returns them. Raises VendorError."""
    problems = []
    for name, digest in sorted(expected_files().items()):
        path = Path(folder) / name
        if not path.is_file():
            problems.append(f"{name} missing")
        elif _sha256(path.read_bytes()) != digest:
            problems.append(f"{name} sha256 differs from its pin")
    if problems:
        raise VendorError(f"vendored web map files in {folder} do not match the pins ("
                          + "; ".join(problems) + "): run `python -m dpatlas.publication.webmap.vendor`")
    return expected_files()


def _npm_pack(package: str, version: str, workdir: Path) -> Path:
    done = subprocess.run(["npm", "pack", f"{package}@{version}", "--silent"], cwd=workdir,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise VendorError(f"npm pack {package}@{version} failed: "
                          f"{(done.stderr.strip().splitlines() or ['no message'])[-1]}")
    return workdir / done.stdout.strip().splitlines()[-1]


def fetch(folder: Path = VENDOR_DIR) -> None:
    """`npm pack` each pinned package, check tarball and members, then write the files."""
    staged: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for package, (version, tar_sha, members) in PINS.items():
            tarball = _npm_pack(package, version, Path(tmp))
            if _sha256(tarball.read_bytes()) != tar_sha:
                raise VendorError(f"{tarball.name}: sha256 differs from the pin; the registry "
                                  f"served another {package}@{version}")
            with tarfile.open(tarball) as tar:
                for member, (name, digest) in members.items():
                    data = tar.extractfile(member).read()
                    if _sha256(data) != digest:
                        raise VendorError(f"{package}@{version} {member}: sha256 differs")
                    staged[name] = data
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in staged.items():           # all checked before anything is written
        (folder / name).write_bytes(data)
    check(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the vendored files")
    args = parser.parse_args(argv)
    try:
        if not args.check:
            fetch()
        files = check()
    except VendorError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{len(files)} vendored files match their pins in {VENDOR_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
