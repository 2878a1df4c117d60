"""Thread policy: explicit counts, the automatic tuner, the engine's run_threads."""
import numpy as np
import pytest

from needle_cy import threads as thr
from needle_cy.threads import ThreadTuner


def drive(tuner, cost_of, calls, kind="step"):
    """Run ``calls`` calls whose cost per candidate is ``cost_of(call, threads)``;
    returns the thread count used by each call."""
    used = []
    for i in range(calls):
        n = tuner.pick(kind)
        tuner.record(kind, n, cost_of(i, n), 1)
        used.append(n)
    return used


def test_candidates():
    assert ThreadTuner(1).candidates == (1,)
    assert ThreadTuner(2).candidates == (1, 2)
    assert ThreadTuner(6).candidates == (1, 2, 4, 6)
    with pytest.raises(ValueError):
        ThreadTuner(0)


def test_single_candidate_never_explores():
    t = ThreadTuner(1)
    assert set(drive(t, lambda i, n: 1.0, 50)) == {1}


@pytest.mark.parametrize("fast", [1, 2])
def test_settles_on_the_faster_count(fast):
    t = ThreadTuner(2)
    used = drive(t, lambda i, n: 1.0 if n == fast else 1.6, 400)
    assert t.best("step") == fast
    tail = used[100:]
    assert tail.count(fast) / len(tail) > 0.95


def test_first_call_uses_every_core_and_is_not_recorded():
    t = ThreadTuner(2)
    assert t.pick("step") == 2
    t.record("step", 2, 100.0)          # cold call: ignored
    assert t.cost("step", 2) is None
    assert t.summary()["step"]["samples"] == {}


def test_a_much_slower_count_costs_little_to_keep_trying():
    # 2 threads 50x slower (a descheduled sibling on a busy machine): after the
    # first samples the tuner re-tries it rarely, so the time it wastes stays small.
    t = ThreadTuner(2)
    used = drive(t, lambda i, n: 1.0 if n == 1 else 50.0, 2000)
    time_on_2 = 50.0 * used[1:].count(2)
    time_on_1 = 1.0 * used[1:].count(1)
    assert used[1:].count(2) >= 2                 # it did look again
    assert time_on_2 / (time_on_1 + time_on_2) < 0.15


def test_follows_a_change_of_load():
    # idle machine first (2 threads faster), then a busy one (1 thread faster)
    t = ThreadTuner(2)
    drive(t, lambda i, n: 1.0 if n == 2 else 1.5, 300)
    assert t.best("step") == 2
    used = drive(t, lambda i, n: 1.0 if n == 1 else 3.0, 600)
    assert t.best("step") == 1
    assert used[-200:].count(1) / 200 > 0.9


@pytest.mark.parametrize("slow", [1.1, 1.3, 1.6, 5.0])
def test_holding_the_choice_keeps_the_schedule(slow, monkeypatch):
    # between tries the kept choice is the one a full evaluation would make: with each
    # candidate's cost steady the calls go to the same counts, hold or no hold, while
    # the choice is worked out afresh on a small share of the calls only
    costs = {1: 1.0, 2: slow}
    held, fresh = ThreadTuner(2, hold=16), ThreadTuner(2, hold=0)
    evaluations = []
    real = ThreadTuner._costs
    monkeypatch.setattr(ThreadTuner, "_costs", lambda self, kind: (evaluations.append(self.hold), real(self, kind))[1])
    assert drive(held, lambda i, n: costs[n], 1500) == drive(fresh, lambda i, n: costs[n], 1500)
    assert evaluations.count(16) < 0.15 * evaluations.count(0)


def test_one_outlier_does_not_flip_the_choice():
    t = ThreadTuner(2)
    drive(t, lambda i, n: 1.0 if n == 2 else 1.3, 200)
    t.pick("step")
    t.record("step", 2, 500.0)          # one call descheduled
    assert t.best("step") == 2


