"""What a retrain trains with: ``retrain.ppo_iterations`` (default a third of the first
run's, as the champion already had those) and ``retrain.rm_epochs`` over the pipeline's."""

from __future__ import annotations

import pytest

from tasks.config.pipeline_config import load_config
from tasks.retrain.round import round_settings
from tests.shared import TEST_CONFIG


@pytest.mark.parametrize(("sets", "iterations"), [
    (["ppo.iterations=60"], 20), (["ppo.iterations=3"], 1), (["ppo.iterations=1"], 1),
    (["ppo.iterations=10"], 3), (["ppo.iterations=60", "retrain.ppo_iterations=60"], 60)])
def test_retrain_ppo_iterations_default_to_a_third_of_the_first_runs(sets, iterations):
    cfg = round_settings(load_config(TEST_CONFIG, sets))
    assert cfg.ppo.iterations == iterations


def test_retrain_rm_epochs_replace_the_reward_models_only_when_set():
    cfg = load_config(TEST_CONFIG, [])
    assert round_settings(cfg).reward.epochs == cfg.reward.epochs
    assert round_settings(load_config(TEST_CONFIG, ["retrain.rm_epochs=0.5"])).reward.epochs \
        == 0.5
