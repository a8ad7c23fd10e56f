"""prefect.yaml at the root: its deployments are the ones `rlhf serve` serves, with the
demo config's resolved values as parameters (kept equal here)."""

from pathlib import Path

import yaml

from flows.serve import labels_trigger, served_parameters
from tasks.config.pipeline_config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_prefect_yaml_parameters_are_the_demo_config():
    doc = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    by_entry = {d["entrypoint"]: d for d in doc["deployments"]}
    assert by_entry["flows/serve.py:rlhf_pipeline_served"]["parameters"] == \
        served_parameters(cfg)
    retrain = by_entry["flows/retrain.py:retrain"]
    assert retrain["parameters"] == {"config": cfg.form_dump()}
    assert retrain["concurrency_limit"]["limit"] == 1
    assert by_entry["flows/collect.py:collect_flow"]["parameters"] == retrain["parameters"]
    assert by_entry["flows/collect.py:label_pull"]["parameters"] == retrain["parameters"]
    assert by_entry["flows/gc.py:gc_flow"]["parameters"] == retrain["parameters"]
    # the retrain deployment's trigger is the one `rlhf serve` gives it
    served = labels_trigger().model_dump(mode="json", exclude_unset=True)
    (trigger,) = retrain["triggers"]
    assert {k: trigger[k] for k in served} == served and trigger["type"] == "event"
    for d in doc["deployments"]:
        path, name = d["entrypoint"].split(":")
        assert f"def {name}(" in (ROOT / path).read_text()
