"""deploy/k8s/ and the Dockerfile: parsed and checked against the server they run.

No cluster and no Docker here (these machines reach only the package
registries), so the checks are on what the files say: the fields a load
balancer and Kubernetes need, and container arguments (with the ``--config``
file they name: the ConfigMap's, the one the image copies) that this version of
``pplex-trio serve`` accepts.
"""

from __future__ import annotations

import json
import pathlib
import re

import pytest
import yaml

from pplex_trio._cli import build_parser
from pplex_trio._cli._settings_cli import settings_from_args
from pplex_trio.server import ServerSettings

REPO = pathlib.Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"


def documents() -> dict[str, dict]:
    docs = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            docs[doc["kind"]] = doc
    return docs


@pytest.fixture(scope="module")
def k8s() -> dict[str, dict]:
    return documents()


@pytest.fixture(scope="module")
def container(k8s) -> dict:
    (only,) = k8s["Deployment"]["spec"]["template"]["spec"]["containers"]
    return only


def serve_settings(args: list[str], files: dict[str, pathlib.Path]) -> ServerSettings:
    """What ``pplex-trio ARGS`` would run with (argparse exits on an unknown flag or key).

    ``files``: where the files the arguments name in the image or the pod are here (a ``--config``).
    """
    args = [part for arg in args for part in (arg.split("=", 1) if arg.startswith("--config=") else [arg])]
    args = [str(files.get(arg, arg)) for arg in args]
    parsed = build_parser().parse_args(args)
    assert parsed.command == "serve"
    return settings_from_args(ServerSettings, parsed)


@pytest.fixture(scope="module")
def pod_files(k8s, container, tmp_path_factory) -> dict[str, pathlib.Path]:
    """The ConfigMaps' files, by the path at which the Deployment mounts them, written here."""
    volumes = {volume["name"]: volume for volume in k8s["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    folder = tmp_path_factory.mktemp("pod")
    files = {}
    for mount in container["volumeMounts"]:
        config_map = volumes[mount["name"]].get("configMap")
        if config_map is None:
            continue
        assert config_map["name"] == k8s["ConfigMap"]["metadata"]["name"]
        for name, text in k8s["ConfigMap"]["data"].items():
            (folder / name).write_text(text)
            files[f"{mount['mountPath']}/{name}"] = folder / name
    return files


def test_the_container_arguments_are_flags_this_server_knows(container, pod_files):
    assert any("--config" in arg for arg in container["args"])  # the settings are in the ConfigMap
    settings = serve_settings(container["args"], pod_files)
    assert settings.host == "0.0.0.0" and settings.refuse_busy_upgrades and settings.drain_seconds > 0
    assert settings.device.startswith("cuda") and settings.queue_size == 0


def test_one_gpu_per_pod(container):
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_probes_readiness_on_ready_and_liveness_on_health(container, pod_files):
    port = container["ports"][0]
    assert port["containerPort"] == serve_settings(container["args"], pod_files).port
    for probe, path in (("readinessProbe", "/ready"), ("livenessProbe", "/health"), ("startupProbe", "/health")):
        get = container[probe]["httpGet"]
        assert get["path"] == path and get["port"] in (port["name"], port["containerPort"]), probe
    # A replica that fills up leaves the rotation at the first failed probe, and comes back at the first success.
    assert container["readinessProbe"]["failureThreshold"] == 1
    # The startup probe waits long enough for the weights (minutes), so liveness does not kill a loading pod.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600


def test_the_pre_stop_hook_drains_and_the_grace_period_covers_the_drain(k8s, container, pod_files):
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert "kill -TERM 1" in " ".join(command)  # the server's own drain, started before Kubernetes' SIGTERM
    settings = serve_settings(container["args"], pod_files)
    grace = k8s["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > settings.drain_seconds + settings.shutdown_grace


def test_tokens_come_from_a_secret_never_from_the_manifest(k8s, container):
    env = {item["name"]: item for item in container["env"]}
    for name in ("HF_TOKEN", "PPLEX_TRIO_AUTH_TOKEN"):
        assert "value" not in env[name] and env[name]["valueFrom"]["secretKeyRef"]["name"] == "pplex-trio-secrets"
    text = "\n".join(path.read_text() for path in K8S.glob("*.yaml"))
    assert not re.search(r"hf_[A-Za-z0-9]{20,}", text)  # no Hugging Face token pasted in
    assert "--auth-token" not in text  # a flag would show in `ps` and in the pod spec
    assert "auth-token =" not in k8s["ConfigMap"]["data"]["serve.toml"]  # nor in the ConfigMap (not a Secret)


def test_the_service_selects_the_pods_and_the_ingress_keeps_calls_open(k8s, container):
    deployment, service, ingress = k8s["Deployment"], k8s["Service"], k8s["Ingress"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in (container["ports"][0]["name"], container["ports"][0]["containerPort"])
    notes = ingress["metadata"]["annotations"]
    prefix = "nginx.ingress.kubernetes.io/"
    assert int(notes[prefix + "proxy-read-timeout"]) >= 3600 and int(notes[prefix + "proxy-send-timeout"]) >= 3600
    assert "http_503" in notes[prefix + "proxy-next-upstream"].split()
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"] and backend["port"]["name"] == port["name"]


def dockerfile() -> list[tuple[str, str]]:
    """(instruction, argument) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (REPO / "Dockerfile").read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, argument = line.partition(" ")
            pairs.append((instruction.upper(), argument.strip()))
    return pairs


def test_the_dockerfile_mirrors_the_setup_script():
    steps = dockerfile()
    runs = " ".join(argument for instruction, argument in steps if instruction == "RUN")
    setup = (REPO / ".ci" / "setup").read_text()
    (torch_pin,) = set(re.findall(r'"(torch==[\d.]+)"', setup))
    assert f'"{torch_pin}"' in runs  # the same torch as CI
    assert "libopus0" in runs and "libopus0" in setup  # the fast Opus encoder's library
    assert 'pip install --no-cache-dir ".[webrtc]"' in runs and '-e ".[webrtc]"' in setup  # (with WebRTC, as CI)
    assert steps[0][0] == "FROM" and "bookworm" in steps[0][1]  # Debian 12, like the machines CI runs on


def test_the_image_runs_the_server_as_pid_1_with_flags_it_knows():
    steps = dict(dockerfile())  # the last of each instruction
    entrypoint, command = json.loads(steps["ENTRYPOINT"]), json.loads(steps["CMD"])
    assert entrypoint == ["pplex-trio"]  # exec form: SIGTERM reaches the server, not a shell
    copied = {
        argument.split()[1]: REPO / argument.split()[0]
        for instruction, argument in dockerfile()
        if instruction == "COPY" and len(argument.split()) == 2
    }
    assert copied.get("/etc/pplex-trio/serve.toml") == REPO / "deploy" / "serve.example.toml"
    settings = serve_settings(command, copied)  # the example file, as the image has it
    assert settings.refuse_busy_upgrades and settings.drain_seconds > 0 and settings.host == "0.0.0.0"
    assert steps["EXPOSE"] == str(settings.port)
    assert steps["USER"] != "root"
    assert "HF_TOKEN" not in steps.get("ENV", "")  # the token comes at run time (-e HF_TOKEN), never baked in
    probe = json.loads(steps["HEALTHCHECK"].split(" CMD ", 1)[1])  # Docker's liveness: /health, as Kubernetes'
    assert f"127.0.0.1:{settings.port}/health" in probe[-1]
