"""Every YAML under deploy/ parses, uses KubeRay's API (`ray.io/v1`), has its required fields,
and references only commands, config files, volumes and claims that exist. Generic over the
files, so a manifest added later (deploy/rayservice.yaml) is checked the same way."""

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from satseq.config import RunConfig, load_config
from satseq.config.load import SERVE_CONFIG
from satseq.serving.app import AGENT_PREFIX, INGRESS, LORA_BASE_PREFIX
from satseq.serving.rayservice import render
from tests.deploy.observed_run import REPO
from tests.deploy.satseq_cli import NotInCli, parse_satseq_command

DEPLOY = REPO / "deploy"
RAY_KINDS = {"RayJob", "RayService", "RayCluster"}
# Fields each kind needs (dotted paths under the document); a new kind must be listed here.
REQUIRED = {
    "RayJob": ["spec.entrypoint", "spec.rayClusterSpec"],
    "RayService": ["spec.serveConfigV2", "spec.rayClusterConfig"],
    "RayCluster": ["spec.headGroupSpec"],
    "ConfigMap": ["data"],
    "PersistentVolumeClaim": ["spec.accessModes", "spec.resources.requests.storage"],
    "Service": ["spec.ports"],
    "PodMonitor": ["spec.selector", "spec.podMetricsEndpoints"],
    "ServiceMonitor": ["spec.selector", "spec.endpoints"],
}
REPO_PATH = re.compile(r"\b(?:configs|scripts|deploy)/[\w./-]+\.(?:ya?ml|sh|json)\b")


def manifest_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def all_objects() -> list[tuple[Path, dict[str, Any]]]:
    """Every Kubernetes object under deploy/ (documents with a `kind`)."""
    return [(p, doc) for p in manifest_files() for doc in documents(p) if "kind" in doc]


def objects_of(*kinds: str) -> list[tuple[Path, dict[str, Any]]]:
    return [(p, doc) for p, doc in all_objects() if doc["kind"] in kinds]


def field(doc: dict[str, Any], dotted: str) -> Any:
    node: Any = doc
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


CLUSTER_FIELD = {"RayJob": "rayClusterSpec", "RayService": "rayClusterConfig"}


def ray_cluster_spec(doc: dict[str, Any]) -> dict[str, Any]:
    """The RayCluster spec of a RayCluster, RayJob or RayService (KubeRay names it per kind)."""
    return doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"][CLUSTER_FIELD[doc["kind"]]]


