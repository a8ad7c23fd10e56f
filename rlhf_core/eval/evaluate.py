"""The evaluate stage's comparison of the SFT and PPO policies on the same held-out prompts; with
a gold judge, the win rate and reward over-optimisation (the RM's credit beyond the judge's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from rlhf_core.config import Sampling
from rlhf_core.eval.collect import Judge
from rlhf_core.eval.gate import paired_bootstrap_ci, paired_win_rate
from rlhf_core.models.data import encode, left_pad
from rlhf_core.models.models import ScalarHeadModel
from rlhf_core.models.precision import autocast
from rlhf_core.ppo import rollout
from rlhf_core.ppo.ppo_math import logprobs_from_logits, truncate_after_eos


@torch.inference_mode()
def sample_policy(policy, ref_policy, reward_model: ScalarHeadModel, tokenizer,
                  prompts: Sequence[str], sampling: Sampling, *, device: torch.device,
                  precision: str = "fp32",
                  scorers: Mapping[str, ScalarHeadModel] | None = None,
                  features: bool = False,
                  on_batch: Callable[[int], None] | None = None) -> dict[str, list]:
    """Sample one response per prompt -> lists: response, has_eos, length, score, kl, one per
    ``scorers`` model, and with ``features`` the RM's hidden states [N, H]. ``ref_policy``
    None: no KL."""
    with autocast(precision, device):
        gen_config = rollout.sampling_config(
            tokenizer, sampling.temperature, sampling.max_new_tokens,
            model_generation=getattr(policy, "generation_config", None))
        pad_id, eos_id = tokenizer.pad_token_id, gen_config.eos_token_id  # EOS: the stop set
        stops = torch.tensor([eos_id] if isinstance(eos_id, int) else eos_id)
        scorers = dict(scorers or {})
        out: dict[str, list] = {name: [] for name in
                                ("response", "has_eos", "length", "score", "kl", *scorers)}
        for start in range(0, len(prompts), sampling.batch_size):
            chunk = prompts[start: start + sampling.batch_size]
            prompt_ids = left_pad([encode(tokenizer, p) for p in chunk], pad_id).to(device)
            P = prompt_ids.shape[1]
            raw, logits = rollout.generate(policy, prompt_ids, gen_config, pad_id)
            responses, mask, has_eos = truncate_after_eos(raw, eos_id, pad_id)
            qr = torch.cat([prompt_ids, responses], dim=1)
            if ref_policy is not None:
                logprobs = logprobs_from_logits(logits, responses, sampling.temperature)
                ref_lp = logprobs_from_logits(rollout.response_logits(ref_policy, qr, pad_id, P),
                                              responses, sampling.temperature)
                out["kl"] += ((logprobs - ref_lp) * mask).sum(1).float().tolist()
            if features:
                scores, feats = rollout.score_and_features(reward_model, qr, pad_id, P, mask)
                out.setdefault("features", []).append(feats.cpu())
            else:
                scores = rollout.score_responses(reward_model, qr, pad_id, P, mask)
            for name, scorer in scorers.items():
                out[name] += rollout.score_responses(scorer, qr, pad_id, P, mask).float().tolist()
            for i in range(len(chunk)):
                text_ids = responses[i][mask[i] & ~torch.isin(responses[i], stops.to(device))]
                out["response"].append(tokenizer.decode(text_ids, skip_special_tokens=True))
            out["has_eos"] += has_eos.tolist()
            out["length"] += mask.sum(1).tolist()
            out["score"] += scores.float().tolist()
            if on_batch is not None:
                on_batch(len(out["score"]))
        if features:
            out["features"] = torch.cat(out["features"]) if out.get("features") else None
        return out


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """(mean, population std) of a non-empty sequence; std 0 for a constant one."""
    mu = _mean(values)
    return mu, (sum((v - mu) ** 2 for v in values) / len(values)) ** 0.5


def rm_judge_gap(rm_mean: float, judge_mean: float, rm_base: tuple[float, float],
                 judge_base: tuple[float, float]) -> dict[str, float]:
    """Reward over-optimisation: the RM's z-gain over a baseline minus the judge's; a growing
    positive gap means the policy exploits the RM (README § Sources [Overoptimisation])."""
    z = [(v - mu) / sd if sd > 0 else float("nan")  # in the baseline's standard deviations
         for v, (mu, sd) in ((rm_mean, rm_base), (judge_mean, judge_base))]
    return {"rm_gain_z": z[0], "judge_gain_z": z[1], "rm_judge_gap_z": z[0] - z[1]}


def compare_policies(sft: dict[str, list], policy: dict[str, list], prompts: Sequence[str],
                     judge: Judge | None = None) -> tuple[dict[str, float], list[dict]]:
    """Metrics and side-by-side rows from two ``sample_policy`` outputs."""
    metrics = {
        "eval/rm_score_sft": _mean(sft["score"]),
        "eval/rm_score_policy": _mean(policy["score"]),
        "eval/kl_to_ref": _mean(policy["kl"]),
        "eval/eos_rate_sft": _mean([float(x) for x in sft["has_eos"]]),
        "eval/eos_rate_policy": _mean([float(x) for x in policy["has_eos"]]),
        "eval/length_sft": _mean(sft["length"]),
        "eval/length_policy": _mean(policy["length"]),
        "eval/num_prompts": float(len(prompts)),
    }
    rows = []
    judged_sft, judged_pol, wins = [], [], []
    for i, prompt in enumerate(prompts):
        row = {"prompt": prompt, "sft_response": sft["response"][i],
               "policy_response": policy["response"][i], "sft_rm_score": sft["score"][i],
               "policy_rm_score": policy["score"][i]}
        if judge is not None:
            a = judge(prompt, sft["response"][i], bool(sft["has_eos"][i]))
            b = judge(prompt, policy["response"][i], bool(policy["has_eos"][i]))
            judged_sft.append(a)
            judged_pol.append(b)
            wins.append(1.0 if b > a else 0.5 if b == a else 0.0)
            row.update({"sft_judge_score": a, "policy_judge_score": b})
        rows.append(row)
    if judge is not None:
        metrics.update({"eval/judge_score_sft": _mean(judged_sft),
                        "eval/judge_score_policy": _mean(judged_pol),
                        "eval/judge_win_rate": _mean(wins)})
        metrics.update(_overoptimisation(sft["score"], policy["score"], judged_sft, judged_pol,
                                         rows))
    return metrics, rows


def _overoptimisation(rm_sft, rm_pol, judge_sft, judge_pol, rows: list[dict]) -> dict:
    """RM vs judge, per sample (z-scores against the SFT samples, in ``rows``) and overall."""
    rm_base, judge_base = mean_std(rm_sft), mean_std(judge_sft)
    for row in rows:
        row["policy_rm_judge_gap_z"] = rm_judge_gap(row["policy_rm_score"],
                                                    row["policy_judge_score"], rm_base,
                                                    judge_base)["rm_judge_gap_z"]
    gap = rm_judge_gap(_mean(rm_pol), _mean(judge_pol), rm_base, judge_base)
    x, y = [*rm_sft, *rm_pol], [*judge_sft, *judge_pol]  # Pearson's correlation, NaN if flat
    (mx, sx), (my, sy) = mean_std(x), mean_std(y)
    corr = _mean([(a - mx) * (b - my) for a, b in zip(x, y)]) / (sx * sy) if sx and sy \
        else float("nan")
    return {**{f"eval/{k}": v for k, v in gap.items()}, "eval/rm_judge_correlation": corr}


def against_start(start: Sequence[float], policy: Sequence[float],
                  confidence: float = 0.95) -> dict[str, float]:
    """The trained policy against its start, per-prompt scores [N] -> ``eval/vs_start_*``:
    mean difference and win rate, each with its paired bootstrap interval."""
    diffs = [b - a for a, b in zip(start, policy, strict=True)]
    mean, low, high = paired_bootstrap_ci(diffs, confidence)
    rate, rate_low, rate_high = paired_win_rate(diffs, confidence)
    return {"eval/vs_start_diff": mean, "eval/vs_start_diff_low": low,
            "eval/vs_start_diff_high": high, "eval/vs_start_win_rate": rate,
            "eval/vs_start_win_low": rate_low, "eval/vs_start_win_high": rate_high}