def test_a_clearly_slower_count_gets_two_samples_a_close_one_the_warmup():
    # 1 thread 1.6x slower (a full-size decode on 2 free cores): confirmed once, then
    # only re-tried every explore_every * 1.6 calls
    t = ThreadTuner(2)
    used = drive(t, lambda i, n: 1.0 if n == 2 else 1.6, 50)
    assert used[1:].count(1) == 2         # the next try is due ~51 calls after the last
    # within `close` of the best: sampled `warmup` times before the choice settles
    t = ThreadTuner(2)
    used = drive(t, lambda i, n: 1.0 if n == 2 else 1.1, 20)
    assert used[1:].count(1) == t.warmup


def test_kinds_are_tuned_separately():
    t = ThreadTuner(2)
    drive(t, lambda i, n: 1.0 if n == 1 else 2.0, 300, kind="step")
    drive(t, lambda i, n: 1.0 if n == 2 else 2.0, 300, kind="prefill")
    assert t.best("step") == 1 and t.best("prefill") == 2


def test_never_more_threads_than_free_cpus():
    # a busy machine: the cold call, the first samples and later tries all run on 1
    free = {"n": 1}
    t = ThreadTuner(2, free_cpus=lambda: free["n"])
    used = drive(t, lambda i, n: 1.0 if n == 2 else 1.5, 200)
    assert set(used) == {1}
    assert t.narrowed >= 1 and t.summary()["step"]["samples"] == {1: 199}
    # the machine frees up: 2 threads are tried at once and, faster, kept
    free["n"] = 2
    used = drive(t, lambda i, n: 1.0 if n == 2 else 1.5, 200)
    assert used[0] == 2 and t.best("step") == 2
    assert used[-100:].count(2) / 100 > 0.95
    # load comes back: the very next call narrows, without waiting for slow samples
    free["n"] = 1
    assert t.pick("step") == 1


def test_unknown_free_cpus_leaves_timing_alone():
    t = ThreadTuner(2, free_cpus=lambda: None)
    used = drive(t, lambda i, n: 1.0 if n == 2 else 1.5, 200)
    assert used[0] == 2 and t.best("step") == 2 and t.narrowed == 0


def test_narrowing_picks_the_largest_candidate_that_fits():
    t = ThreadTuner(6, free_cpus=lambda: 5)
    assert t.pick("step") == 4           # the cold call wanted 6


linux_only = pytest.mark.skipif(thr.machine_load() is None,
                                reason="needs Linux /proc/loadavg and an affinity over every CPU")


@linux_only
def test_machine_load_sees_a_busy_process():
    import subprocess
    import sys
    import time
    load = thr.MachineLoad(max_age_s=0.0)
    assert load.own_running() >= 1
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        seen = [load.others_running() for _ in range(200)]
    finally:
        hog.kill()
        hog.wait()
    assert all(isinstance(x, int) and x >= 0 for x in seen)
    assert max(seen) >= 1                  # the hog is runnable whenever it is read
    free = thr.free_cpus_from(load)()
    assert 1 <= free <= load.cpus


@linux_only
def test_own_threads_read_the_same_from_syscall_and_stat():
    # the cheap per-thread file (syscall: "running") and stat's state agree: a thread
    # of ours asleep on an event is not running, the caller is counted once
    import threading
    import time
    load = thr.MachineLoad(refresh_s=0.0)
    gate = threading.Event()
    sleepers = [threading.Thread(target=gate.wait) for _ in range(3)]
    for t in sleepers:
        t.start()
    time.sleep(0.05)      # each has reached its wait (a thread just started may still run)
    try:
        readings = {}
        for kind in ("syscall", "stat"):
            load.close()
            load = thr.MachineLoad(refresh_s=0.0)
            if kind == "stat" or load.task_file != "syscall":
                load.task_file = kind
            readings[kind] = []
            for _ in range(20):
                # spread over ~40 ms: another thread of this process (a worker an
                # earlier test left, finishing its work) may run for a moment
                readings[kind].append(load.own_running())
                time.sleep(0.002)
    finally:
        gate.set()
        for t in sleepers:
            t.join()
    assert len(load._task_fds()) >= 1
    # background threads of the interpreter or NumPy may run for a moment: the usual reading
    assert min(readings["syscall"]) == min(readings["stat"]) == 1


