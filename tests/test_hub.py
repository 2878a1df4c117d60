"""Models by Hugging Face id, from a Hugging Face cache built on disk here in the layout
huggingface_hub writes (there is no network in the tests), and the .cact choice rule
shared with model folders."""
import importlib.machinery
import os
import socket
import subprocess
import sys
import types

import pytest

from conftest import REPO, fixture_path
from needle_cy import ModelNotAvailableError, Needle
from needle_cy import hub
from needle_cy.hub import (_download_command, cached_snapshot, hub_cache_dir, parse_hub_id, pick_archive,
                           resolve_model)

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
    assert "pip install 'needle_cy[hub]'" in message
    assert f"run `{_download_command()} download needle/absent --local-dir absent`" in message
    assert "pass its path as the model" in message and len(message.splitlines()) == 1
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delitem(sys.modules, "huggingface_hub")   # even with the package, offline stays offline
    with pytest.raises(ModelNotAvailableError, match=r"HF_HUB_OFFLINE is set: unset it to download the model, "
                                                     r"or on a machine with network access run `\S+ download "
                                                     r"needle/absent --revision v3 --local-dir absent`"):
        resolve_model("needle/absent@v3")
    assert cached_snapshot("needle/absent", "v3", hub_cache) is None


def test_the_download_command_is_the_one_the_installed_huggingface_hub_has(monkeypatch):
    import importlib.metadata as metadata

    def version_is(text):
        def version(name):
            assert name == "huggingface_hub"
            if text is None:
                raise metadata.PackageNotFoundError(name)
            return text
        monkeypatch.setattr(metadata, "version", version)
        return _download_command()

    assert version_is("0.20.3") == "huggingface-cli" and version_is("0.33.9") == "huggingface-cli"
    assert version_is("0.34.0") == "hf" and version_is("1.2.0rc1") == "hf" and version_is(None) == "hf"
    monkeypatch.undo()
    try:
        scripts = {e.name for e in metadata.distribution("huggingface_hub").entry_points
                   if e.group == "console_scripts"}
    except metadata.PackageNotFoundError:
        return
    assert _download_command() in scripts         # the command named in the messages exists


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]          # nothing listens there once the socket is closed


class _FakeHub(types.ModuleType):
    """A stand-in huggingface_hub recording what it was asked (no network in the tests)."""

    def __init__(self, files, archive):
        super().__init__("huggingface_hub")
        self.__spec__ = importlib.machinery.ModuleSpec("huggingface_hub", None)
        self.calls = []
        hub = self

        class HfApi:
            def list_repo_files(self, repo_id, revision=None):
                hub.calls.append(("list", repo_id, revision))
                return files

        def hf_hub_download(repo_id, name, revision=None, cache_dir=None):
            hub.calls.append(("download", repo_id, name, revision))
            return str(archive)

        self.HfApi, self.hf_hub_download = HfApi, hf_hub_download


def test_without_network_the_hub_is_not_asked_and_one_line_says_what_to_do(hub_cache, monkeypatch, caplog):
    fake = _FakeHub(["model.cact"], tiny())
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    # a refused connection (nothing listens at the endpoint)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(ModelNotAvailableError) as info:
        Needle("needle/absent@v2", tools=[])
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "cannot be downloaded here: 127.0.0.1" in message
    assert "cannot be reached" in message
    assert "on a machine with network access run" in message and "--revision v2 --local-dir absent" in message
    assert fake.calls == []                       # huggingface_hub (and its retries) never ran
    # an address that does not answer: the short connect timeout ends the wait
    monkeypatch.setattr(hub, "CONNECT_TIMEOUT_S", 0.05)
    monkeypatch.setenv("HF_ENDPOINT", "http://192.0.2.1:81")       # TEST-NET-1: never routed
    with pytest.raises(ModelNotAvailableError, match="192.0.2.1 \\(port 81\\) cannot be reached"):
        resolve_model("needle/absent")
    assert fake.calls == [] and not [r for r in caplog.records if "Retry" in r.getMessage()]


def test_the_real_huggingface_hub_is_not_reached_offline(hub_cache, monkeypatch, caplog):
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ModelNotAvailableError, match=f"cannot be reached.*run `{_download_command()} download "
                                                     f"needle/absent --local-dir absent`"):
        resolve_model("needle/absent")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotAvailableError, match="HF_HUB_OFFLINE is set"):
        resolve_model("needle/absent")
    assert not [r for r in caplog.records if "Retry" in r.getMessage()]


def test_with_the_hub_reachable_the_archive_is_downloaded(hub_cache, monkeypatch):
    fake = _FakeHub(["README.md", "model.cact"], tiny())
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert resolve_model("needle/tiny@v1") == tiny()
    assert fake.calls == [("list", "needle/tiny", "v1"), ("download", "needle/tiny", "model.cact", "v1")]


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
