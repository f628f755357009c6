"""Arrow's memory pool keeps what a thread frees until it is asked to return it
(dpatlas/core/memory.py, :func:`return_arrow_memory`): measured in fresh processes, the work
done on a thread of its own as a release task's is."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# 600 buffers of 512 KiB (300 MiB) made and freed on one thread, as a partition's batches
# are; the process's RSS before, after the frees, and after the return (on that thread).
FREED_ON_A_THREAD = textwrap.dedent("""
    import threading
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    from dpatlas.core.memory import return_arrow_memory

    def rss():
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * 4096 / 2**20
    figures = []
    def task():
        base = pa.array(np.arange(65536, dtype="float64"))
        figures.append(rss())
        kept = [pc.multiply(base, i) for i in range(600)]
        del kept
        figures.append(rss())
        if {return_it}:
            return_arrow_memory()
        figures.append(rss())
    thread = threading.Thread(target=task)
    thread.start()
    thread.join()
    print(pa.default_memory_pool().backend_name, *figures)
""")


def _figures(return_it: bool) -> tuple[str, float, float, float]:
    done = subprocess.run([sys.executable, "-c", FREED_ON_A_THREAD.format(return_it=return_it)],
                          capture_output=True, text=True, timeout=120, check=True)
    backend, *figures = done.stdout.split()
    return backend, *map(float, figures)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_the_pool_keeps_freed_memory_until_it_is_returned():
    backend, before, freed, _ = _figures(return_it=False)
    if backend != "mimalloc":
        pytest.skip(f"Arrow's pool is {backend} here, not the wheels' mimalloc")
    assert freed - before > 150  # what the return is for: the frees alone give little back
    _, before, freed, returned = _figures(return_it=True)
    assert freed - before > 150 and returned - before < 50
