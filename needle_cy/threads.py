"""Thread count policy: ``threads=`` argument > ``set_num_threads`` > ``NEEDLE_CY_THREADS``
> automatic.

An explicit count is used as given for every call.  Without one the engine is built
for all physical cores and a ``ThreadTuner`` picks, per kind of call (``step``,
``prefill``, ``forward``), the count that has measured fastest lately: on a small
idle machine decode of a full-size model gains from a second core, a tiny model's
decode or any call on a machine whose other core is busy loses (each parallel
region waits for a descheduled sibling), and which case holds changes while a
program runs.  The tuner times every call it is given, tries each candidate a
few times first, then keeps the fastest and re-tries another candidate every
``explore_every`` calls, so it follows the load at a cost of a few per cent.

Timing alone reacts late, and a single call on more threads than there are free cores
costs tens of ordinary ones (a 2-thread decode step beside two CPU hogs on 2 cores;
benchmarks/history/model.md).  So
before each call the tuner also asks ``MachineLoad`` how many tasks other than this
process's own threads are runnable right now (Linux ``/proc/loadavg`` and
``/proc/self/task``, a few microseconds), and never runs a call on more threads than
the CPUs left free; where that cannot be read it relies on timing alone.
"""
import os
import threading
import time
from collections import deque
from typing import Callable, Dict, List, Optional, Tuple

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


def _env_threads() -> Optional[str]:
    env = os.environ.get("NEEDLE_CY_THREADS")
    return env.strip() if env and env.strip() else None


def threads_automatic(threads: Optional[int] = None) -> bool:
    """True when no count was chosen (no ``threads=``, ``set_num_threads`` or
    ``NEEDLE_CY_THREADS`` other than ``auto``): the thread tuner decides per call."""
    if threads is not None:
        return isinstance(threads, str) and threads.strip().lower() == "auto"
    if _override is not None:
        return False
    env = _env_threads()
    return env is None or env.lower() == "auto"


def get_num_threads(threads: Optional[int] = None) -> int:
    """Resolve a thread count: explicit value, then set_num_threads, then
    NEEDLE_CY_THREADS, then the number of physical cores. Always 1 without OpenMP."""
    if isinstance(threads, str) and threads.strip().lower() == "auto":
        threads = None
    if threads is not None:
        n = int(threads)
        if n < 1:
            raise ValueError(f"threads must be >= 1, got {threads!r}")
    elif _override is not None:
        n = _override
    else:
        env = _env_threads()
        if env and env.lower() != "auto":
            try:
                n = int(env)
            except ValueError:
                raise ValueError(f"NEEDLE_CY_THREADS must be a positive integer, got {env!r}") from None
            if n < 1:
                raise ValueError(f"NEEDLE_CY_THREADS must be a positive integer, got {env!r}")
        else:
            n = physical_cores()
    return n


