"""The kind recipe (e2e/kind/run.sh, e2e/kind/cluster-<version>.yaml, e2e/README.md) checked statically: kind, a
Docker engine and a cluster are not available here, so this runs run.sh's dry run and checks every command it
would run against what exists: the runner's and the CLI's parsers, the chart (`helm template`), kind's config
schema and the per-version gate data (dra_sandbox.e2e.kindrecipe)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from dra_driver import cli as driver_cli
from dra_driver.errors import DecodeError
from dra_sandbox import cli as sandbox_cli
from dra_sandbox.e2e import kindrecipe
from dra_sandbox.e2e.kindrecipe import GATES, SUPPORTED_MINORS, Gate, config_path, version_label
from tests.chart.helm import HELM4, MISSING_HINT, Helm

REPO = Path(__file__).resolve().parents[2]
RUN_SH = REPO / "e2e" / "kind" / "run.sh"
# kind.x-k8s.io/v1alpha4 (kubernetes-sigs/kind pkg/apis/config/v1alpha4/types.go): kind refuses unknown fields.
KIND_CLUSTER_FIELDS = {
    "kind", "apiVersion", "name", "nodes", "networking", "featureGates", "runtimeConfig", "kubeadmConfigPatches",
    "kubeadmConfigPatchesJSON6902", "containerdConfigPatches", "containerdConfigPatchesJSON6902",
}
KIND_NODE_FIELDS = {"role", "image", "labels", "extraMounts", "extraPortMappings", "kubeadmConfigPatches",
                    "kubeadmConfigPatchesJSON6902"}
GATE_BY_NAME: dict[str, Gate] = {g.name: g for g in GATES}


@pytest.fixture(scope="module")
def helm() -> Helm:
    if not HELM4.exists():
        pytest.skip(f"{HELM4} is absent: {MISSING_HINT}")
    return Helm(HELM4)


def dry_run(version: str, *extra: str, tool: str = "docker") -> list[list[str]]:
    """The commands run.sh would run (DRY_RUN=1 prints each shell-quoted); progress lines start with `==`."""
    env = {**os.environ, "DRY_RUN": "1", "K8S_VERSION": version, "CONTAINER_TOOL": tool, "TMPDIR": "/tmp"}
    env.pop("KIND_NODE_IMAGE", None)
    proc = subprocess.run(["bash", str(RUN_SH), *extra], capture_output=True, text=True, env=env, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(line) for line in proc.stdout.splitlines() if line and not line.startswith("==")]


def find(commands: list[list[str]], *prefix: str) -> list[list[str]]:
    return [c for c in commands if [Path(c[0]).name, *c[1:len(prefix)]] == list(prefix)]


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("minor", SUPPORTED_MINORS, ids=version_label)
def test_run_sh_builds_creates_loads_installs_and_runs_the_real_runner(minor: int) -> None:
    commands = dry_run(version_label(minor), "--only", "shared-claim")
    names = [Path(c[0]).name for c in commands]
    assert names == ["mkdir", "docker", "docker", "kind", "kind", "helm", "helm", "kubectl", "dra-sandbox"]

    [create] = find(commands, "kind", "create", "cluster")
    assert option(create, "--config") == str(config_path(minor))
    kubeconfig = option(create, "--kubeconfig")
    [build] = find(commands, "docker", "build")
    [save] = find(commands, "docker", "save")
    [load] = find(commands, "kind", "load", "image-archive")
    assert build[-1] == str(REPO) and (REPO / "Dockerfile").is_file()
    assert option(build, "--tag") == save[-1] == "localhost/dra-driver:e2e"
    assert load[3] == option(save, "--output")

    # The last command is the e2e runner that exists (`dra-sandbox e2e`, not `dra-driver e2e`), with flags its
    # parser takes, driving the cluster kind just created; extra arguments are passed on.
    runner = commands[-1]
    assert Path(runner[0]).name == "dra-sandbox" and runner[1] == "e2e"
    args = sandbox_cli.parser().parse_args(runner[1:])
    assert args.kubeconfig == kubeconfig and args.only == ["shared-claim"]


def test_every_dra_command_in_run_sh_parses() -> None:
    """Any `dra-driver` / `dra-sandbox` invocation run.sh makes is a subcommand with flags the CLIs accept."""
    parsers = {"dra-driver": driver_cli.parser, "dra-sandbox": sandbox_cli.parser}
    seen = 0
    for argv in dry_run("1.36"):
        make = parsers.get(Path(argv[0]).name)
        if make is not None:
            make().parse_args(argv[1:])  # SystemExit (argparse's "invalid choice") fails the test
            seen += 1
    assert seen >= 1
    assert "dra-driver e2e" not in RUN_SH.read_text()


def test_podman_builds_with_the_projects_image_script() -> None:
    commands = dry_run("1.35", tool="podman")
    [build] = [c for c in commands if c[:1] == ["env"]]
    assert build[1] == "IMAGE=localhost/dra-driver:e2e" and Path(build[-1]) == REPO / "scripts" / "build-image.sh"
    assert find(commands, "podman", "save")


def test_an_unsupported_version_is_refused_naming_the_supported_ones() -> None:
    env = {**os.environ, "DRY_RUN": "1", "K8S_VERSION": "1.33"}
    proc = subprocess.run(["bash", str(RUN_SH)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 1
    assert "K8S_VERSION=1.33 is not supported" in proc.stderr and "1.34 1.35 1.36 1.37" in proc.stderr


def test_the_helm_settings_render_against_the_chart(helm: Helm) -> None:
    """run.sh's `helm upgrade --install` lines, as `helm template`: every --set names a value the chart takes
    (values.schema.json refuses unknown ones) and lands where run.sh means it to."""
    installs = find(dry_run("1.36"), "helm", "upgrade", "--install")
    assert [i[3] for i in installs] == ["dra-h100", "dra-a100"]
    for argv in installs:
        release, chart = argv[3], argv[4]
        args = ["template", release, chart, "--namespace", option(argv, "--namespace"), "--kube-version", "1.36.0"]
        for i, arg in enumerate(argv):
            if arg in ("--set", "--set-string"):
                args += [arg, argv[i + 1]]
        docs = [d for d in yaml.safe_load_all(helm.run(*args).stdout) if d]
        [daemonset] = [d for d in docs if d["kind"] == "DaemonSet"]
        pod = daemonset["spec"]["template"]["spec"]
        alias = release.removeprefix("dra-")
        assert pod["nodeSelector"] == {"e2e.dra.dev/node": alias}
        assert "affinity" not in pod
        images = {c["image"] for c in pod["containers"]}
        assert images == {"localhost/dra-driver:e2e"}
        assert {c["imagePullPolicy"] for c in pod["containers"]} == {"Never"}
        kinds = {d["kind"] for d in docs}
        assert ("DeviceClass" in kinds) == (alias == "h100")
        assert ("ValidatingWebhookConfiguration" in kinds) == (alias == "h100")


@pytest.mark.parametrize("minor", SUPPORTED_MINORS, ids=version_label)
def test_each_config_is_valid_kind_yaml_with_only_gates_and_apis_its_version_knows(minor: int) -> None:
    config = yaml.safe_load(config_path(minor).read_text())
    assert set(config) <= KIND_CLUSTER_FIELDS
    assert (config["kind"], config["apiVersion"]) == ("Cluster", "kind.x-k8s.io/v1alpha4")
    gates: dict[str, bool] = config["featureGates"]
    for name, value in gates.items():
        gate = GATE_BY_NAME[name]  # a KeyError: a gate the data does not know
        stage = gate.at(minor)
        assert stage is not None, f"{name} does not exist in {version_label(minor)}"
        assert value is True and not (stage.locked and value != stage.default)
        assert stage.stage != "GA", f"{name} is GA in {version_label(minor)}: leave it out"
    # Every gate the driver needs is on where this version knows it: set here, or on by default (GA). (A gate newer
    # than the version is absent: DRADeviceTaintRules split from DRADeviceTaints in 1.35.)
    for gate in GATES:
        stage = gate.at(minor)
        if gate.needed and (stage is not None or gate.stages[0].since <= minor):
            assert stage is not None and (gates.get(gate.name) or (stage.stage == "GA" and stage.default)), gate.name
    for group_version, value in config["runtimeConfig"].items():
        betas = [a for a in kindrecipe.BETA_APIS if a.group_version == group_version]
        alphas = [a for a in kindrecipe.ALPHA_APIS if a.group_version == group_version]
        assert (betas and betas[0].served(minor)) or (alphas and minor in alphas[0].minors), group_version
        assert value == "true"
    nodes = config["nodes"]
    assert [n["role"] for n in nodes] == ["control-plane", "worker", "worker"]
    assert all(set(n) <= KIND_NODE_FIELDS for n in nodes)
    assert [n.get("labels") for n in nodes[1:]] == [{"e2e.dra.dev/node": "h100"}, {"e2e.dra.dev/node": "a100"}]
    assert {n["image"] for n in nodes} == {kindrecipe.NODE_IMAGES[minor].image}
    assert nodes[0]["image"].startswith(f"kindest/node:v1.{minor}.")
    [patch] = config["containerdConfigPatches"]
    assert "enable_cdi = true" in patch and '"/var/run/cdi"' in patch


def test_the_gate_data_holds_the_upstream_facts_that_matter() -> None:
    """A few facts whose loss would break a cluster: a gate set where its version does not know it stops the
    component; the health stream needs ResourceHealthStatus, alpha (off) before 1.36."""
    taint_rules, health, partitionable = (GATE_BY_NAME[n] for n in
                                          ("DRADeviceTaintRules", "ResourceHealthStatus", "DRAPartitionableDevices"))
    assert taint_rules.at(34) is None and taint_rules.at(35) is not None
    assert [health.recipe_value(m) for m in SUPPORTED_MINORS] == [True] * 4
    assert health.at(35) is not None and health.at(35).default is False  # type: ignore[union-attr]
    assert kindrecipe.feature_gates(34)["DRAPartitionableDevices"] is True and partitionable.at(36).default  # type: ignore[union-attr]
    assert "DRAExtendedResource" not in kindrecipe.feature_gates(37)  # GA and locked in 1.37
    betas = {"resource.k8s.io/v1beta1": "true", "resource.k8s.io/v1beta2": "true"}
    # DeviceTaintRule is only in the alpha API before 1.36; later the alpha API stays off.
    assert [kindrecipe.runtime_config(m) for m in SUPPORTED_MINORS] == [
        {**betas, "resource.k8s.io/v1alpha3": "true"}, {**betas, "resource.k8s.io/v1alpha3": "true"}, betas, betas]
    assert [taint_rules.recipe_value(m) for m in SUPPORTED_MINORS] == [None, True, True, None]  # 1.37: GA, on


def test_the_configs_and_the_readme_table_match_the_data() -> None:
    assert kindrecipe.main(["--check"]) == 0
    readme = (REPO / "e2e" / "README.md").read_text()
    assert kindrecipe.render_table() in readme
    header = "| gate | 1.34 | 1.35 | 1.36 | 1.37 | what needs it |"
    assert readme.count(header) == 1


def test_check_reports_a_stale_config(tmp_path: Path) -> None:
    kind_dir = tmp_path / "kind"
    kind_dir.mkdir()
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{kindrecipe.TABLE_BEGIN}\nold\n{kindrecipe.TABLE_END}\n")
    files = kindrecipe.expected_files(kind_dir, readme)
    assert files[readme] == f"x\n{kindrecipe.TABLE_BEGIN}\n{kindrecipe.render_table()}\n{kindrecipe.TABLE_END}\n"
    assert set(files) == {readme, *(config_path(m, kind_dir) for m in SUPPORTED_MINORS)}
    with pytest.raises(ValueError, match="markers"):
        readme.write_text("no markers")
        kindrecipe.expected_files(kind_dir, readme)


def test_a_fact_that_is_off_is_refused_naming_its_field(tmp_path: Path) -> None:
    facts = tmp_path / "kindrecipe.yaml"
    text = kindrecipe.FACTS_FILE.read_text().replace("{since: 32, stage: beta, default: false}",
                                                      "{since: 32, stage: gamma, default: false}")
    facts.write_text(text)
    with pytest.raises(DecodeError, match=r"kindrecipe.yaml.gates\[0\].stages\[1\].stage: must be one of alpha, beta, GA"):
        kindrecipe.load_facts(facts)
    facts.write_text(kindrecipe.FACTS_FILE.read_text().replace("kindVersion: main", "kind: main"))
    with pytest.raises(DecodeError, match=r"nodeImages.37.kind: unknown field"):
        kindrecipe.load_facts(facts)
