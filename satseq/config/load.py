"""Load a run config from YAML plus `--set a.b.c=value` overrides, with errors that name keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from satseq.config.legacy import spell_as_today, today_key
from satseq.config.schema import RunConfig, ServeConfig

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = PACKAGE_ROOT / "configs"
QUICKSTART = CONFIG_DIR / "quickstart.yaml"
SERVE_CONFIG = CONFIG_DIR / "serve.yaml"  # the Ray Serve config of `satseq serve`
TRAIN_CONFIG = "train_config.yaml"  # the resolved config a run writes into its output dir
# `--tools`: the design §5 tool loop, and the prompt that tells the model it may write code
TOOL_OVERRIDES = ("rollout.tools.enabled=true", "data.prompt.tool_prompt=true")


class ConfigError(ValueError):
    """A config file or override is wrong; the message names the file and key path."""


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of sections, got {type(data).__name__}"
        )
    return data


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Set `a.b.c=value` in nested `data`; the value is parsed as YAML (numbers, bools, lists).

    A numeric path part indexes a list, e.g. `team.agents.0.path=/models/a`.
    """
    key_path, sep, raw_value = assignment.partition("=")
    key_path = key_path.strip()
    if not sep or not key_path:
        raise ConfigError(f"override {assignment!r}: expected KEY=VALUE, e.g. trainer.stages=4")
    try:
        value = yaml.safe_load(raw_value) if raw_value.strip() else ""
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or "not valid YAML"
        raise ConfigError(
            f"override {assignment!r}: the value of {key_path} is not valid YAML ({problem}); "
            "values are read as YAML: check the brackets and quotes"
        ) from None
    key_path = today_key(key_path)  # `sat_seq.agents.0.path` is `team.agents.0.path`
    parts = key_path.split(".")
    node: Any = data
    for depth, part in enumerate(parts[:-1]):
        where = ".".join(parts[: depth + 1])
        if isinstance(node, list):
            node = node[_list_index(part, node, where, assignment)]
        else:
            child = node.setdefault(part, {})
            if not isinstance(child, dict | list):
                raise ConfigError(f"override {assignment!r}: {where} is a value, not a section")
            node = child
    last = parts[-1]
    if isinstance(node, list):
        node[_list_index(last, node, key_path, assignment)] = value
    else:
        node[last] = value


def _list_index(part: str, node: list[Any], where: str, assignment: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(f"override {assignment!r}: {where}: index must be 0..{len(node) - 1}")
    return int(part)


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid config"]
    for problem in err.errors():
        key = ".".join(str(p) for p in problem["loc"]) or "(top level)"
        message = problem["msg"]
        if problem["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; `satseq config show` lists every key)"
        elif "input" in problem and problem["type"] not in ("missing", "value_error"):
            message = f"{message} (got {problem['input']!r})"
        lines.append(f"  {key}: {message}")
    return "\n".join(lines)


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> RunConfig:
    """The resolved RunConfig: `path` (default configs/quickstart.yaml), then each override."""
    config_path = Path(path) if path is not None else QUICKSTART
    try:  # today's spelling first, so that an override reaches a key whatever the file called it
        data = spell_as_today(read_yaml(config_path))
    except ValueError as err:
        raise ConfigError(f"{config_path}: {err}") from None
    for assignment in overrides:
        apply_override(data, assignment)
    source = str(config_path) + (" with overrides" if overrides else "")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def run_config_for(
    checkpoint_dir: str | Path, overrides: list[str], tools: bool = False
) -> RunConfig:
    """The config a team was trained with (`<dir>/train_config.yaml`), else the quickstart's,
    then `overrides`: so evaluation and serving prompt, score and run tools as training did.
    `tools` turns the tool loop on whatever the config says (`TOOL_OVERRIDES`, before
    `overrides`). A trained team is served at the length it was trained to: `serve.max_tokens`
    is its `rollout.max_new_tokens` unless chosen (`serve_max_tokens_chosen`)."""
    trained = Path(checkpoint_dir) / TRAIN_CONFIG
    extra = list(TOOL_OVERRIDES) if tools else []
    if not trained.is_file():
        return load_config(QUICKSTART, [*extra, *overrides])
    config = load_config(trained, [*extra, *overrides])
    if serve_max_tokens_chosen(read_yaml(trained), overrides):
        return config
    serve = config.serve.model_copy(update={"max_tokens": config.rollout.max_new_tokens})
    return config.model_copy(update={"serve": serve})


def serve_max_tokens_chosen(trained: dict[str, Any], overrides: list[str]) -> bool:
    """Whether `serve.max_tokens` was chosen: by an override, or by the training config. A
    train_config.yaml holds every key, so there only a value other than the default counts."""
    if any(o.partition("=")[0].strip() == "serve.max_tokens" for o in overrides):
        return True
    serve = trained.get("serve")
    written = serve.get("max_tokens") if isinstance(serve, dict) else None
    return written is not None and written != ServeConfig.model_fields["max_tokens"].default


def dump_config(config: RunConfig) -> str:
    """The resolved config as YAML, every key present, in section order."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
