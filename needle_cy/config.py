"""Every environment variable needle_cy reads, in one list.

Each entry says its default, when it is read (so whether setting it after import has any
effect) and whom it is for: *user* settings are part of the interface; *benchmark*
settings exist to compare kernels and schedules and may change between releases; *test*
and *training* settings are read only by those tools.  ``needle-cy inspect --config``
prints the list with the values this process sees.  ``tests/test_config.py`` keeps the
list complete: a ``NEEDLE_CY_*`` name read anywhere in the package, ``setup.py`` or the
tests and missing here fails it.  The benchmarks' own ``NEEDLE_CY_BENCH_*`` variables and
the scripts under ``tools/`` are documented where they are read.
"""
from __future__ import annotations

import os
from typing import NamedTuple, Optional


class Setting(NamedTuple):
    name: str
    default: str
    read: str
    audience: str
    meaning: str


SETTINGS = (
    Setting("NEEDLE_CY_THREADS", "auto", "when an engine is created", "user",
            "engine threads: an integer, or auto (a per-call choice by the thread tuner)"),
    Setting("NEEDLE_CY_CQ_KERNEL", "auto", "when needle_cy._cq is imported", "benchmark",
            "the CQ matvec kernel: auto (the best this CPU runs), avx512lut, avx512vnni, avxvnni, "
            "avx512bw, avx2lut, avx2int, neon_dotprod, neon, avx2, scalar (one the CPU lacks: a warning, auto)"),
    Setting("NEEDLE_CY_CQ_AMX", "1", "when needle_cy._cq is imported", "benchmark",
            "0 or off: never use the AMX tile kernel for prefill, even where the CPU has it"),
    Setting("NEEDLE_CY_LUT_MIN_ROWS", "64", "when needle_cy._cq is imported", "benchmark",
            "the fewest output rows for which the lookup-table kernel is used"),
    Setting("NEEDLE_CY_PF_AHEAD", "half of L2", "when an engine is created", "benchmark",
            "bytes a waiting decode thread prefetches ahead (0: no prefetch streams)"),
    Setting("NEEDLE_CY_MLP_TEAM", "3", "when an engine is created", "benchmark",
            "threads of the decode step's MLP team"),
    Setting("NEEDLE_CY_SITES_LATE", "auto", "when an engine is created", "benchmark",
            "auto, 0 or 1: compute the engram sites after block 0 where the archive allows"),
    Setting("NEEDLE_CY_API_KEY", "none", "when needle-cy serve starts", "user",
            "the bearer key the local HTTP endpoint requires (--api-key)"),
    Setting("NEEDLE_CY_DEBUG", "unset", "when the CLI fails", "user",
            "any value: the CLI prints the traceback instead of a one-line error"),
    Setting("NEEDLE_CY_TOOL_CORPUS", "../shared/data/tool_corpus", "when training data is made", "training",
            "the folder of tool definitions the training mix draws from"),
    Setting("NEEDLE_CY_FIXTURES", "../shared/fixtures", "when the tests start", "test",
            "the folder of the official exporter's archives and logits the tests compare with"),
    Setting("NEEDLE_CY_PROPERTY_CASES", "60", "when the tests start", "test",
            "random turns the agent's property test decodes (raise it for a soak run)"),
    Setting("NEEDLE_CY_PORTABLE", "unset", "when setup.py builds", "build",
            "1: build for a generic CPU of the architecture instead of -march/-mcpu=native"),
    Setting("NEEDLE_CY_ARCH_FLAGS", "unset", "when setup.py builds", "build",
            "the target flags outright (e.g. -march=x86-64-v3), instead of native"),
    Setting("NEEDLE_CY_BUILD_ONLY", "unset", "when setup.py builds", "build",
            "a comma list of extensions to build (e.g. _cq,grammar._runtime)"),
    Setting("NEEDLE_CY_SANITIZE", "unset", "when setup.py builds", "build",
            "1: build with AddressSanitizer and UBSan at -O1 (tests/sanitize.sh)"),
    Setting("NEEDLE_CY_NO_OPENMP", "unset", "when setup.py builds", "build",
            "1: build without OpenMP (one thread)"),
)

# Variables of the OpenMP runtime that needle_cy/__init__.py sets, when the user has not,
# before the first OpenMP extension loads (the reason is given there).
OPENMP_DEFAULTS = (("GOMP_SPINCOUNT", "20000"), ("KMP_BLOCKTIME", "1"))


def current(name: str) -> Optional[str]:
    """The value this process sees (None when unset)."""
    return os.environ.get(name)


def format_settings() -> str:
    """The list as text: name, value seen (or the default), when read, audience, meaning."""
    lines = ["environment variables (value seen here, else the default in brackets):"]
    width = max(len(s.name) for s in SETTINGS)
    for s in SETTINGS:
        value = current(s.name)
        shown = value if value is not None else f"[{s.default}]"
        lines.append(f"  {s.name:<{width}}  {shown:<12}  {s.audience:<9}  read {s.read}")
        lines.append(f"  {'':<{width}}  {s.meaning}")
    lines.append("OpenMP defaults set at import when OMP_WAIT_POLICY is unset:")
    for name, default in OPENMP_DEFAULTS:
        value = current(name)
        lines.append(f"  {name}={value if value is not None else default}")
    return "\n".join(lines)
