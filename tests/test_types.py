"""The package type-checks: pyproject.toml's [tool.mypy] (--strict for protocol/, codec/, engine/ and the
top-level modules, plain mypy for the rest).  A cold run takes some 40 s (torch's stubs), a warm one
(.mypy_cache) a few.  And the types keep a session to its end of a lease: a snippet that calls the engine's
side is refused."""

import pathlib
import subprocess
import sys
import textwrap
import tomllib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


def test_mypy_passes():
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_strict_modules_get_every_flag_of_strict():
    """mypy applies ``strict = true`` in an overrides section to every module, so pyproject spells --strict
    out flag by flag: here, against the flags that this mypy's --strict turns on."""
    from mypy.main import process_options

    def options(*flags: str) -> dict[str, object]:
        _, opts = process_options([*flags, "--config-file", "", "-c", "pass"])
        return {
            name: getattr(opts, name)
            for name in dir(opts)
            if not name.startswith("_") and not callable(getattr(opts, name))
        }

    strict, plain = options("--strict"), options()
    wanted = {name: value for name, value in strict.items() if value != plain[name]}
    mypy = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    (override,) = [o for o in mypy["overrides"] if "pplex_trio.engine.*" in o["module"]]
    given = {name: value for name, value in mypy.items() if name in wanted} | override
    assert {name: given.get(name) for name in wanted} == wanted


def mypy_snippet(code: str) -> subprocess.CompletedProcess[str]:
    """mypy on ``code`` alone (what it imports is read, not reported), its cache beside the package's."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            "",
            "--follow-imports=silent",
            "--ignore-missing-imports",
            "--cache-dir",
            str(REPO / ".mypy_cache" / "snippets"),
            "-c",
            textwrap.dedent(code),
        ],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.parametrize(
    "call",
    [
        "deliver(frame)",
        "drained(0.0)",
        "take_frame(pcm, 0, 0.0)",
        "fail(failure)",
        "assigned(0, 0.0)",
        "given_back(True, None)",
    ],
)
def test_mypy_refuses_a_session_that_calls_the_engine_side_of_its_lease(call):
    """The session's end of a lease (``Lease``) has none of the engine's methods (``EngineLease``'s)."""
    proc = mypy_snippet(f"""
        import numpy as np
        from pplex_trio.engine import Lease, LeaseFailure, OutputFrame

        def session(lease: Lease, frame: OutputFrame, pcm: np.ndarray, failure: LeaseFailure) -> None:
            lease.{call}
    """)
    method = call.split("(")[0]
    assert proc.returncode == 1 and f'error: "Lease" has no attribute "{method}"  [attr-defined]' in proc.stdout, (
        proc.stdout + proc.stderr
    )


def test_mypy_accepts_a_session_that_uses_its_own_end():
    proc = mypy_snippet("""
        import numpy as np
        from pplex_trio.engine import Conversation, EngineActor

        async def session(actor: EngineActor, pcm: np.ndarray) -> None:
            with actor.lease(Conversation()) as lease:
                lease.push_input(pcm, 0.0)
                lease.flush()
                async for batch in lease.frames():
                    print(batch, lease.state, lease.failure, lease.input_stats())
                lease.end(client_left=True)
    """)
    assert proc.returncode == 0, proc.stdout + proc.stderr
