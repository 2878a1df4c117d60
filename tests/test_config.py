"""needle_cy.config lists every NEEDLE_CY_* environment variable the package, setup.py and
the tests read, and ``needle-cy inspect --config`` prints them."""
import re
import subprocess
import sys
from pathlib import Path

from needle_cy import config

REPO = Path(__file__).resolve().parent.parent
READ = re.compile(r"NEEDLE_CY_[A-Z0-9_]+")


def names_read():
    files = [REPO / "setup.py"]
    files += [p for p in (REPO / "needle_cy").rglob("*") if p.suffix in (".py", ".pyx", ".pxd", ".pxi", ".h")]
    files += list((REPO / "tests").glob("*.py"))
    found = {}
    for path in files:
        if path.name in ("test_config.py", "config.py"):
            continue
        for name in READ.findall(path.read_text(encoding="utf-8", errors="replace")):
            # include guards of the C headers are names, not settings
            if not name.endswith("_H"):
                found.setdefault(name, path.relative_to(REPO))
    return found


def test_every_variable_read_is_listed():
    listed = {s.name for s in config.SETTINGS}
    missing = {n: str(p) for n, p in names_read().items() if n not in listed}
    assert not missing, f"NEEDLE_CY_* variables read but not listed in needle_cy/config.py: {missing}"


def test_every_listed_variable_is_read_somewhere():
    read = set(names_read())
    assert not [s.name for s in config.SETTINGS if s.name not in read]


def test_entries_are_complete():
    assert len({s.name for s in config.SETTINGS}) == len(config.SETTINGS)
    for s in config.SETTINGS:
        assert s.audience in ("user", "benchmark", "build", "test", "training"), s
        assert s.default and s.read and s.meaning, s


def test_inspect_config_prints_each_with_the_value_seen(monkeypatch):
    env = {"NEEDLE_CY_MLP_TEAM": "2", "PATH": __import__("os").environ["PATH"]}
    out = subprocess.run([sys.executable, "-m", "needle_cy", "inspect", "--config"], cwd=REPO,
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    for s in config.SETTINGS:
        assert s.name in out.stdout
    line = next(l for l in out.stdout.splitlines() if "NEEDLE_CY_MLP_TEAM" in l)
    assert " 2 " in line and "[3]" not in line
    assert "[auto]" in next(l for l in out.stdout.splitlines() if "NEEDLE_CY_THREADS" in l)


def test_inspect_without_a_model_says_what_to_pass():
    out = subprocess.run([sys.executable, "-m", "needle_cy", "inspect"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--config" in out.stderr
