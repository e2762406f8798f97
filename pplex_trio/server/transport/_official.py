"""The official PersonaPlex web client at ``/official/``, from the local Hugging Face cache.

The official server downloads ``dist.tgz`` from the model repository and
serves it at ``/``.  We never download anything for it: if the archive is
already in the local cache (``huggingface_hub.try_to_load_from_cache``, no
network), it is extracted once into pplex-trio's cache folder and served at
``/official/``, beside our own UI at ``/``.

That client is a Vite build for the site root: its bundle loads
``/assets/…`` by absolute path, and its router only knows the path ``/``.
So the app serves ``/assets/…`` from the official build when our own UI has
no such file, and the official ``index.html`` first moves the address bar to
``/?official`` (which serves the same page again on reload), where the
client's router finds its one route.
"""

from __future__ import annotations

import logging
import pathlib
import tarfile

from ..._cache import cache_dir, extract_once
from ..._sources import DEFAULT_REPO, is_repo_id

logger = logging.getLogger(__name__)

ARCHIVE = "dist.tgz"
ROOT_QUERY = "official"  # /?official serves the official client's index too

_ROUTER_FIX = (
    "<script>/* pplex-trio: the official client's router expects the site root */"
    f'history.replaceState(history.state, "", "/?{ROOT_QUERY}" + location.hash);</script>'
)


def repo_for_model(model: str) -> str:
    """The repository whose ``dist.tgz`` to look for: ``--model`` if it is a repo id."""
    return model if is_repo_id(model) else DEFAULT_REPO


def find_official_client(
    model: str, *, hub_cache: str | pathlib.Path | None = None, cache: pathlib.Path | None = None
) -> pathlib.Path | None:
    """The folder of the extracted official client, or None if its archive is not cached.

    Never touches the network.  A broken archive is logged and ignored: the
    official client is a convenience, not a reason to refuse to start.
    """
    from huggingface_hub import try_to_load_from_cache

    repo = repo_for_model(model)
    path = try_to_load_from_cache(repo, ARCHIVE, cache_dir=hub_cache)
    if not isinstance(path, str):
        logger.debug("no %s of %s in the local Hugging Face cache: /official/ is off", ARCHIVE, repo)
        return None
    try:
        folder = _extract(pathlib.Path(path), cache or cache_dir())
    except (OSError, tarfile.TarError, ValueError) as exc:
        logger.warning("cannot use the official client from %s (%s): /official/ is off", path, exc)
        return None
    logger.info("serving the official web client of %s at /official/", repo)
    return folder


def _extract(archive: pathlib.Path, root: pathlib.Path) -> pathlib.Path:
    """Extract the archive once; return the folder holding index.html."""
    target = extract_once(archive, root, "official-client")
    # The official archive holds dist/; accept a bare build too.
    for folder in (target / "dist", target):
        if (folder / "index.html").is_file():
            return folder
    raise ValueError(f"{archive} has no index.html (expected dist/index.html)")


def official_index(folder: pathlib.Path) -> str:
    """The official ``index.html``, with the router fix as the first thing in ``<head>``."""
    html = (folder / "index.html").read_text(encoding="utf-8")
    lower = html.lower()
    at = lower.find("<head>")
    if at < 0:
        return _ROUTER_FIX + html
    at += len("<head>")
    return html[:at] + _ROUTER_FIX + html[at:]
