"""Where a model archive comes from: a ``.cact`` file, a folder holding one, or a Hugging
Face model id (``org/name``, ``org/name@revision``).

A Hugging Face id is resolved **offline first**, from the local Hugging Face cache, in
the layout ``huggingface_hub`` writes (read here directly, so a cached model needs no
extra package)::

    {cache}/models--{org}--{name}/refs/{revision}          the commit a branch or tag is at
    {cache}/models--{org}--{name}/snapshots/{commit}/...   the files of that commit

``{cache}`` is ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``; the revision defaults to ``main`` and may be a commit
hash.  Only when the archive is not cached, ``HF_HUB_OFFLINE`` is not set, the
optional ``huggingface_hub`` package is installed (``pip install 'needle_cy[hub]'``)
and the hub (``HF_ENDPOINT``, or the proxy the environment names for it) accepts a
connection within ``CONNECT_TIMEOUT_S`` is it downloaded (into the same cache).
Otherwise ``ModelNotAvailableError`` says, in one line, how to get it: download it on a
connected machine with the ``hf`` command (``huggingface-cli`` before huggingface_hub
0.34) and pass the folder or the ``.cact`` file.  The connection is tried first because
huggingface_hub retries a failed request five times with back-off (~24 s, a log line
each) before it gives up.

Which file (the same rule for a folder and for a snapshot): ``model_file`` when given
(a path relative to the folder); else the only ``.cact`` file in it (sub-folders
included); else ``model.cact`` at its top; else an error listing the archives.
"""
from __future__ import annotations

import importlib.util
import os
import re
import socket
import urllib.request
from pathlib import Path
from typing import Iterable, Optional, Tuple, Union
from urllib.parse import urlsplit

from .errors import ModelNotAvailableError

__all__ = ["resolve_model", "parse_hub_id", "hub_cache_dir", "pick_archive", "cached_snapshot"]

_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[^\s@]+))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_TRUE = ("1", "true", "yes", "on")
DEFAULT_ENDPOINT = "https://huggingface.co"
CONNECT_TIMEOUT_S = 3.0     # how long the connection to the hub may take to open


def parse_hub_id(text: str) -> Optional[Tuple[str, str]]:
    """``(repo_id, revision)`` when ``text`` has the form of a Hugging Face model id
    (``org/name`` or ``org/name@revision``; revision ``main`` by default), else None.
    A name ending in ``.cact`` is a file name, never an id."""
    match = _HUB_ID.match(text)
    if match is None or match.group("repo").endswith(".cact"):
        return None
    return match.group("repo"), match.group("revision") or "main"


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache folder, as ``huggingface_hub`` chooses it."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def pick_archive(names: Iterable[str], model_file: Optional[str], where: str) -> str:
    """The relative path of the archive to load among ``names`` (the files of a folder
    or snapshot, ``/``-separated), by the rule in the module docstring."""
    names = sorted(set(names))
    archives = [n for n in names if n.endswith(".cact")]
    if model_file is not None:
        wanted = str(model_file).replace(os.sep, "/").lstrip("/")
        if wanted in names:
            return wanted
        raise ModelNotAvailableError(
            f"{where} has no file {model_file!r}; its .cact archives: {', '.join(archives) or 'none'}")
    if len(archives) == 1:
        return archives[0]
    if "model.cact" in archives:
        return "model.cact"
    if not archives:
        raise ModelNotAvailableError(f"{where} holds no .cact archive")
    raise ModelNotAvailableError(
        f"{where} holds several .cact archives ({', '.join(archives)}) and none is model.cact; "
        f"choose one with model_file= (CLI: --model-file)")


def _files_under(folder: Path) -> list:
    return [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]


