"""The reference server's own venv (``bench/.venv-reference``), kept apart from ours.

Kyutai's ``moshi==0.2.13`` pins ``torch<2.10``, ``numpy<2.3``,
``aiohttp<3.12``, ``huggingface-hub<1.0`` ... while our venv has torch 2.13,
numpy 2.4 and huggingface_hub 2.x, so the reference gets a venv of its own.

torch is held at our version (``torch==2.13.0``, the CPU wheel this machine
has locally) through a constraints file, so both servers run the same torch
kernels and pip can never swap it.  :func:`ensure` first asks pip to resolve
``moshi==0.2.13`` with all its pins under that constraint; that fails here
(moshi wants ``torch<2.10``, and the only older torch on PyPI is a multi-GB
CUDA build), so it installs moshi ``--no-deps`` plus every other pin moshi
declares, unchanged, except the ones listed in :data:`LEFT_OUT`.
"""

from __future__ import annotations

import logging
import pathlib
import re
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
VENV = REPO / "bench" / ".venv-reference"
TORCH = "torch==2.13.0"
MOSHI = "moshi==0.2.13"

# Requirements of moshi 0.2.13 the reference server does not get, and why.
LEFT_OUT = {
    "torch": "held at our torch==2.13.0 (moshi asks torch<2.10: no CPU wheel of it here)",
    "bitsandbytes": "only for moshi's quantization, which the server does not use",
    "sounddevice": "only for moshi.client's audio devices; moshi.server never imports it",
}

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def requirement_name(requirement: str) -> str:
    """The normalised project name of a PEP 508 requirement string."""
    match = _NAME.match(requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def runtime_requirements(requires: list[str]) -> tuple[list[str], list[str]]:
    """Split moshi's ``Requires-Dist`` into (to install, left out); extras are dropped.

    Kept requirements keep their version pins and lose their environment
    marker (only ``sys_platform == "linux"`` occurs, true here).
    """
    keep, left = [], []
    for requirement in requires:
        spec, _, marker = requirement.partition(";")
        if "extra" in marker:
            continue
        (left if requirement_name(spec) in LEFT_OUT else keep).append(spec.strip())
    return keep, left


def python(venv: pathlib.Path = VENV) -> pathlib.Path:
    return venv / "bin" / "python"


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    logger.info("$ %s", " ".join(cmd))
    return subprocess.run(cmd, check=False, text=True, capture_output=True, **kwargs)


def _check(done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode:
        raise RuntimeError(f"{' '.join(done.args)} failed:\n{done.stderr[-3000:]}")


_PROBE = (
    "import importlib.metadata as m, aiohttp, sphn, torch, moshi.models; "
    "print(m.version('moshi'), torch.__version__, m.version('aiohttp'), m.version('sphn'), m.version('numpy'))"
)


def versions(venv: pathlib.Path = VENV) -> str | None:
    """``moshi torch aiohttp sphn numpy`` versions if the venv can run the reference, else None."""
    if not python(venv).exists():
        return None
    done = subprocess.run([str(python(venv)), "-c", _PROBE], check=False, text=True, capture_output=True)
    return done.stdout.strip() if done.returncode == 0 else None


def ensure(venv: pathlib.Path = VENV) -> str:
    """Create ``venv`` with moshi 0.2.13's server if it is missing or broken; return its versions."""
    found = versions(venv)
    if found is not None:
        return found
    logger.info("creating the reference venv %s (a few minutes)", venv)
    _check(_run([sys.executable, "-m", "venv", "--clear", str(venv)]))
    pip = [str(python(venv)), "-m", "pip", "install", "--quiet"]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="torch-constraint-") as constraint:
        constraint.write(TORCH + "\n")
        constraint.flush()
        pinned = ["-c", constraint.name]
        _check(_run([*pip, TORCH, *pinned]))
        trial = _run([str(python(venv)), "-m", "pip", "install", "--dry-run", MOSHI, *pinned])
        if trial.returncode == 0:
            logger.info("%s resolves with all its pins under %s", MOSHI, TORCH)
            _check(_run([*pip, MOSHI, *pinned]))
        else:
            conflict = [
                line.strip()
                for line in trial.stdout.splitlines() + trial.stderr.splitlines()
                if "depends on" in line or "(constraint)" in line
            ]
            logger.info("%s does not resolve under %s: %s", MOSHI, TORCH, "; ".join(conflict) or trial.stderr[-500:])
            _check(_run([*pip, "--no-deps", MOSHI]))
            done = _run(
                [str(python(venv)), "-c", "import importlib.metadata as m; print('\\n'.join(m.requires('moshi')))"]
            )
            _check(done)
            keep, left = runtime_requirements(done.stdout.splitlines())
            for requirement in left:
                logger.info("left out %s: %s", requirement, LEFT_OUT[requirement_name(requirement)])
            _check(_run([*pip, *keep, *pinned]))
    found = versions(venv)
    if found is None:
        raise RuntimeError(f"{venv} was set up but cannot import moshi's server dependencies")
    return found