def pod_groups(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(group name, rayStartParams, pod spec) of the head and every worker group."""
    cluster = ray_cluster_spec(doc)
    head = cluster["headGroupSpec"]
    groups = [("head", head.get("rayStartParams", {}), head["template"]["spec"])]
    for worker in cluster.get("workerGroupSpecs", []):
        groups.append(
            (worker["groupName"], worker.get("rayStartParams", {}), worker["template"]["spec"])
        )
    return groups


def cpu_cores(quantity: str | int | float) -> float:
    text = str(quantity)
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def names_of(kind: str) -> set[str]:
    return {doc["metadata"]["name"] for _, doc in objects_of(kind)}


# --- parsing and API versions -------------------------------------------------------------------


def test_deploy_has_the_training_manifests():
    kinds = {doc["kind"] for _, doc in all_objects()}
    assert {"RayJob", "ConfigMap", "PersistentVolumeClaim", "PodMonitor"} <= kinds


@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_manifest_parses_into_known_documents(path):
    docs = documents(path)
    assert docs, f"{path}: no YAML documents"
    for doc in docs:
        assert isinstance(doc, dict), f"{path}: a document is not a mapping"
        if "kind" in doc:
            assert doc["kind"] in REQUIRED, f"{path}: add {doc['kind']}'s fields to REQUIRED"
            assert doc.get("apiVersion"), f"{path}: {doc['kind']} without apiVersion"
            assert doc.get("metadata", {}).get("name"), f"{path}: {doc['kind']} without a name"
        else:  # a plain Prometheus config
            jobs = doc["scrape_configs"]
            assert jobs and all(job["job_name"] for job in jobs), path


def test_ray_kinds_are_kuberays_v1():
    for path, doc in all_objects():
        if doc["kind"] in RAY_KINDS or doc["apiVersion"].startswith("ray.io/"):
            assert doc["kind"] in RAY_KINDS, f"{path}: {doc['kind']} is not a KubeRay kind"
            assert doc["apiVersion"] == "ray.io/v1", f"{path}: {doc['kind']} {doc['apiVersion']}"


def test_required_fields_are_present():
    for path, doc in all_objects():
        for dotted in REQUIRED[doc["kind"]]:
            try:
                value = field(doc, dotted)
            except KeyError:
                pytest.fail(f"{path}: {doc['kind']} {doc['metadata']['name']} lacks {dotted}")
            assert value not in (None, "", [], {}), f"{path}: {dotted} is empty"


# --- Ray clusters -------------------------------------------------------------------------------


def test_ray_pods_have_images_and_resources_and_consistent_metrics_ports():
    for path, doc in objects_of(*RAY_KINDS):
        for group, start_params, pod in pod_groups(doc):
            where = f"{path}: {doc['metadata']['name']} group {group}"
            assert pod["containers"], where
            for container in pod["containers"]:
                assert container.get("image"), f"{where}: no image"
                limits = container.get("resources", {}).get("limits", {})
                assert {"cpu", "memory"} <= set(limits), f"{where}: no cpu/memory limits"
                ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
                if "metrics" in ports and "metrics-export-port" in start_params:
                    assert ports["metrics"] == int(start_params["metrics-export-port"]), where


def test_worker_groups_have_consistent_replicas():
    for path, doc in objects_of(*RAY_KINDS):
        for worker in ray_cluster_spec(doc).get("workerGroupSpecs", []):
            low = worker.get("minReplicas", worker["replicas"])
            high = worker.get("maxReplicas", worker["replicas"])
            assert low <= worker["replicas"] <= high, f"{path}: {worker['groupName']}"


def test_volume_mounts_config_maps_and_claims_resolve():
    config_maps, claims = names_of("ConfigMap"), names_of("PersistentVolumeClaim")
    for path, doc in objects_of(*RAY_KINDS):
        for group, _, pod in pod_groups(doc):
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for container in pod["containers"]:
                for mount in container.get("volumeMounts", []):
                    assert mount["name"] in volumes, f"{path}: {group}: no volume {mount['name']}"
            for volume in volumes.values():
                if "configMap" in volume:
                    assert volume["configMap"]["name"] in config_maps, f"{path}: {volume}"
                if "persistentVolumeClaim" in volume:
                    claim = volume["persistentVolumeClaim"]["claimName"]
                    assert claim in claims, f"{path}: {group}: no PersistentVolumeClaim {claim}"


# --- what the manifests run ---------------------------------------------------------------------


def satseq_commands() -> list[tuple[Path, dict[str, Any], str | list[str]]]:
    """(file, Ray object, command) for every satseq command a Ray manifest runs."""
    found = []
    for path, doc in objects_of(*RAY_KINDS):
        if doc["kind"] == "RayJob":
            found.append((path, doc, doc["spec"]["entrypoint"]))
        for _, _, pod in pod_groups(doc):
            for container in pod["containers"]:
                argv = [*container.get("command", []), *container.get("args", [])]
                if argv and argv[0] == "satseq":
                    found.append((path, doc, argv))
    return found


def train_commands() -> list[tuple[Path, dict[str, Any], dict[str, Any]]]:
    """(file, Ray object, parsed parameters) of every `satseq train` a manifest runs."""
    found = []
    for path, doc, command in satseq_commands():
        name, params = parse_satseq_command(command)
        if name == "satseq train":
            found.append((path, doc, params))
    assert found, "no Ray manifest runs `satseq train`"
    return found


def mounted_file(pod: dict[str, Any], file_path: Path) -> tuple[str, str] | None:
    """(volume kind, source) of the mount serving `file_path` in the pod's first container."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in pod["containers"][0].get("volumeMounts", []):
        root = Path(mount["mountPath"])
        if file_path.is_relative_to(root):
            volume = volumes[mount["name"]]
            relative = str(file_path.relative_to(root))
            if "configMap" in volume:
                return "configMap", f"{volume['configMap']['name']}/{relative}"
            if "persistentVolumeClaim" in volume:
                return "claim", volume["persistentVolumeClaim"]["claimName"]
    return None


def test_every_satseq_command_exists_in_the_cli():
    commands = satseq_commands()
    assert commands, "no manifest runs satseq"
    for path, _, command in commands:
        try:
            parse_satseq_command(command)
        except NotInCli as err:
            pytest.fail(f"{path}: {err}")


def test_training_config_comes_from_a_config_map_that_matches_configs():
    """`satseq train /config/<x>.yaml` reads a ConfigMap key that is configs/<x>.yaml verbatim."""
    config_maps = {doc["metadata"]["name"]: doc for _, doc in objects_of("ConfigMap")}
    for path, doc, params in train_commands():
        _, _, head_pod = pod_groups(doc)[0]  # the entrypoint runs on the head
        served = mounted_file(head_pod, params["config"])
        assert served and served[0] == "configMap", f"{path}: {params['config']} is not mounted"
        map_name, key = served[1].split("/", 1)
        shipped = REPO / "configs" / key
        assert shipped.is_file(), f"{path}: ConfigMap key {key} is not a file in configs/"
        assert config_maps[map_name]["data"][key] == shipped.read_text(), (
            f"{path}: ConfigMap {map_name} key {key} differs from configs/{key}; copy it again"
        )
        load_config(shipped)  # and it is a valid run config


def test_training_outputs_go_to_a_claim_mounted_in_every_pod():
    for path, doc, params in train_commands():
        assert params["output_dir"], f"{path}: give --output-dir on the claim"
        for group, _, pod in pod_groups(doc):
            served = mounted_file(pod, params["output_dir"])
            assert served and served[0] == "claim", f"{path}: {group} cannot write the outputs"


def test_gpu_workers_can_hold_the_configs_placement_group():
    """The RayJob's worker pods fit the learners' and rollout actors' bundles of its config."""
    for path, doc, params in train_commands():
        _, key = mounted_file(pod_groups(doc)[0][2], params["config"])[1].split("/", 1)
        config = load_config(REPO / "configs" / key)
        bundles = [config.trainer.resources] * len(config.team.agents) + [
            config.rollout.resources
        ] * config.rollout.num_actors
        workers = [
            (worker["replicas"], worker["template"]["spec"]["containers"][0]["resources"])
            for worker in ray_cluster_spec(doc)["workerGroupSpecs"]
        ]
        cluster_gpus = sum(n * int(r["limits"].get("nvidia.com/gpu", 0)) for n, r in workers)
        assert cluster_gpus >= sum(b.num_gpus for b in bundles), f"{path}: too few GPUs"
        largest_pod_cpus = max(cpu_cores(r["limits"]["cpu"]) for _, r in workers)
        assert max(b.num_cpus for b in bundles) <= largest_pod_cpus, f"{path}: a bundle won't fit"


def test_every_repository_path_a_manifest_names_exists():
    for path in manifest_files():
        for named in REPO_PATH.findall(path.read_text()):
            assert (REPO / named).exists(), f"{path}: names {named}, which is not in the repo"


def test_serve_applications_import_from_the_repo():
    """RayService: every application's import_path is a module of this repository."""
    for path, doc in objects_of("RayService"):
        serve_config = yaml.safe_load(doc["spec"]["serveConfigV2"])
        for application in serve_config["applications"]:
            target = application["import_path"]  # module:attribute or module.attribute
            module = target.partition(":")[0] if ":" in target else target.rpartition(".")[0]
            as_file = REPO / (module.replace(".", "/") + ".py")
            as_package = REPO / module.replace(".", "/") / "__init__.py"
            assert as_file.is_file() or as_package.is_file(), f"{path}: {application}"


# --- the RayService serves what the RayJob trains -----------------------------------------------


def claim_location(pod: dict[str, Any], path: Path) -> tuple[str, Path] | None:
    """(claim name, path inside the claim) of `path` as the pod's first container sees it."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in pod["containers"][0].get("volumeMounts", []):
        root = Path(mount["mountPath"])
        claim = volumes[mount["name"]].get("persistentVolumeClaim")
        if claim and path.is_relative_to(root):
            inside = Path(mount.get("subPath", "")) / path.relative_to(root)
            return claim["claimName"], inside
    return None


def served_deployments(config: RunConfig) -> set[str]:
    """The deployments the Serve app makes for the team `config` trains: `agent_<name>` for a
    full model, `lora_base_<k>` for the LoRA agents on the k-th base (`serving.app`)."""
    names, lora_bases = {INGRESS}, []
    for i, agent in enumerate(config.team.agents):
        if config.agent_lora(i) is None:
            names.add(AGENT_PREFIX + agent.name)
        elif agent.path not in lora_bases:
            lora_bases.append(agent.path)
    return names | {f"{LORA_BASE_PREFIX}{k}" for k in range(len(lora_bases))}


def serving_disagreements(job: dict[str, Any], service: dict[str, Any]) -> list[str]:
    """How `service` (a RayService) fails to serve what `job` (a RayJob) trains: where the
    team is (claim and path, as every pod of each sees it), and the agents' deployments."""
    name, params = parse_satseq_command(job["spec"]["entrypoint"])
    assert name == "satseq train" and params["output_dir"], "the RayJob must train to a claim"
    head_pod = pod_groups(job)[0][2]
    _, config_key = mounted_file(head_pod, params["config"])[1].split("/", 1)
    config = load_config(REPO / "configs" / config_key)  # the config the job trains
    trained_at = {claim_location(pod, params["output_dir"]) for _, _, pod in pod_groups(job)}
    assert len(trained_at) == 1 and None not in trained_at, f"the job's pods see {trained_at}"
    [trained] = trained_at
    found = []
    for application in yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]:
        served_dir = Path(application["args"]["checkpoint_dir"])
        for group, _, pod in pod_groups(service):
            served = claim_location(pod, served_dir)
            if served != trained:
                found.append(
                    f"{group} pods serve {served_dir} = {served} (claim, path), but the job "
                    f"trains {params['output_dir']} = {trained}"
                )
        deployments = {deployment["name"] for deployment in application["deployments"]}
        if deployments != served_deployments(config):
            found.append(
                f"deployments {sorted(deployments)}, but the team of configs/{config_key} makes "
                f"{sorted(served_deployments(config))}"
            )
    return found


