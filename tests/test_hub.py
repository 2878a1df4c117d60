"""Models by Hugging Face id, from a Hugging Face cache built on disk here in the layout
huggingface_hub writes (there is no network in the tests), and the .cact choice rule
shared with model folders."""
import os
import subprocess
import sys

import pytest

from conftest import REPO, fixture_path
from needle_cy import ModelNotAvailableError, Needle
from needle_cy.hub import cached_snapshot, hub_cache_dir, parse_hub_id, pick_archive, resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"


def add_snapshot(cache, repo_id, commit, files, ref=None):
    """files: name in the snapshot → source file; stored as blobs + symlinks, as the hub does."""
    root = cache / ("models--" + repo_id.replace("/", "--"))
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = root / "snapshots" / commit
    for i, (name, source) in enumerate(files.items()):
        blob = root / "blobs" / f"{commit[:8]}{i:04d}"
        blob.write_bytes(source.read_bytes())
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref is not None:
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return cache


@pytest.fixture
def no_hub_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)      # import fails as when absent


def tiny():
    return fixture_path("needle3_tiny_a", "model.cact")


def test_hub_ids_and_paths_are_told_apart():
    assert parse_hub_id("org/name") == ("org/name", "main")
    assert parse_hub_id("org/name@v1.0") == ("org/name", "v1.0")
    assert parse_hub_id(f"Org-1/na_me.x@{COMMIT}") == ("Org-1/na_me.x", COMMIT)
    for path in ("org/model.cact", "./org/name", "/abs/name", "a/b/c", "name", "org/", "~/x"):
        assert parse_hub_id(path) is None, path


def test_the_cache_folder_follows_the_hugging_face_variables(monkeypatch, tmp_path):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert hub_cache_dir() == tmp_path / "cache"


def test_a_cached_model_loads_by_id_and_revision(hub_cache, no_hub_package):
    add_snapshot(hub_cache, "needle/tiny", COMMIT, {"model.cact": tiny(), "README.md": tiny()}, ref="main")
    add_snapshot(hub_cache, "needle/tiny", OTHER_COMMIT, {"q4/needle.cact": tiny()}, ref="v2")
    agent = Needle("needle/tiny", tools=[], retrieval="bm25")
    assert agent.model_path == str(hub_cache / "models--needle--tiny" / "snapshots" / COMMIT / "model.cact")
    assert agent.model.config.d_model == 64
    assert resolve_model("needle/tiny@v2").parts[-2:] == ("q4", "needle.cact")      # the only one
    assert resolve_model(f"needle/tiny@{COMMIT}").name == "model.cact"              # a commit hash


def test_several_archives_need_a_choice(hub_cache, no_hub_package):
    add_snapshot(hub_cache, "needle/multi", COMMIT, {"needle-q2.cact": tiny(), "needle-q4.cact": tiny()},
                 ref="main")
    with pytest.raises(ModelNotAvailableError, match=r"several \.cact archives \(needle-q2.cact, needle-q4.cact\)"
                                                     r".*model_file= \(CLI: --model-file\)"):
        resolve_model("needle/multi")
    assert resolve_model("needle/multi", model_file="needle-q4.cact").name == "needle-q4.cact"
    with pytest.raises(ModelNotAvailableError, match="q8.cact of the model needle/multi@main is not in the"):
        resolve_model("needle/multi", model_file="q8.cact")          # not cached: it would be downloaded
    assert pick_archive(["a.cact", "model.cact", "x.json"], None, "here") == "model.cact"


def test_a_model_neither_cached_nor_reachable_says_how_to_get_it(hub_cache, no_hub_package, monkeypatch):
    with pytest.raises(ModelNotAvailableError) as info:
        Needle("needle/absent", tools=[])
    message = str(info.value)
    assert "not in the Hugging Face cache" in message and str(hub_cache) in message
    assert "pip install 'needle_cy[hub]'" in message and "huggingface-cli download needle/absent" in message
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delitem(sys.modules, "huggingface_hub")   # even with the package, offline stays offline
    with pytest.raises(ModelNotAvailableError, match="HF_HUB_OFFLINE is set"):
        resolve_model("needle/absent@v3")
    assert cached_snapshot("needle/absent", "v3", hub_cache) is None


def test_a_local_path_wins_over_an_id(hub_cache, tmp_path, monkeypatch):
    local = tmp_path / "needle" / "tiny"
    local.mkdir(parents=True)
    (local / "model.cact").symlink_to(tiny())
    monkeypatch.chdir(tmp_path)
    assert resolve_model("needle/tiny") == local.relative_to(tmp_path) / "model.cact"
    with pytest.raises(FileNotFoundError, match="model archive not found: needle/missing.cact"):
        resolve_model("needle/missing.cact")


def test_our_cache_reading_agrees_with_huggingface_hub(hub_cache):
    hf = pytest.importorskip("huggingface_hub", reason="huggingface_hub (the [hub] extra) is not installed")
    add_snapshot(hub_cache, "needle/tiny", COMMIT, {"model.cact": tiny()}, ref="main")
    add_snapshot(hub_cache, "needle/tiny", OTHER_COMMIT, {"model.cact": tiny()}, ref="v2")
    for revision in ("main", "v2", COMMIT):
        theirs = hf.try_to_load_from_cache("needle/tiny", "model.cact", cache_dir=str(hub_cache),
                                           revision=revision)
        assert str(resolve_model(f"needle/tiny@{revision}")) == theirs


def test_the_cli_takes_a_hub_id(hub_cache):
    add_snapshot(hub_cache, "needle/tiny", COMMIT, {"model.cact": tiny()}, ref="main")
    env = dict(os.environ, HF_HUB_CACHE=str(hub_cache), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "needle_cy", "inspect", "needle/tiny"], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=120)
    assert proc.returncode == 0 and "d_model" in proc.stdout, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "needle_cy", "run", "hi", "--model", "needle/gone"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert proc.returncode == 1 and proc.stderr.startswith("needle-cy: error: the model needle/gone@main")
    assert len(proc.stderr.strip().splitlines()) == 1
