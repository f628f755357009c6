"""The release's process keeps two malloc arenas however many threads allocate
(dpatlas/core/memory.py): counted by glibc's own ``malloc_info``, in fresh processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

GLIBC = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None
pytestmark = pytest.mark.skipif(not GLIBC or not GLIBC.startswith("glibc"),
                                reason="malloc arenas are glibc's")

# Eight threads that each allocate (blocks above pymalloc's 512 bytes go to malloc), held
# alive together so that each needs an arena; then glibc's count of the process's arenas.
COUNT_ARENAS = textwrap.dedent("""
    import ctypes, os, tempfile, threading
    {setup}
    barrier = threading.Barrier(8)
    def allocate():
        kept = [bytearray(4096) for _ in range(200)]
        barrier.wait()
    threads = [threading.Thread(target=allocate) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    path = os.path.join(tempfile.mkdtemp(), "info.xml")
    stream = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    print(open(path).read().count("<heap nr="))
""")


def arenas(setup: str, **env: str) -> int:
    environ = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    done = subprocess.run([sys.executable, "-c", COUNT_ARENAS.format(setup=setup)],
                          capture_output=True, text=True, env={**environ, **env}, timeout=120,
                          check=True)
    return int(done.stdout.strip())


def test_eight_allocating_threads_take_more_arenas_without_the_limit():
    assert arenas("") > 2  # what the limit is for: glibc gives the threads arenas of their own


def test_the_limit_keeps_two_arenas():
    setup = "from dpatlas.core.memory import limit_malloc_arenas; assert limit_malloc_arenas()"
    assert arenas(setup) <= 2


def test_the_command_line_sets_the_limit_when_it_is_imported():
    assert arenas("import dpatlas.cli.commands") <= 2


def test_an_operators_own_setting_is_left_as_it_is():
    setup = "from dpatlas.core.memory import limit_malloc_arenas; assert not limit_malloc_arenas()"
    assert arenas(setup, MALLOC_ARENA_MAX="4") > 2


FREEZE_AT_EXIT = """
import atexit, gc, sys
{setup}
kept = [{{"k": [i]}} for i in range(50_000)]  # containers the collector would scan
log = open(sys.argv[1], "w")  # left open, as a careless caller might
log.write("x" * 100_000)
atexit.register(lambda: print("handler ran", flush=True))  # runs before the freeze
atexit._run_exitfuncs()  # what the interpreter runs as it exits, run here to look after
print(gc.get_freeze_count() >= 50_000)
"""


def _exits(setup: str, tmp_path) -> list[str]:
    out = tmp_path / "written.txt"
    done = subprocess.run([sys.executable, "-c", FREEZE_AT_EXIT.format(setup=setup), str(out)],
                          capture_output=True, text=True, timeout=120, check=True)
    assert out.read_text() == "x" * 100_000  # an unclosed file is still written whole
    return done.stdout.split("\n")[:2]


def test_the_command_line_leaves_the_heap_to_the_system_at_exit(tmp_path):
    """dpatlas.core.memory.freeze_heap_at_exit, registered as the command line is imported:
    at exit the objects alive are frozen (the shutdown does not collect them again), after
    the handlers registered later have run."""
    assert _exits("import dpatlas.cli.commands", tmp_path) == ["handler ran", "True"]
    assert _exits("", tmp_path) == ["handler ran", "False"]  # without it: not frozen