def test_a_moment_of_load_is_read_again_before_it_counts(monkeypatch):
    load = thr.MachineLoad(max_age_s=0.0, recheck_s=0.0, busy_age_s=0.0)
    readings = []
    monkeypatch.setattr(load, "_fd", load._fd if load._fd is not None else -1)
    monkeypatch.setattr(load, "_read_others", lambda guard: readings.pop(0))
    readings[:] = [1, 0]                    # a kernel worker that ran for a moment
    assert load.others_running() == 0 and not readings
    readings[:] = [1, 1]                    # a hog is still there on the second read
    assert load.others_running() == 1
    readings[:] = [0]                       # nothing: no second read
    assert load.others_running() == 0 and not readings
    readings[:] = [2, None]                 # unreadable on the second try: unknown
    assert load.others_running() is None


def test_a_reading_of_load_is_kept_shorter_than_one_of_none(monkeypatch):
    load = thr.MachineLoad(max_age_s=60.0, recheck_s=0.0, busy_age_s=0.0)
    monkeypatch.setattr(load, "_fd", load._fd if load._fd is not None else -1)
    readings = [0]
    monkeypatch.setattr(load, "_read_others", lambda guard: readings.pop(0))
    assert load.others_running() == 0
    assert load.others_running() == 0 and readings == []     # reused: nothing read
    load._read_at = -1e9
    readings[:] = [1, 1, 1]
    assert load.others_running() == 1 and readings == [1]    # load after none: read twice
    # a busy reading is not kept (busy_age_s 0), and load that persists is read once
    assert load.others_running() == 1 and readings == []


@linux_only
def test_machine_load_lists_a_new_thread_at_once():
    # an OpenMP team started after the first reading must be counted as ours at once,
    # not after refresh_s: else its spinning worker reads as another task
    import threading
    load = thr.MachineLoad(refresh_s=3600.0)
    before = len(load._task_fds())
    gate = threading.Event()
    worker = threading.Thread(target=gate.wait)
    worker.start()
    try:
        # listed at once, whatever else this process's threads did meanwhile (an
        # OpenMP worker an earlier test left may come or go)
        import os
        listed = {tid for tid, _ in load._task_fds()}
        assert len(listed) >= before and worker.native_id in listed
        assert listed <= {int(t) for t in os.listdir("/proc/self/task")}
    finally:
        gate.set()
        worker.join()


def test_model_tuner_asks_the_machine_load(monkeypatch, tmp_path):
    from needle_cy.model import Model
    from needle_cy.testing.make_random_archive import make_random_archive
    monkeypatch.delenv("NEEDLE_CY_THREADS", raising=False)
    thr.set_num_threads(None)
    path = make_random_archive(tmp_path / "m.cact", bits=4)
    m = Model.load(path)
    if m.threads < 2 or not hasattr(m._engine, "run_threads"):
        pytest.skip("one core or no OpenMP: no tuner")
    assert m.thread_tuner is not None
    assert (m.thread_tuner.free_cpus is not None) == (thr.machine_load() is not None)


def test_automatic_only_without_an_explicit_count(monkeypatch):
    monkeypatch.delenv("NEEDLE_CY_THREADS", raising=False)
    thr.set_num_threads(None)
    assert thr.threads_automatic(None)
    assert thr.threads_automatic("auto")
    assert not thr.threads_automatic(2)
    monkeypatch.setenv("NEEDLE_CY_THREADS", "1")
    assert not thr.threads_automatic(None)
    assert thr.get_num_threads() == 1
    monkeypatch.setenv("NEEDLE_CY_THREADS", "auto")
    assert thr.threads_automatic(None)
    assert thr.get_num_threads() == thr.physical_cores()
    try:
        thr.set_num_threads(1)
        assert not thr.threads_automatic(None)
    finally:
        thr.set_num_threads(None)
    monkeypatch.setenv("NEEDLE_CY_THREADS", "lots")
    with pytest.raises(ValueError, match="NEEDLE_CY_THREADS"):
        thr.get_num_threads()


# ---------------------------------------------------------------- engine side
engine_mod = pytest.importorskip("needle_cy._model")


@pytest.fixture(scope="module")
def random_archive(tmp_path_factory):
    from needle_cy.testing.make_random_archive import make_random_archive
    return make_random_archive(tmp_path_factory.mktemp("thr") / "m.cact", bits=4)


