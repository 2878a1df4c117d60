"""benchmarks/report.py: the report's sections, its roofline figures and cost model, and the
roofline probes (needle_cy._roofline).  The report runs in its tiny mode on a small random
archive (seconds); nothing here asserts a speed."""
import argparse
import importlib.util
import json
import re

import numpy as np
import pytest

from conftest import REPO
from needle_cy.testing.make_random_archive import make_random_archive

roofline = pytest.importorskip("needle_cy._roofline", reason="extensions not built")


def _load_report_module():
    spec = importlib.util.spec_from_file_location("needle_cy_bench_report", REPO / "benchmarks" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


report = _load_report_module()


@pytest.fixture(scope="module")
def small_archive(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    return make_random_archive(root / "small2.cact", layers=2, d_model=64, vocab=256, bits=2,
                               group_size=64, max_seq_len=128)


@pytest.fixture(scope="module")
def tiny_report(small_archive, tmp_path_factory):
    out = tmp_path_factory.mktemp("report_out")
    path = report.build_report(argparse.Namespace(
        mode="tiny", out=str(out), bits="2", archive=[f"2={small_archive}"], threads="1,auto",
        suites="none", no_perf=True, no_plots=False), log=lambda s: None)
    return path, json.loads((out / "report.json").read_text())


SECTIONS = ["# needle_cy benchmark report", "## Machine", "## Roofline (measured in this run)",
            "## Cost per token (from the archives)", "## Tokens/s against context length", "### Decode",
            "### Prefill", "## Per-operator breakdown", "## Grammar, tokenizer and agent suites"]


def test_report_has_every_section_in_order(tiny_report):
    text = tiny_report[0].read_text()
    lines = text.splitlines()
    positions = [lines.index(s) for s in SECTIONS]
    assert positions == sorted(positions)
    assert "| CQ kernel chosen |" in text and "| kernel-relevant flags |" in text and "| compiled modules |" in text
    # the history is pointed to, not repeated: no heading beyond the report's own sections
    assert "`benchmarks/history/`" in lines[-1]
    assert [ln for ln in lines if ln.startswith("## ")] == [s for s in SECTIONS if s.startswith("## ")]
    assert not list((REPO / "benchmarks").glob("results_*.md")), "results_*.md now live in benchmarks/history/"


def test_the_committed_report_has_the_generators_sections():
    """benchmarks/report/REPORT.md is the generator's output: the same top-level sections,
    and no history folded in."""
    lines = (REPO / "benchmarks" / "report" / "REPORT.md").read_text(encoding="utf-8").splitlines()
    assert [ln for ln in lines if ln.startswith("## ")] == [s for s in SECTIONS if s.startswith("## ")]
    assert "`benchmarks/history/`" in lines[-1]


def test_a_plain_run_writes_outside_the_tracked_files(tmp_path):
    """report.py's default folder is one git ignores; --update-committed names the tracked one."""
    import subprocess
    default = report.DEFAULT_OUT.relative_to(REPO)
    probe = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", str(default / "REPORT.md")])
    if probe.returncode == 128:
        pytest.skip("not a git checkout")
    assert probe.returncode == 0, f"{default} is not ignored by git"
    assert report.COMMITTED_OUT == REPO / "benchmarks" / "report"
    seen = {}
    real_build = report.build_report
    try:
        report.build_report = lambda args, log=print: seen.setdefault("out", args.out)
        report.main([])
        assert seen.pop("out") == str(report.DEFAULT_OUT)
        report.main(["--update-committed"])
        assert seen.pop("out") == str(report.COMMITTED_OUT)
        report.main(["--out", str(tmp_path)])
        assert seen.pop("out") == str(tmp_path)
    finally:
        report.build_report = real_build
    with pytest.raises(SystemExit):
        report.main(["--out", str(tmp_path), "--update-committed"])


def test_plots_are_written_or_reported_skipped(tiny_report):
    path = tiny_report[0]
    text = path.read_text()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "Plots skipped: matplotlib is not installed" in text
        return
    for name in ("decode_tok_s.png", "prefill_tok_s.png", "roofline_share.png"):
        assert f"]({name})" in text
        assert (path.parent / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # --replot redraws the same figures from report.json alone
    (path.parent / "decode_tok_s.png").unlink()
    assert report.replot(path.parent) == ["decode_tok_s.png", "prefill_tok_s.png", "roofline_share.png"]
    assert (path.parent / "decode_tok_s.png").exists()


def _table_rows(text, header_start):
    lines = text.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_roofline_figures_are_positive_numbers(tiny_report):
    text, raw = tiny_report[0].read_text(), tiny_report[1]
    rows = _table_rows(text, "| ceiling |")
    assert [r[0].split(",")[0] for r in rows] == ["float32 FMA", "int8 dot product", "int16 dot product",
                                                  "L2 read", "L3 read", "DRAM read"]
    for row in rows:
        for cell in row[2:]:
            value = float(re.match(r"[\d,.]+", cell).group(0).replace(",", ""))
            assert value > 0, row
    for kind in ("fma", "int8", "int16", "L2", "L3", "DRAM"):
        assert all(v > 0 for v in raw["roofline"][kind].values()), kind
    # every speed row has a positive roofline and a share
    for table in ("| width | threads | context |", "| width | threads | prompt |"):
        rows = _table_rows(text, table)
        assert len(rows) == 2 * 2                      # 2 thread settings x 2 points
        for row in rows:
            for cell in row[6:8]:                      # FMA and int8 rooflines, tok/s
                assert float(cell.replace(",", "")) > 0
            assert float(row[8].split()[0]) > 0        # % of roofline


def test_cost_model_counts_the_streamed_records(small_archive):
    from needle_cy.archive import Archive
    cost = report.cost_model(small_archive)
    with Archive.open(small_archive) as a:
        cfg = a.config
        proj = sum(r.nbytes for r in a.records if re.match(r"layers\.\d+\.(q|k|v|gate|out)_proj$", r.role))
        tables = sum(r.nbytes for r in a.records if r.role.endswith(".tables"))
    assert cost["weight_bytes"] > proj > 0
    assert cost["weight_bytes"] + cost["head_bytes"] < a.file_size - tables + 1
    d = cfg.d_model
    per_layer = (cfg.num_heads * cfg.qk_head_dim + cfg.num_kv_heads * (cfg.qk_head_dim + cfg.v_head_dim)
                 + 2 * cfg.num_heads * cfg.v_head_dim) * d
    assert cost["body_macs"] >= cfg.num_layers * per_layer
    assert cost["head_macs"] == cfg.out_rows * d
    # attention makes a later token cost more; prefill amortises the head over a chunk
    assert report.decode_cost(cost, 100)["bytes"] > report.decode_cost(cost, 10)["bytes"]
    assert report.prefill_macs_per_token(cost, 64) < report.decode_cost(cost, 63)["macs"]
    assert report.prefill_macs_per_token(cost, 64) > cost["body_macs"]


def test_perf_rows_are_parsed_demangled_and_grouped():
    text = """# Overhead  Symbol                                   IPC   [IPC Coverage]
    50.00%  [.] nc_cqi_rows_avx512vnni                   -      -
    20.00%  [.] __pyx_f_9needle_cy_6_model_12CythonEngine__attend_step_heads  -  -
    10.00%  [.] nc_kron_half
     5.00%  [k] clear_page_erms
     5.00%  [.] __pyx_f_9needle_cy_3_cq__rotate_int
    10.00%  [.] something_else
     3.00%  [.] nc_cql_tile_rows_vnni
     1.00%  [.] nc_cql_rows_bw
     1.00%  [.] nc_cql_tables
     1.00%  [.] nc_cql_token_scale
"""
    rows = report.parse_perf_report(text)
    assert rows[0] == (50.0, "nc_cqi_rows_avx512vnni")
    assert rows[1][1] == "_model.CythonEngine._attend_step_heads"
    assert rows[3] == (5.0, "[k] clear_page_erms")
    groups = report.group_operators(rows)
    assert groups["CQ products (matvec / matmul)"] == 54.0          # integer and lookup kernels
    assert groups["attention (scores, softmax, P·V)"] == 20.0
    assert groups["Monarch MLP"] == 10.0
    assert groups["rotations (A8 codes, FWHT, gathers, lookup tables)"] == 7.0
    assert groups["other"] == 10.0
    assert report.demangle_cython("__pyx_f_9needle_cy_4_ops_a8_inplace") == "_ops.a8_inplace"
    assert report.demangle_cython("gc_collect_main") == "gc_collect_main"


def test_roofline_probes_reject_bad_arguments():
    for kind in ("fma", "int8", "int16"):
        assert roofline.compute_isa(kind)
    with pytest.raises(ValueError, match="kind"):
        roofline.compute_peak("fp64")
    with pytest.raises(ValueError, match="threads"):
        roofline.compute_peak("fma", threads=0)
    with pytest.raises(ValueError, match="timer"):
        roofline.compute_peak("fma", seconds=0.001, timer="cycles")
    buf = np.ones(4096 + 64, np.uint8)
    off = (-buf.ctypes.data) % 64
    with pytest.raises(ValueError, match="aligned"):
        roofline.read_bandwidth(buf[off + 8:off + 8 + 1024])
    with pytest.raises(ValueError, match="256 bytes per thread"):
        roofline.read_bandwidth(buf[off:off + 128])
    assert roofline.read_bandwidth(buf[off:off + 4096], seconds=0.002) > 0


def _load_profile_step_module():
    spec = importlib.util.spec_from_file_location("needle_cy_bench_profile_step",
                                                  REPO / "benchmarks" / "profile_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("extra0", [0, 1])
def test_meeting_profile_names_every_meeting_once(extra0):
    """profile_step.py's phase table: engram sites, the block phases (the mean over blocks
    1..L-1), the head; each meeting of the step is read by exactly one row (with the
    meeting more of a block 0 that reads an engram site, or without)."""
    ps = _load_profile_step_module()
    n_sites, n_layers, threads = 2, 4, 2
    meetings = 2 * n_sites + len(ps.BLOCK_PHASES) * n_layers + extra0 + 2
    ns = np.zeros((8, 1024, 2), np.int64)
    ns[:threads, :meetings, 0] = 1000 * np.arange(1, meetings + 1)      # meeting k: k+1 µs of work
    ns[:threads, :meetings, 1] = 500
    rows, us = ps.phase_table(ns, 1, n_sites, n_layers, threads, extra0=extra0)
    assert len(rows) == 2 * n_sites + len(ps.BLOCK_PHASES) + 2
    assert rows[0][1][0, 0] == 1.0 and rows[2 * n_sites - 1][1][1, 0] == 2 * n_sites
    first = 2 * n_sites
    for i in range(len(ps.BLOCK_PHASES)):                 # mean of blocks 1..L-1 of phase i
        want = np.mean([first + extra0 + len(ps.BLOCK_PHASES) * b + i + 1 for b in range(1, n_layers)])
        assert rows[first + i][1][0, 0] == pytest.approx(want)
    assert rows[-1][1][0, 0] == meetings and rows[-2][1][0, 0] == meetings - 1
    assert np.all(us[:, :meetings, 1] == 0.5)


def test_meeting_profile_needs_its_build():
    """The default build has no meeting profile: barrier_profile says how to get one."""
    from needle_cy import _model
    try:
        ns, steps = _model.barrier_profile()
    except RuntimeError as e:
        assert "NC_BARRIER_PROFILE" in str(e)
    else:                                      # a profiling build: the counters read back
        assert ns.shape == (8, 1024, 2) and steps >= 0
