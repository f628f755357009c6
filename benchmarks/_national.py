"""What bench_national.py and bench_floor.py both need, here so that neither benchmark script
imports the other: where the synthetic country is cached, and the floor's table."""

from __future__ import annotations

from pathlib import Path

from _measure import Span


def data_folder(work: Path, scale: float, cells: int | None = None) -> Path:
    """Where the synthetic country of ``scale`` (and ``cells``) is cached under ``work``."""
    return work / (("data" if scale == 1.0 else f"data-scale-{scale:g}")
                   + ("" if cells is None else f"-cells-{cells}"))


def floor_report_lines(res: dict) -> list[str]:
    """The floor's table: CPU seconds per component, then the two floors and the process."""
    lines = ["| floor component | CPU s | wall s |", "| --- | ---: | ---: |"]
    for name, fig in res["components"].items():
        lines.append(f"| {name} | {fig['cpu']:.2f} | {fig['wall']:.2f} |")
    lines += [
        f"| **estimator floor** (read + batch + select + estimate) | "
        f"**{res['estimator_floor_cpu']:.2f}** | |",
        f"| **full floor** (+ levels + model fit) | **{res['floor_cpu']:.2f}** | "
        f"{res['floor_wall']:.2f} |",
        "",
        f"{res['records']:,} records, {res['chunks']} chunks, {res['tract_cells']:,} "
        f"tract-cells estimated, {res['model_fits']} model fits; peak RSS "
        f"{res['peak_rss_mib']:,.0f} MiB",
    ]
    p = res["process"]
    lines.append(Span(p["label"], p["wall"], p["cpu_process"], p["cpu_children"],
                      tuple(p["load_start"]), tuple(p["load_end"])).line())
    return lines