def test_run_threads_is_validated(random_archive):
    from needle_cy.model import Model
    m = Model.load(random_archive, threads=2)
    eng = m.engine
    assert eng.threads == 2 and eng.run_threads == 2
    eng.run_threads = 1
    assert eng.run_threads == 1
    for bad in (0, 3, -1):
        with pytest.raises(ValueError, match="run_threads"):
            eng.run_threads = bad
    with pytest.raises(AttributeError):
        eng.threads = 8             # scratch is sized for threads: never writable
    assert m.thread_tuner is None   # an explicit count is used as given


def test_tuned_model_gives_the_fixed_models_logits(random_archive, monkeypatch):
    """Whatever count the tuner picks for a call, the logits are the 1-thread model's bit
    for bit (test_model_cython holds every CQ kernel to that on small archives)."""
    from needle_cy.model import Model
    monkeypatch.delenv("NEEDLE_CY_THREADS", raising=False)
    ids = np.random.default_rng(3).integers(4, 200, size=150)
    fixed = Model.load(random_archive, threads=1)
    auto = Model.load(random_archive, threads="auto")
    if auto.thread_tuner is None:         # one physical core here: a 2-thread tuned model
        auto = Model.load(random_archive, threads=2)
        auto.thread_tuner = ThreadTuner(2)
    auto.thread_tuner.free_cpus = None     # both counts must run, however busy the machine is
    want = fixed.prefill(ids[:140])
    got = auto.prefill(ids[:140])          # three chunks, thread counts alternate
    np.testing.assert_array_equal(got, want)
    for tok in ids[140:]:
        np.testing.assert_array_equal(auto.step(int(tok)), fixed.step(int(tok)))
    used = auto.thread_tuner.summary()
    assert used["prefill"]["calls"] == 3 and used["step"]["calls"] == 10
    assert set(used["step"]["samples"]) == {1, 2}    # both counts ran
    assert auto.position == fixed.position == 150


@pytest.mark.parametrize("policy", ["passive", "spin", "active"])
@pytest.mark.parametrize("threads", [2, 3, 5])
def test_team_barrier_keeps_every_thread_in_step(monkeypatch, policy, threads):
    """parallel_barrier.h, the barrier of a decode step's region: after each meeting every
    thread sees every other thread's write of that round, whether waiters sleep at once
    (passive: the futex path), spin first, or spin only; more threads than CPUs too."""
    from needle_cy import _parallel
    if not thr.openmp_enabled():
        pytest.skip("built without OpenMP: a team is one thread, nothing to meet")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    if policy == "passive":
        monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    elif policy == "active":
        monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    else:
        monkeypatch.setenv("GOMP_SPINCOUNT", "2000")
    rounds = 3000 if policy != "active" or threads <= 2 else 40   # spinning on 2 CPUs: slow
    team, wrong, _ = _parallel.barrier_check(threads, rounds, "nc")
    assert team == threads and wrong == 0
    # the OpenMP barrier under the same check, as the control
    team, wrong, _ = _parallel.barrier_check(threads, 200, "omp")
    assert team == threads and wrong == 0


def test_barrier_check_validates_its_arguments():
    from needle_cy import _parallel
    with pytest.raises(ValueError):
        _parallel.barrier_check(0, 10)
    with pytest.raises(ValueError):
        _parallel.barrier_check(2, 10, "spin")


@pytest.mark.parametrize("policy", ["passive", "spin"])
@pytest.mark.parametrize("threads", [2, 3])
def test_team_barrier_with_prefetch_streams_keeps_every_thread_in_step(monkeypatch, policy, threads):
    """A decode step's waiters pump their prefetch streams (prefetch_stream.h) before
    they spin or sleep: the meetings must still hold every thread in step, with lines
    due at most meetings (each round consumes a phase of 4 KB)."""
    from needle_cy import _parallel
    if not thr.openmp_enabled():
        pytest.skip("built without OpenMP: a team is one thread, nothing to meet")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    if policy == "passive":
        monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    else:
        monkeypatch.setenv("GOMP_SPINCOUNT", "2000")
    team, wrong, _ = _parallel.barrier_check(threads, 3000, "nc_pf")
    assert team == threads and wrong == 0


