"""Memory a pass freed goes back to the operating system when the run asks for it.

Each case runs in a fresh interpreter (this process's heap holds whatever other tests left):
it allocates 300 MiB in 64 KiB blocks and one more block after them (still in use, as some
of a pass's results are), frees the 300 MiB, and reports its resident memory before and
after :func:`~pipelines.memory.release_unused_memory`. The blocks are Arrow buffers from
Arrow's pool (chosen by ``ARROW_DEFAULT_MEMORY_POOL``) or Python objects on the C heap; every
one of these allocators but Arrow's jemalloc keeps such memory for reuse until asked. sfcdc has
Arrow use jemalloc unless the operator names a pool.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run_fresh(script: str, env: dict[str, str], *args: str) -> dict:
    """Run ``script`` in a fresh interpreter with ``env``; the JSON its last line prints."""
    out = subprocess.run(
        [sys.executable, "-c", script, *args],
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    from pipelines.memory import release_unused_memory

    def rss_mib():
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024

    if sys.argv[1] == "arrow":
        base = pa.array(np.arange(8192, dtype=np.int64))  # 64 KiB
        held = [pc.multiply(base, i) for i in range(4800)]
        kept = pc.multiply(base, -1)
    else:
        held = [bytes([i % 256]) * 65536 for i in range(4800)]
        kept = b"k" * 65536
    peak = rss_mib()
    del held
    freed = rss_mib()
    release_unused_memory()
    print(json.dumps({
        "pool": pa.default_memory_pool().backend_name,
        "peak": peak,
        "freed": freed,
        "released": rss_mib(),
    }))
    """
)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
@pytest.mark.parametrize(
    ("blocks", "pool"),
    [("arrow", "jemalloc"), ("arrow", "mimalloc"), ("arrow", "system"), ("python", "jemalloc")],
)
def test_freed_memory_is_returned_on_request(blocks: str, pool: str) -> None:
    figures = _run_fresh(SCRIPT, {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": pool}, blocks)
    assert figures["pool"] == pool
    if (blocks, pool) != ("arrow", "jemalloc"):
        # Freed, the 300 MiB stay resident for reuse ...
        assert figures["freed"] - figures["peak"] > -50, figures
    # ... and once released, at least 200 MiB of them are gone (Arrow's jemalloc hands blocks
    # this large back as soon as they are freed).
    assert figures["peak"] - figures["released"] >= 200, figures


# Records the jemalloc options in force when delta-rs is first imported, through the
# import system itself: the options only count if they are set by then.
LOADING = textwrap.dedent(
    """
    import importlib.abc, json, os, sys

    seen = {}

    class Watch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "deltalake" and name not in seen:
                seen[name] = os.environ.get("_RJEM_MALLOC_CONF")
            return None

    sys.meta_path.insert(0, Watch())
    import pipelines.engines.local  # the local engine loads delta-rs

    print(json.dumps(seen))
    """
)


@pytest.mark.parametrize("preset", [None, "narenas:2"])
def test_delta_rs_allocator_is_configured_before_it_loads(preset: str | None) -> None:
    from pipelines.memory import JEMALLOC_CONF

    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    if preset is not None:
        env["_RJEM_MALLOC_CONF"] = preset
    seen = _run_fresh(LOADING, env)
    # An operator's own setting wins; without one, freed pages are purged in the background.
    assert seen == {"deltalake": preset or JEMALLOC_CONF}


POOL = textwrap.dedent(
    """
    import json, os, subprocess, sys
    import pyarrow as pa
    import pipelines.engines  # sets the allocators up
    ask = "import pyarrow as pa; print(pa.default_memory_pool().backend_name)"
    child = subprocess.run(
        [sys.executable, "-c", ask], capture_output=True, text=True, check=True
    ).stdout.strip()
    print(json.dumps({"pool": pa.default_memory_pool().backend_name, "child": child}))
    """
)


@pytest.mark.parametrize("preset", [None, "system"])
def test_arrow_allocates_from_jemalloc_unless_the_operator_chose(preset: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if preset is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = preset
    figures = _run_fresh(POOL, env)
    # This process and the ones it starts (the landing child) use the same pool.
    assert figures == {"pool": preset or "jemalloc", "child": preset or "jemalloc"}
