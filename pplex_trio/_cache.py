"""pplex-trio's cache folder, and archives extracted into it once.

Voice prompts (``voices.tgz``) and the official web client (``dist.tgz``)
come as archives; each is extracted once, into a folder named after the
archive's content hash, written beside and renamed into place so that two
processes starting together do not clash.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where pplex-trio keeps generated and extracted files (``$PPLEX_TRIO_CACHE`` overrides)."""
    if os.environ.get("PPLEX_TRIO_CACHE"):
        return Path(os.environ["PPLEX_TRIO_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pplex-trio"


def extract_once(archive: Path, root: Path, prefix: str) -> Path:
    """Extract the ``.tgz`` ``archive`` under ``root`` unless already done; return the folder.

    Only safe members are extracted (no absolute paths, no ``..``, no links
    out of the folder: tarfile's "data" filter).
    """
    digest = hashlib.sha256()
    with open(archive, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    target = root / f"{prefix}-{digest.hexdigest()[:16]}"
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{prefix}-"))
    logger.info("extracting %s to %s", archive, target)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:  # pragma: no cover - Python without extraction filters
                tar.extractall(tmp)
        tmp.rename(target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.is_dir():  # not just another process winning the race
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
