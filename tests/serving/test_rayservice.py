"""configs/serve.yaml and configs/serve_sat_seq.yaml are valid Ray Serve configs, and
deploy/rayservice.yaml carries the second (tests/deploy/test_manifests.py: it serves the team
deploy/rayjob.yaml trains)."""

import yaml
from ray.serve.schema import ServeDeploySchema

from satseq.serving.app import SERVE_CONFIG, deployment_options, read_serve_config
from satseq.serving.rayservice import RAYSERVICE, SERVED_TEAM_CONFIG, render


def test_serve_yaml_is_a_ray_serve_config_for_the_quickstart_team():
    spec = yaml.safe_load(SERVE_CONFIG.read_text())
    ServeDeploySchema.model_validate(spec)  # what `serve deploy` and KubeRay accept
    application = read_serve_config()
    assert application["import_path"] == "satseq.serving.app:build_app"
    options = deployment_options(application)
    assert sorted(options) == ["TeamIngress", "agent_a0", "agent_a1", "agent_a2"]
    assert options["agent_a0"]["autoscaling_config"]["max_replicas"] >= 1


def test_the_served_team_config_is_a_ray_serve_config():
    ServeDeploySchema.model_validate(yaml.safe_load(SERVED_TEAM_CONFIG.read_text()))
    application = read_serve_config(SERVED_TEAM_CONFIG)
    assert application["import_path"] == "satseq.serving.app:build_app"


def test_rayservice_is_generated_from_the_served_team_config():
    manifest = yaml.safe_load(RAYSERVICE.read_text())
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayService")
    serve_config = manifest["spec"]["serveConfigV2"]
    assert serve_config == SERVED_TEAM_CONFIG.read_text()  # verbatim, comments included
    # and up to date: regenerate with `python -m satseq.serving.rayservice`
    assert RAYSERVICE.read_text() == render()
