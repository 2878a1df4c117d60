"""Thread count policy: ``threads=`` argument > ``NEEDLE_CY_THREADS`` > physical cores."""
import os
from typing import Optional

_override = None


def physical_cores() -> int:
    """Physical core count (hyper-threads not counted), at least 1."""
    try:
        seen = set()
        with open("/proc/cpuinfo") as f:
            phys = core = None
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":")[1].strip()
                elif not line.strip():
                    if core is not None:
                        seen.add((phys, core))
                    phys = core = None
            if core is not None:
                seen.add((phys, core))
        if seen:
            return max(1, min(len(seen), os.cpu_count() or 1))
    except OSError:
        pass
    return max(1, os.cpu_count() or 1)


def openmp_enabled() -> bool:
    try:
        from . import _parallel
    except ImportError:
        return False
    return _parallel.openmp_enabled()


def set_num_threads(n: Optional[int]) -> None:
    """Set the process-wide default thread count (None restores the default)."""
    global _override
    if n is not None:
        n = int(n)
        if n < 1:
            raise ValueError(f"threads must be >= 1, got {n}")
    _override = n


def get_num_threads(threads: Optional[int] = None) -> int:
    """Resolve a thread count: explicit value, then set_num_threads, then
    NEEDLE_CY_THREADS, then the number of physical cores. Always 1 without OpenMP."""
    if threads is not None:
        n = int(threads)
        if n < 1:
            raise ValueError(f"threads must be >= 1, got {threads!r}")
    elif _override is not None:
        n = _override
    else:
        env = os.environ.get("NEEDLE_CY_THREADS")
        if env:
            try:
                n = int(env)
            except ValueError:
                raise ValueError(f"NEEDLE_CY_THREADS must be a positive integer, got {env!r}") from None
            if n < 1:
                raise ValueError(f"NEEDLE_CY_THREADS must be a positive integer, got {env!r}")
        else:
            n = physical_cores()
    return n
