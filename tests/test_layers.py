"""Layers import only downward (docs/ARCHITECTURE.md): the contracts, and what a fresh import loads."""

import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


def test_import_contracts_hold():
    """pyproject.toml's import-linter contracts: layers, sans-IO protocol and codec, no cycles."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, importlinter.cli as c; "
            "sys.exit(c.lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "BROKEN" not in proc.stdout and "KEPT" in proc.stdout


def loaded_by(module: str) -> set[str]:
    """The top-level packages a fresh interpreter has loaded after ``import module``."""
    code = f"import sys, json, {module}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout))


@pytest.mark.parametrize("module", ["pplex_trio.protocol", "pplex_trio.codec"])
def test_the_sans_io_layers_load_neither_trio_nor_torch_nor_metrics(module):
    loaded = loaded_by(module)
    assert not loaded & {"trio", "torch", "prometheus_client", "quart", "hypercorn"}, loaded


def test_the_engine_actor_and_the_server_do_not_need_torch():
    """An echo server never pays for importing torch; only a real model loads it."""
    for module in ("pplex_trio.engine", "pplex_trio.server", "pplex_trio.client"):
        assert "torch" not in loaded_by(module), module
