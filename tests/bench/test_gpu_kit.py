"""The GPU device kit starts on a device-like image: a clean venv, a wheelhouse, no package index.

The venv sees only torch and the packages the GPU image lists that the kit
relies on (the wheelhouse's MANIFEST names them); the kit is installed from
a wheelhouse built for that venv's Python, with ``--no-index``, and
``bench/gpu/run --device cpu --config tiny --quick`` runs every step end to
end (the transcriber's with the tiny speech-to-text model).  What is checked
is that it starts and reports, not how fast anything is.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = pathlib.Path(__file__).resolve().parent.parent.parent
KIT = REPO / "bench" / "gpu"


def image_site(folder: pathlib.Path, names: list[str]) -> pathlib.Path:
    """A folder holding the installed distributions ``names`` and what they require, linked from this
    environment: what the GPU image provides, without installing torch again (a minute of the suite)."""
    folder.mkdir()
    wanted, seen = [canonicalize_name(n) for n in names], set()
    while wanted:
        name = wanted.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # (a requirement of another platform's or an extra's)
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                wanted.append(canonicalize_name(requirement.name))
        tops = {pathlib.PurePath(str(f)).parts[0] for f in dist.files or []}
        for top in tops - {"..", "__pycache__"}:
            target = pathlib.Path(str(dist.locate_file(top)))
            if target.exists() and not (folder / top).exists():
                (folder / top).symlink_to(target)
    assert {"torch", "numpy"} <= seen
    return folder


@pytest.mark.timeout(900)  # (not timing-bound: it runs beside the parallel suite)
def test_the_kit_runs_end_to_end_in_a_clean_venv(tmp_path):
    wheels = tmp_path / "wheels"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run(
        [sys.executable, str(KIT / "wheelhouse"), "--python-version", version, "--dest", str(wheels)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    manifest = json.loads((wheels / "MANIFEST.json").read_text())
    assert manifest["mib"] < 48 and any(w.startswith("pplex_trio-") for w in manifest["wheels"])
    assert {"torch", "numpy"} <= set(manifest["provided_by_the_image"])
    assert not any(w.startswith(("torch-", "numpy-")) for w in manifest["wheels"])

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # The image's packages, as the GPU machine has them: beside the venv, on its path (not installed into it).
    image = image_site(tmp_path / "image", manifest["provided_by_the_image"])
    (venv / "lib" / f"python{version}" / "site-packages" / "_image.pth").write_text(f"{image}\n")
    clean = subprocess.run([str(python), "-c", "import trio"], capture_output=True, timeout=60)
    assert clean.returncode != 0  # the venv really lacks what the kit must bring

    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_NO_INDEX"] = "1"  # no package index, as on the GPU machine
    done = subprocess.run(
        [
            str(python),
            str(KIT / "run"),
            "--device",
            "cpu",
            "--config",
            "tiny",
            "--quick",
            "--wheels",
            str(wheels),
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["result.json", "run.log", "server.log"]
    result = json.loads((out / "result.json").read_text())
    assert {"environment", "equality", "sweep", "transcriber", "prefill", "profile", "server"} <= set(result)
    assert [(c["B"], c["positions"] >= 100) for c in result["prefill"]["cells"]] == [(1, True), (4, True)]
    env_ = result["environment"]
    assert env_["packages"]["trio"] and env_["packages"]["pplex-trio"] and env_["torch"].startswith("2.13")
    equality = result["equality"]
    assert equality["tokens_equal"] and equality["pcm_max_abs_diff"] == 0 and equality["live_frames_compared"] > 50
    assert [(c["B"], c["mode"]) for c in result["sweep"]] == [(1, "eager"), (4, "eager")]
    assert all(0 < c["p50_ms"] <= c["p99_ms"] for c in result["sweep"])
    stt = result["transcriber"]  # the tick without and with the tiny transcriber, side by side
    assert stt["transcriber"] == "tiny-stt" and stt["parameters"] > 0, stt
    cells = stt["cells"]
    assert [(c["B"], c["transcriber"]) for c in cells] == [(1, "off"), (1, "tiny-stt"), (4, "off"), (4, "tiny-stt")]
    assert all(c["mode"] == "eager" and 0 < c["p50_ms"] <= c["p99_ms"] for c in cells), cells
    assert all(c["p50_ratio"] > 0 and c["p99_ratio"] > 0 for c in cells[1::2])
    assert result["profile"]["launches"] > 100 and result["profile"]["attention_kernels"]
    ticks = result["dispatch"]["ticks"]
    assert list(ticks) == ["1", "4"] and all(t["kernels"] > 100 and t["syncs"] == 0 for t in ticks.values())
    server = result["server"]
    assert server["sessions_ok"] == server["clients"] == 4 and server["server_exit_code"] == 0, server
    assert server["errors"] == [] and server["tick_path"] == "eager"  # (auto, off CUDA)
    assert "installed the wheelhouse" in (out / "run.log").read_text()
