"""How the drawing tasks (selection, estimates, levels) make a draw."""

from __future__ import annotations

from pathlib import Path

from dpatlas.release.compute_pool import compute
from dpatlas.release.draws import DrawLog, draw_once, draw_path, noise_source


def draw_computed(draws: DrawLog, stage: str, name: str, internal: Path, seed, log, fn, *args):
    """The draw of (``stage``, ``name``), made once at its place in the internal folder
    (:func:`~dpatlas.release.draws.draw_once`: reused when recorded), the frame computed by
    ``fn(*args)`` in a worker of the compute pool when there is one
    (:mod:`dpatlas.release.compute_pool`). Its path, and the frame when drawn now."""
    return draw_once(draws, stage, name, draw_path(internal, stage, name),
                     lambda: compute(fn, *args), noise_source(seed), log.info)