def test_prefetch_stream_hands_out_whole_lines_in_order_within_its_budget():
    """The pump asks for each line of the plan once, in plan order, rounded out to whole
    64-byte lines, never more than `ahead` bytes beyond what is consumed."""
    from needle_cy._parallel import pf_stream_trace
    ranges = [(0, 200, 0), (1000, 64, 1), (4096, 256, 2)]
    every = [0, 64, 128, 192, 960, 1024, 4096, 4160, 4224, 4288]
    # an unbounded budget: the whole plan in order, then nothing
    assert pf_stream_trace(ranges, 1 << 30, [("next", 100), ("next", 5)]) == [every, []]
    # a budget of 4 lines: 4, then only as phases are consumed
    got = pf_stream_trace(ranges, 256, [("next", 10), ("done", 0), ("next", 10), ("next", 10)])
    assert got == [every[:4], every[4:8], []]
    # rewind starts the same plan over
    assert pf_stream_trace(ranges, 1 << 30, [("next", 3), ("rewind",), ("next", 3)]) == [every[:3]] * 2
    # no budget: nothing at all
    assert pf_stream_trace(ranges, 0, [("next", 10)]) == [[]]


def test_prefetch_stream_skips_what_was_read_before_it_got_there():
    """A phase read before the pump reached it is not asked for afterwards; a phase
    consumed while the pump was ahead does not move the pump back."""
    from needle_cy._parallel import pf_stream_trace
    ranges = [(0, 128, 0), (128, 128, 1), (256, 128, 2), (384, 128, 3)]
    assert pf_stream_trace(ranges, 1 << 30, [("next", 1), ("done", 1), ("next", 2)]) == [[0], [256, 320]]
    assert pf_stream_trace(ranges, 1 << 30, [("next", 6), ("done", 0), ("next", 5)]) == [[0, 64, 128, 192, 256, 320], [384, 448]]
    # phases with no ranges of this thread (another thread's rows) are consumed too
    sparse = [(0, 64, 0), (640, 64, 5)]
    assert pf_stream_trace(sparse, 64, [("next", 2), ("done", 3), ("next", 2), ("done", 5), ("next", 2)]) == [[0], [640], []]


def test_prefetch_stream_drops_ranges_beyond_its_capacity():
    from needle_cy._parallel import pf_stream_trace
    ranges = [(64 * i, 64, i) for i in range(2100)]
    got = pf_stream_trace(ranges, 1 << 30, [("next", 3000)])[0]
    assert got == [64 * i for i in range(2048)]          # NC_PF_RANGES of them, the first ones
    with pytest.raises(ValueError, match="negative"):
        pf_stream_trace([(-64, 64, 0)], 64, [])
    with pytest.raises(ValueError, match="unknown step"):
        pf_stream_trace([(0, 64, 0)], 64, [("jump", 1)])


def test_prefetch_ahead_follows_the_environment(monkeypatch):
    from needle_cy._model import prefetch_ahead_bytes
    monkeypatch.setenv("NEEDLE_CY_PF_AHEAD", "0")
    assert prefetch_ahead_bytes() == 0
    monkeypatch.setenv("NEEDLE_CY_PF_AHEAD", "12345")
    assert prefetch_ahead_bytes() == 12345
    for bad in ("lots", "-1"):
        monkeypatch.setenv("NEEDLE_CY_PF_AHEAD", bad)
        with pytest.raises(ValueError, match="NEEDLE_CY_PF_AHEAD"):
            prefetch_ahead_bytes()
    monkeypatch.delenv("NEEDLE_CY_PF_AHEAD")
    assert 0 < prefetch_ahead_bytes() <= 1 << 30


def test_mlp_team_follows_the_environment(monkeypatch):
    from needle_cy._model import mlp_team_min
    monkeypatch.delenv("NEEDLE_CY_MLP_TEAM", raising=False)
    assert mlp_team_min() == 3
    monkeypatch.setenv("NEEDLE_CY_MLP_TEAM", "2")
    assert mlp_team_min() == 2
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv("NEEDLE_CY_MLP_TEAM", bad)
        with pytest.raises(ValueError, match="NEEDLE_CY_MLP_TEAM"):
            mlp_team_min()
