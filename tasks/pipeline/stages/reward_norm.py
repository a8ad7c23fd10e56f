"""reward_norm: score the SFT set (prompt + reference response) with the reward model; its
{mean, std, n} normalise PPO's rewards."""

from __future__ import annotations

from rlhf_core.models.loader import load_pretrained, load_tokenizer
from rlhf_core.models.ragged import Joined
from rlhf_core.models.scoring import normalise_scores, reward_norm_stats, score_ids
from tasks.pipeline.stages.context import Stage, StageContext
from tasks.pipeline.stages.records import DataRecord, ModelRecord, NormRecord
from tasks.pipeline.stages.run import stage_task
from tasks.pipeline.stages.token_data import text_ids
from tasks.platform.files import write_json


def body(sc: StageContext, data: DataRecord, rm: ModelRecord) -> NormRecord:
    cfg, device, spec = sc.cfg, sc.device, sc.spec
    tokenizer = load_tokenizer(sc.local(data.tokenizer, "validate's tokenizer"), spec)
    model = load_pretrained(sc.local(rm.model, "reward_model's model"), spec, "scalar",
                            trainable=False).to(device)
    prompts, responses = text_ids(sc.local(data.data, "validate's data") / "sft.jsonl",
                                  ("prompt", "response"), tokenizer)
    n = cfg.reward_norm.max_samples or len(prompts)
    seqs = Joined([prompts[:n], responses[:n]], [tokenizer.eos_token_id])  # prompt+response+EOS
    scores = score_ids(model, seqs, tokenizer.pad_token_id, device, cfg.reward_norm.batch_size)
    stats = reward_norm_stats(scores)
    normalised = normalise_scores(scores, stats, cfg.reward_norm.divide_by_std)
    check = float(normalised.mean())
    if abs(check) > 1e-3 * max(1.0, stats["std"]):
        raise RuntimeError(f"reward normalisation check failed: mean after = {check}")
    path = write_json(sc.dir / "reward_norm.json", stats)
    metrics = {"reward/mean": stats["mean"], "reward/std": stats["std"],
               "reward/n": float(stats["n"]), "reward/normalised_mean": check}
    sc.log(0, metrics)
    return NormRecord(stats_file=sc.publish(path, "reward_norm.json"), stats=stats, metrics=metrics)


STAGE = Stage("reward_norm", body, NormRecord, sections=("reward_norm",),
              metrics=("reward/mean", "reward/std", "reward/n", "reward/normalised_mean"),
              artifacts=("reward_norm.json",))
reward_norm = stage_task(STAGE)