def test_the_rayservice_serves_the_team_the_rayjob_trains():
    [(_, job)] = objects_of("RayJob")
    services = objects_of("RayService")
    assert services, "no RayService under deploy/"
    for path, service in services:
        disagreements = serving_disagreements(job, service)
        assert not disagreements, f"{path}: " + "; ".join(disagreements)


def test_a_rayservice_of_another_team_is_caught():
    """The RayService of the quickstart team (configs/serve.yaml: /outputs/quickstart, a0-a2)
    does not serve the RayJob's team, and the check says where."""
    [(_, job)] = objects_of("RayJob")
    quickstart_service = yaml.safe_load(render(SERVE_CONFIG))
    disagreements = serving_disagreements(job, quickstart_service)
    assert len(disagreements) == 1 + len(pod_groups(quickstart_service))
    assert "serve /outputs/quickstart" in disagreements[0]
    assert "'agent_a0'" in disagreements[-1] and "'agent_solver_a'" in disagreements[-1]


def test_the_rayservices_workers_hold_its_smallest_team():
    """Every deployment's minimum replicas fit the worker pods (GPUs, and CPUs per replica)."""
    for path, service in objects_of("RayService"):
        workers = [
            (worker["replicas"], worker["template"]["spec"]["containers"][0]["resources"])
            for worker in ray_cluster_spec(service)["workerGroupSpecs"]
        ]
        gpus = sum(n * int(r["limits"].get("nvidia.com/gpu", 0)) for n, r in workers)
        largest_pod_cpus = max(cpu_cores(r["limits"]["cpu"]) for _, r in workers)
        serve_config = yaml.safe_load(service["spec"]["serveConfigV2"])
        needed_gpus = 0
        for deployment in serve_config["applications"][0]["deployments"]:
            options = deployment.get("ray_actor_options", {})
            scaling = deployment.get("autoscaling_config", {})
            replicas = scaling.get("min_replicas", deployment.get("num_replicas", 1))
            needed_gpus += replicas * options.get("num_gpus", 0)
            assert options.get("num_cpus", 1) <= largest_pod_cpus, f"{path}: {deployment['name']}"
        assert needed_gpus <= gpus, f"{path}: {needed_gpus} GPUs needed, the workers have {gpus}"
