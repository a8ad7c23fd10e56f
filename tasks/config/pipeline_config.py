"""The pipeline config: every stage's frozen config composed into one and validated once, from
defaults <- a YAML/JSON file <- ``--set`` overrides. Tasks read their own section and never
write back; derived values are methods, not fields."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from data_checks.config import DataConfig, ValidationConfig, blank_data, blank_data_form
from rlhf_core.config import (
    EvalConfig,
    ModelConfig,
    PPOConfig,
    RewardConfig,
    RewardNormConfig,
    Section,
    SFTConfig,
)
from tasks.config.form import blanks_as_none, draw_form, form_values
from tasks.config.sections import (
    CollectConfig,
    DemoConfig,
    RetrainConfig,
    RoutingConfig,
    TrackingConfig,
)


class PipelineConfig(Section):
    """Everything one pipeline run needs."""

    seed: int = Field(0, description="Seed for every stage (data order, init, sampling).")
    demo: DemoConfig = Field(DemoConfig())
    data: DataConfig | None = Field(None, description="Data sources (every path empty: the "
                                    "demo's data).")
    model: ModelConfig = Field(ModelConfig())
    validation: ValidationConfig = Field(ValidationConfig())
    sft: SFTConfig = Field(SFTConfig())
    reward: RewardConfig = Field(RewardConfig())
    reward_norm: RewardNormConfig = Field(RewardNormConfig())
    ppo: PPOConfig = Field(PPOConfig())
    eval: EvalConfig = Field(EvalConfig())
    tracking: TrackingConfig = Field(TrackingConfig())
    retrain: RetrainConfig = Field(RetrainConfig(), description="Scheduled retraining.")
    collect: CollectConfig = Field(CollectConfig(), description="On-policy collection, labels.")
    routing: RoutingConfig = Field(RoutingConfig(), description="Stages on other machines.")

    def form_dump(self) -> dict[str, Any]:
        """The config as JSON for a deployment's form (the demo's data as empty paths)."""
        dump = form_values(self)
        if self.data is None:
            dump["data"] = blank_data_form()
        return dump

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler) -> dict[str, Any]:
        drawn = handler(schema)
        draw_form(drawn, handler)
        return drawn

    @model_validator(mode="before")
    @classmethod
    def _form_blanks(cls, value: Any) -> Any:
        return blanks_as_none(cls, value)

    @field_validator("data", mode="before")
    @classmethod
    def _demo_when_empty(cls, value: Any) -> Any:
        """Every data path left empty (an untouched form): the demo's data."""
        return None if blank_data(value) else value

    @model_validator(mode="after")
    def _sections_agree(self) -> PipelineConfig:
        """Settings of several sections that only work together."""
        if self.model.nnodes > 1 and self.routing.nodes is None:
            raise ValueError(f"model.nnodes={self.model.nnodes} needs routing.nodes: the "
                             "rlhf-stage deployment that starts the other nodes (e.g. "
                             "rlhf-stage/nodes, served by `rlhf stage-worker` on each of them)")
        for name in ("sft", "ppo"):
            coef = getattr(self, name).ptx_coef
            if coef > 0 and (self.data is None or self.data.pretrain is None):
                raise ValueError(f"{name}.ptx_coef={coef:g} needs pretraining text: set "
                                 "data.pretrain (a .txt file, or a table with a text column)")
        # a reward source cannot also be the held-out checks' or the gate's scorer
        trained = {s.target: s.name for s in self.ppo.reward_sources if s.kind == "registered"}
        for key, scorer in (("ppo.health.scorer", self.ppo.health.scorer),
                            ("retrain.gate.scorer", self.retrain.gate.scorer)):
            if scorer in trained:
                raise ValueError(f"{key}={scorer} is ppo.reward_sources[{trained[scorer]}]: the "
                                 "policy is trained against it, so it would judge its own reward; "
                                 "score with a model the policy never saw (judge_model, the gold "
                                 "judge, another registered model)")
        return self

    def from_scratch_rates(self) -> list[str]:
        """``key=value`` of each learning rate fit for training from scratch while the base is
        pretrained: those fine-tune at about 1e-6 to 5e-5 (README § Sources [N+]), ten times
        that with LoRA, and a rate ten times past that is flagged."""
        if not self.model.base_model:
            return []
        limit = 5e-4 * (10 if self.model.lora is not None else 1)  # a rate from scratch
        rates = {"sft.optim.lr": self.sft.optim.lr, "reward.optim.lr": self.reward.optim.lr,
                 "ppo.optim.lr": self.ppo.optim.lr}
        return [f"{k}={v:g}" for k, v in rates.items() if v >= limit]

    def short_name(self) -> str:
        """model + data + short config hash, e.g. ``pythia-160m-hh-3fa2c1`` (run names)."""
        demo = self.demo.enabled and not self.model.base_model
        model = "demo-gpt2" if demo else Path(self.model.base_model.rstrip("/")).name or "model"
        data = "demo-data" if self.data is None else Path(self.data.preference.path).stem
        return f"{model}-{data}-{self.config_hash()[:6]}"

    def config_hash(self) -> str:
        """Short, stable hash of the resolved config (tag ``rlhf.config_hash``)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'ppo': {'lr': 1}} -> {'ppo.lr': 1} (MLflow params)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out

class ConfigError(ValueError):
    """A config file or override that does not validate; the message names each field."""


def parse_override(item: str) -> tuple[str, Any]:
    """'ppo.kl_coef=0.1' -> ('ppo.kl_coef', 0.1); the value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value")
    key, raw = item.split("=", 1)
    return key.strip(), yaml.safe_load(raw) if raw.strip() else ""


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key named twice in a mapping (the later would win)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, str | int | float | bool) and key in seen:
                raise ConfigError(f"key '{key}' appears twice in one section, on lines "
                                  f"{seen[key]} and {line}: keep one of them")
            seen.setdefault(key, line)
        return super().construct_mapping(node, deep)