class MachineLoad:
    """Runnable tasks on this machine other than this process's own threads, now.

    ``/proc/loadavg``'s fourth field counts the tasks in the run state across the
    machine (this thread included); this process's threads in the run state (an OpenMP
    worker still spinning after a parallel region is one) are subtracted, read through
    descriptors kept open (the thread list is re-read every ``refresh_s`` seconds) from
    ``/proc/self/task/*/syscall``, which reads ``running`` for exactly those threads
    (the kernel's test is the task state being TASK_RUNNING, the R of ``stat``), or
    from ``/proc/self/task/*/stat`` where that file is missing.  ``syscall`` is the
    cheap one: ``stat`` of a running thread gathers its CPU times, several times the
    cost of ``syscall`` for an OpenMP worker spinning.  ``others_running()`` is None where that
    cannot be read or means nothing for this process: not Linux, or an affinity mask
    narrower than the machine (the machine-wide count is then not about our CPUs).
    """

    def __init__(self, refresh_s: float = 0.5, max_age_s: float = 0.01,
                 recheck_s: float = 0.00015, busy_age_s: float = 0.002) -> None:
        self.cpus = os.cpu_count() or 1
        self.busy_age_s = float(busy_age_s)
        self.recheck_s = float(recheck_s)
        self.refresh_s = float(refresh_s)
        self.max_age_s = float(max_age_s)
        self._read_at = -1e9
        self._others = 0
        self._fds: Tuple[Tuple[int, int], ...] = ()   # (thread id, its stat descriptor)
        self._fd: Optional[int] = None
        self._tasks: Dict[str, int] = {}
        self._listed = -1e9
        self.task_file = "stat"        # the per-thread file read: "syscall" where it can be
        try:
            if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) != self.cpus:
                return
            self._fd = os.open("/proc/loadavg", os.O_RDONLY)
            os.pread(self._fd, 128, 0)
        except (OSError, AttributeError):
            self.close()
            return
        try:   # readable where the kernel has it and ptrace checks let a process read its own
            fd = os.open(f"/proc/self/task/{threading.get_native_id()}/syscall", os.O_RDONLY)
            try:
                if os.pread(fd, 256, 0):
                    self.task_file = "syscall"
            finally:
                os.close(fd)
        except OSError:
            pass

    @property
    def available(self) -> bool:
        return self._fd is not None

    def close(self) -> None:
        for fd in ([self._fd] if self._fd is not None else []) + list(self._tasks.values()):
            try:
                os.close(fd)
            except OSError:
                pass
        self._fd, self._tasks, self._fds = None, {}, ()

    def __del__(self):
        self.close()

    def _task_fds(self) -> Tuple[Tuple[int, int], ...]:
        now = time.monotonic()
        try:   # /proc/self/task's link count is 2 + the thread count: a new thread shows at once
            threads = os.stat("/proc/self/task").st_nlink - 2
        except OSError:
            threads = len(self._tasks)
        if now - self._listed >= self.refresh_s or threads != len(self._tasks):
            self._listed = now
            try:
                tids = set(os.listdir("/proc/self/task"))
            except OSError:
                tids = set()
            for tid in list(self._tasks):
                if tid not in tids:
                    os.close(self._tasks.pop(tid))
            for tid in tids - set(self._tasks):
                try:
                    self._tasks[tid] = os.open(f"/proc/self/task/{tid}/{self.task_file}", os.O_RDONLY)
                except OSError:
                    pass
            self._fds = tuple((int(tid), fd) for tid, fd in self._tasks.items())
        return self._fds

    def own_running(self) -> int:
        """This process's threads in the run state (at least 1: the caller)."""
        me = threading.get_native_id()
        n = 1                     # the caller: running, and its own file is not read
        by_syscall = self.task_file == "syscall"
        for tid, fd in self._task_fds():
            if tid == me:
                continue
            try:
                text = os.pread(fd, 512, 0)
            except OSError:
                continue
            if by_syscall:
                n += text.startswith(b"running")
            else:
                end = text.rfind(b")")
                n += text[end + 2:end + 3] == b"R"
        return n

    def others_running(self) -> Optional[int]:
        """Tasks other than this process's own threads runnable now (None: unknown).
        A reading of none younger than ``max_age_s`` (10 ms) is reused, one of some
        only for ``busy_age_s`` (2 ms): a decode step takes milliseconds or less, and
        a reading on every step cost a full-size 2-thread decode a few per cent (a
        running thread's stat is the dear part).  A load that starts meanwhile
        slows at most the one call before the next reading."""
        if self._fd is None:
            return None
        now = time.monotonic()
        if now - self._read_at < (self.busy_age_s if self._others else self.max_age_s):
            return self._others
        others = self._read_others(guard=False)
        if others and not self._others:
            # Load after none: read again a moment later, our threads before and after the
            # machine's count.  Most other runnable tasks are kernel workers that run for
            # tens of microseconds, many times a second even on an idle machine
            # (``recheck_s`` outlasts nearly all of them), and an OpenMP worker of ours
            # may stop spinning between the two reads; both are gone then, a CPU hog is not.  The wait spins: a sleep on a
            # busy machine returns only when the scheduler next runs this thread, which
            # with two hogs on two CPUs cost every step milliseconds.  Load that persists
            # (the reading before was of some too) is taken as it is.
            until = time.perf_counter() + self.recheck_s
            while time.perf_counter() < until:
                pass
            again = self._read_others(guard=True)
            others = None if again is None else min(others, again)
        if others is None:
            return None
        self._others = others
        self._read_at = now
        return others

    def _read_others(self, guard: bool) -> Optional[int]:
        """The machine's runnable tasks less our own running threads (read after it, and
        with ``guard`` before it too, the larger count subtracted)."""
        before = self.own_running() if guard else 1
        try:
            running = int(os.pread(self._fd, 128, 0).split()[3].split(b"/")[0])
        except (OSError, IndexError, ValueError):
            return None
        if running <= 1:                 # only this thread running: nothing else
            return 0
        return max(0, running - max(before, self.own_running()))