def cached_snapshot(repo_id: str, revision: str = "main", cache: Optional[Path] = None) -> Optional[Path]:
    """The snapshot folder of ``repo_id`` at ``revision`` in the local cache, or None."""
    root = (cache or hub_cache_dir()) / ("models--" + repo_id.replace("/", "--"))
    ref = root / "refs" / revision
    commit = None
    if ref.is_file():
        commit = ref.read_text(encoding="utf-8").strip()
    elif _COMMIT.match(revision):
        commit = revision
    if not commit:
        return None
    snapshot = root / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _download_command() -> str:
    """The Hugging Face command that downloads: ``hf`` since huggingface_hub 0.34 (the
    version 1 releases have no other), ``huggingface-cli`` in the installed older ones."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        try:
            numbers = re.findall(r"\d+", version("huggingface_hub"))[:2]
        except PackageNotFoundError:
            return "hf"
        return "huggingface-cli" if tuple(int(n) for n in numbers) < (0, 34) else "hf"
    except Exception:        # an unreadable installation: the current command
        return "hf"


def _how_to_get(repo_id: str, revision: str, model_file: Optional[str] = None) -> str:
    """What to do, as a clause: download on a connected machine, then pass the folder."""
    folder = repo_id.split("/")[-1]
    command = _download_command()
    args = repo_id + (f" {model_file}" if model_file is not None else "")
    args += "" if revision == "main" else f" --revision {revision}"
    installs = "`pip install -U huggingface_hub` installs `hf`" if command == "hf" else \
        "from huggingface_hub"
    return (f"on a machine with network access run `{command} download {args} --local-dir "
            f"{folder}` ({installs}), copy the folder {folder} here and pass its path as the "
            f"model (CLI: --model {folder}); or pass the path of a .cact file")


def _unreachable(timeout: Optional[float] = None) -> Optional[str]:
    """None when a TCP connection to the hub (``HF_ENDPOINT``), or to the proxy the
    environment names for it, opens within ``timeout`` seconds (``CONNECT_TIMEOUT_S``);
    else what failed, in a few words."""
    endpoint = os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    url = urlsplit(endpoint)
    if not url.hostname:
        return f"HF_ENDPOINT={endpoint!r} names no host"
    host, port, what = url.hostname, url.port, url.hostname
    proxies = urllib.request.getproxies()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(host):
        purl = urlsplit(proxy if "://" in proxy else "http://" + proxy)
        if purl.hostname:
            host, port, url = purl.hostname, purl.port, purl
            what = f"the proxy {purl.hostname}"
    if port is None:
        port = 443 if url.scheme == "https" else 80
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S if timeout is None else timeout):
            return None
    except OSError as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        return f"{what} (port {port}) cannot be reached: {reason}"


def _what(repo_id: str, revision: str, model_file: Optional[str]) -> str:
    model = f"the model {repo_id}@{revision}"
    return f"{model_file} of {model}" if model_file is not None else model


def _download(repo_id: str, revision: str, model_file: Optional[str], cache: Path) -> Path:
    what = _what(repo_id, revision, model_file)
    no_package = ModelNotAvailableError(
        f"{what} is not in the Hugging Face cache ({cache}) and the optional "
        f"huggingface_hub package, which needle_cy downloads with, is not installed: "
        f"pip install 'needle_cy[hub]' where there is network access; or "
        f"{_how_to_get(repo_id, revision, model_file)}")
    try:
        installed = importlib.util.find_spec("huggingface_hub") is not None
    except (ImportError, ValueError):
        installed = False
    if not installed:
        raise no_package
    # Before importing huggingface_hub: its download modules take ~1 s to import.
    unreachable = _unreachable()
    if unreachable is not None:
        raise ModelNotAvailableError(
            f"{what} is not in the Hugging Face cache ({cache}) and cannot be downloaded here: "
            f"{unreachable}; {_how_to_get(repo_id, revision, model_file)}")
    try:
        from huggingface_hub import HfApi, hf_hub_download
    except ImportError:
        raise no_package from None
    where = f"the Hugging Face model {repo_id}@{revision}"
    try:
        files = HfApi().list_repo_files(repo_id, revision=revision)
    except Exception as exc:     # network, authentication, unknown repository
        raise ModelNotAvailableError(
            f"{what} is not in the Hugging Face cache ({cache}) and "
            f"cannot be downloaded ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): "
            f"check the model id and revision (a private model needs `hf auth login`); or "
            f"{_how_to_get(repo_id, revision, model_file)}") from None
    name = pick_archive(files, model_file, where)
    try:
        return Path(hf_hub_download(repo_id, name, revision=revision, cache_dir=str(cache)))
    except Exception as exc:
        raise ModelNotAvailableError(
            f"downloading {name} of {repo_id}@{revision} failed ({type(exc).__name__}); try "
            f"again, or {_how_to_get(repo_id, revision, name)}") from None


def resolve_model(model: Union[str, "os.PathLike[str]"], model_file: Optional[str] = None) -> Path:
    """The ``.cact`` file that ``model`` (a file, a folder or a Hugging Face id) names."""
    path = Path(model).expanduser()
    if path.is_file():
        if model_file is not None:
            raise ValueError(f"model_file={model_file!r} picks a file inside a folder or a Hugging "
                             f"Face model, but the model {str(model)!r} is already a file")
        return path
    if path.is_dir():
        return path / pick_archive(_files_under(path), model_file, f"the model folder {path}")
    hub = parse_hub_id(str(model)) if not path.exists() else None
    if hub is None:
        raise FileNotFoundError(f"model archive not found: {model}")
    repo_id, revision = hub
    cache = hub_cache_dir()
    snapshot = cached_snapshot(repo_id, revision, cache)
    if snapshot is not None:
        files = _files_under(snapshot)
        try:
            return snapshot / pick_archive(files, model_file, f"the cached model {repo_id}@{revision}")
        except ModelNotAvailableError:
            has_archives = any(f.endswith(".cact") for f in files)
            if _offline() or (has_archives and model_file is None):
                raise    # archives but no unique choice: downloading more would not help
    if _offline():
        raise ModelNotAvailableError(
            f"{_what(repo_id, revision, model_file)} is not in the Hugging Face cache ({cache}) "
            f"and HF_HUB_OFFLINE is set: unset it to download the model, or "
            f"{_how_to_get(repo_id, revision, model_file)}")
    return _download(repo_id, revision, model_file, cache)

