"""The package type-checks: pyproject.toml's [tool.mypy] (--strict for protocol/, codec/, engine/ and the
top-level modules, plain mypy for the rest).  A cold run takes some 40 s (torch's stubs), a warm one
(.mypy_cache) a few."""

import pathlib
import subprocess
import sys
import tomllib

REPO = pathlib.Path(__file__).resolve().parent.parent


def test_mypy_passes():
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "pyproject.toml"],
                          cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_strict_modules_get_every_flag_of_strict():
    """mypy applies ``strict = true`` in an overrides section to every module, so pyproject spells --strict
    out flag by flag: here, against the flags that this mypy's --strict turns on."""
    from mypy.main import process_options

    def options(*flags: str) -> dict[str, object]:
        _, opts = process_options([*flags, "--config-file", "", "-c", "pass"])
        return {name: getattr(opts, name) for name in dir(opts)
                if not name.startswith("_") and not callable(getattr(opts, name))}

    strict, plain = options("--strict"), options()
    wanted = {name: value for name, value in strict.items() if value != plain[name]}
    mypy = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    (override,) = [o for o in mypy["overrides"] if "pplex_trio.engine.*" in o["module"]]
    given = {name: value for name, value in mypy.items() if name in wanted} | override
    assert {name: given.get(name) for name in wanted} == wanted