def machine_load() -> Optional[MachineLoad]:
    """A MachineLoad where this system can report one, else None."""
    load = MachineLoad()
    return load if load.available else None


class ThreadTuner:
    """Chooses the thread count of each call from the measured time of earlier ones.

    ``pick(kind)`` returns the count for the next call of that kind and ``record(kind,
    threads, seconds, tokens)`` feeds its wall time back.  Candidates are 1, the
    powers of two below ``max_threads`` and ``max_threads``.  Per kind and candidate
    the cost is the median seconds per token of the last ``window`` samples (one
    descheduled call must not flip the choice); the first call of a kind runs on
    every core (every free one, with ``free_cpus``) and is not recorded (it pays for
    page faults and cold caches).

    ``free_cpus`` (optional, called before every call that would use more than one
    thread) returns how many CPUs no other task is using now, or None when unknown;
    such a call then runs on the largest candidate that fits (at least 1), and is
    recorded under the count it ran on.  A candidate due for a try waits until it fits.

    After each candidate has run once, those within ``close`` (1.25x) of the best
    ``warmup`` times and those within twice its cost twice, the fastest runs.  Another candidate
    is re-tried once ``explore_every`` calls times its cost ratio to the best have
    passed since its last sample: a candidate r times slower is tried every
    ``explore_every``·r calls, so trying costs about 1/explore_every of the time
    whatever r is, and a change of load shows within that many calls.

    Between tries the choice is kept without being worked out again for up to
    ``hold`` calls (never past the next try that is due): working it out is tens of
    microseconds of Python a call (the more, the colder the caches a decode step
    leaves), a few per cent of a full-size 2-bit decode step.
    """

    def __init__(self, max_threads: int, explore_every: int = 32, warmup: int = 6,
                 window: int = 7, free_cpus: Optional[Callable[[], Optional[int]]] = None,
                 close: float = 1.25, hold: int = 16) -> None:
        if int(max_threads) < 1:
            raise ValueError(f"ThreadTuner: max_threads must be >= 1, got {max_threads!r}")
        self.max_threads = int(max_threads)
        cands = {1, self.max_threads}
        p = 2
        while p < self.max_threads:
            cands.add(p)
            p *= 2
        self.candidates: Tuple[int, ...] = tuple(sorted(cands))
        self.explore_every = max(2, int(explore_every))
        self.warmup = max(1, int(warmup))
        self.close = float(close)
        self.window = max(1, int(window))
        self.hold = max(0, int(hold))
        self.free_cpus = free_cpus
        self.narrowed = 0      # calls run on fewer threads than chosen: too few free CPUs
        self._kinds: Dict[str, dict] = {}

    def _kind(self, kind: str) -> dict:
        k = self._kinds.get(kind)
        if k is None:
            k = self._kinds[kind] = {"calls": 0, "recent": {}, "samples": {}, "last": {},
                                     "held": 0, "best": self.max_threads}
        return k

    def cost(self, kind: str, threads: int) -> Optional[float]:
        """Median seconds per token of the recent calls of ``kind`` on ``threads`` (None: unsampled)."""
        recent = self._kind(kind)["recent"].get(threads)
        if not recent:
            return None
        xs = sorted(recent)
        m = len(xs) // 2
        return xs[m] if len(xs) % 2 else 0.5 * (xs[m - 1] + xs[m])

    def _costs(self, kind: str) -> Dict[int, float]:
        costs = {c: self.cost(kind, c) for c in self.candidates}
        return {c: v for c, v in costs.items() if v is not None}

    def _best_of(self, costs: Dict[int, float]) -> int:
        return min(costs, key=lambda c: (costs[c], -c)) if costs else self.max_threads

    def best(self, kind: str) -> int:
        """The sampled candidate with the lowest cost (max_threads before any sample)."""
        return self._best_of(self._costs(kind))

    def pick(self, kind: str) -> int:
        """Thread count for the next call of ``kind``."""
        n = self._choose(kind)
        if n > 1 and self.free_cpus is not None:
            free = self.free_cpus()
            if free is not None and n > free:
                fits = [c for c in self.candidates if c <= free]
                n = fits[-1] if fits else 1
                self.narrowed += 1
        return n

    def _choose(self, kind: str) -> int:
        k = self._kind(kind)
        k["calls"] += 1
        if k["held"] > 0:                     # the choice stands: no try is due yet
            k["held"] -= 1
            return k["best"]
        calls = k["calls"]
        if len(self.candidates) == 1 or calls == 1:   # the cold first call: every core
            return self.max_threads
        unsampled = [c for c in self.candidates if c not in k["samples"]]
        if unsampled:
            return unsampled[0]
        costs = self._costs(kind)             # every candidate is sampled by now
        best = self._best_of(costs)
        best_cost = costs[best]
        ratio = {c: costs[c] / best_cost if best_cost > 0 else 1.0 for c in self.candidates}
        # a candidate close to the best needs a few samples before one of them is
        # called the faster; one clearly slower (a second thread on a loaded machine)
        # is confirmed by a second sample and then only re-tried now and then
        young = [c for c in self.candidates if c != best and (
                 (k["samples"][c] < self.warmup and ratio[c] <= self.close)
                 or (k["samples"][c] < 2 and ratio[c] <= 2.0))]
        if young:
            return min(young, key=lambda c: k["samples"][c])
        due = [(calls - k["last"][c]) / (self.explore_every * max(1.0, ratio[c]))
               for c in self.candidates]
        overdue = [(d, c) for d, c in zip(due, self.candidates) if c != best and d >= 1.0]
        if overdue:
            return max(overdue)[1]
        # calls until the first other candidate is due (due reaches 1), less this one
        until = min((self.explore_every * max(1.0, ratio[c]) - (calls - k["last"][c])
                     for c in self.candidates if c != best), default=0.0)
        k["best"], k["held"] = best, max(0, min(self.hold, int(until) - 1))
        return best

    def record(self, kind: str, threads: int, seconds: float, tokens: int = 1) -> None:
        """Feed back the wall time of a call made with ``threads`` threads."""
        k = self._kind(kind)
        if k["calls"] <= 1 or tokens < 1 or not seconds > 0:
            return
        recent = k["recent"].get(threads)
        if recent is None:
            recent = k["recent"][threads] = deque(maxlen=self.window)
        recent.append(seconds / tokens)
        k["samples"][threads] = k["samples"].get(threads, 0) + 1
        k["last"][threads] = k["calls"]

    def summary(self) -> Dict[str, Dict[str, object]]:
        """Per kind: calls, the current best count, ms per token and samples of each candidate."""
        out = {}
        for kind, k in self._kinds.items():
            out[kind] = {"calls": k["calls"], "best": self.best(kind),
                         "ms_per_token": {c: round(self.cost(kind, c) * 1e3, 4)
                                          for c in self.candidates if c in k["samples"]},
                         "samples": dict(sorted(k["samples"].items()))}
        return out


def free_cpus_from(load: MachineLoad) -> Callable[[], Optional[int]]:
    """``free_cpus`` for a ThreadTuner: this machine's CPUs less the other runnable
    tasks; the caller's own thread is not counted as using one."""
    def free() -> Optional[int]:
        others = load.others_running()
        return None if others is None else max(1, load.cpus - others)
    return free
