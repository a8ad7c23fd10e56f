"""Learning regression (full lane): a reduced demo, seeded, must still make the PPO policy
better than the SFT policy by the gold judge, so a change that silently stops learning fails
CI. Thresholds sit well below the measured figures (see REDUCED) to absorb platform noise."""

import pytest

from flows.config import load_config
from tests.shared import ROOT

# The demo's data, SFT and reward model, half its PPO iterations, half its evaluation prompts
# (about a minute on 2 idle CPU cores). In the full demo (seed 0) the rollouts' judge score
# rose from -3.16 to about -1.4 by iteration 30 and ended with a win rate of 0.795 over SFT
# (README, "What the demo does"); this reduced run itself measured a judge gain of 2.5 and a
# win rate of 0.914 (2026-11-23); the thresholds below leave a wide margin under that.
REDUCED = ["ppo.iterations=30", "eval.num_prompts=128", "tracking.register_models=false",
           "tracking.system_metrics=false", "tracking.progress=false"]
MIN_JUDGE_GAIN = 0.5  # judge points, policy over SFT
MIN_WIN_RATE = 0.6


@pytest.fixture(scope="module")
def reduced_demo(tmp_path_factory, prefect_api):
    from flows.pipeline import rlhf_pipeline

    tmp = tmp_path_factory.mktemp("learning")
    cfg = load_config(ROOT / "configs" / "demo.yaml",
                      [f"tracking.tracking_uri=sqlite:///{tmp}/mlflow.db",
                       f"tracking.workdir={tmp}/runs", *REDUCED])
    return rlhf_pipeline(config=cfg)["stages"]


def test_ppo_beats_sft_by_the_gold_judge(reduced_demo):
    evaluation = reduced_demo["evaluate"]["metrics"]
    gain = evaluation["eval/judge_score_policy"] - evaluation["eval/judge_score_sft"]
    assert gain >= MIN_JUDGE_GAIN, evaluation
    assert evaluation["eval/judge_win_rate"] >= MIN_WIN_RATE, evaluation
    assert evaluation["eval/eos_rate_policy"] >= 0.9, evaluation