def read_config_file(path: Path) -> Any:
    """The parsed YAML/JSON file; ConfigError when it cannot be read or parsed."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = err.object.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{path}: not a text config file (byte 0x{err.object[err.start]:02x} "
                          f"on line {line} is not UTF-8); give a YAML or JSON file") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read the config file ({err.strerror})") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader) or {}
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML/JSON ({err})") from None


def load_config(path: str | Path | None = None, overrides: list[str] | tuple = (),
                base: dict[str, Any] | None = None) -> PipelineConfig:
    """Defaults (``base``) <- file <- overrides, validated; ConfigError names bad fields."""
    tree: dict[str, Any] = dict(base or {})
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: config file not found")
        loaded = read_config_file(p)
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: expected a mapping at the top level")
        tree = _merge(tree, loaded)
    given: dict[str, str] = {}
    for item in overrides:
        key, value = parse_override(item)
        *sections, last = key.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: '{section}' is not a section")
        node[last] = value
        given[key] = item
    try:
        return PipelineConfig.model_validate(tree)
    except ValidationError as err:  # one line per bad field, naming its --set, else the file
        lines, from_file = [], False
        for e in err.errors():
            field = ".".join(str(x) for x in e["loc"])
            source = next((item for key, item in given.items()
                           if field == key or field.startswith(key + ".")), None)
            from_file |= source is None
            lines.append(f"  {field}: {e['msg']}" + (f" (from --set {source})" if source else ""))
        where = f" in {path}" if path and from_file else " (--set)" if not from_file else ""
        raise ConfigError(f"invalid config{where}:\n" + "\n".join(lines)) from None


def parse_grid(items: list[str] | tuple = ()) -> dict[str, list]:
    """['ppo.kl_coef=0.02,0.05'] -> {'ppo.kl_coef': [0.02, 0.05]} (each value parsed as YAML)."""
    grid: dict[str, list] = {}
    for item in items:
        key, raw = parse_override(item)
        values = [yaml.safe_load(v) for v in str(raw).split(",") if v.strip()] \
            if isinstance(raw, str) else [raw]
        if not values:
            raise ConfigError(f"--grid {item!r}: no values")
        grid[key] = values
    return grid


def grid_points(base: PipelineConfig, grid: dict[str, list], seeds: list[int]
                ) -> list[tuple[dict[str, Any], PipelineConfig]]:
    """One (overrides, validated config) per grid point x seed, all checked before any run.
    Only ppo.*, eval.* and the seed may vary: the points share the earlier stages."""
    for key in grid:
        if not key.startswith(("ppo.", "eval.")):
            raise ConfigError(f"--grid {key}: a sweep shares validate, sft, reward_model and "
                              f"reward_norm between points, so only ppo.* and eval.* may vary")
    if not seeds:
        raise ConfigError("--seeds: a sweep needs at least one seed")
    points = []
    for combo in itertools.product(*grid.values()):
        for seed in seeds:
            overrides = {**dict(zip(grid, combo)), "seed": seed}
            items = [f"{k}={json.dumps(v)}" for k, v in overrides.items()]
            try:
                cfg = load_config(None, items, base.model_dump(mode="json"))
            except ConfigError as err:
                raise ConfigError(f"sweep point {', '.join(items)}: {err}") from None
            points.append((overrides, cfg))
    return points
