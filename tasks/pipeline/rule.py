"""The register stage's champion rule: a new policy takes ``champion`` only when both were
scored by the same scorer on the same held-out prompts, since two reward models' scales are not
comparable. Otherwise it is registered ``challenger`` (the retrain gate or ``rlhf promote``
moves the champion later); the decision and its reason are tags on the version."""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict

from tasks.platform.mlflow.registry import CHAMPION, alias_version, version_parent_run
from tasks.platform.mlflow.tags import EVAL_SCORER_TAG


def eval_scorer(judge_name: str, rm_run_id: str, prompts: list[str]) -> str:
    """Who scored an evaluation, on what: ``judge:<name>`` (a gold judge) or
    ``reward_model:<its run id>``, then ``@<n> prompts:<sha256 of them, 12 hex>``."""
    who = f"judge:{judge_name}" if judge_name != "none" else f"reward_model:{rm_run_id}"
    digest = hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:12]
    return f"{who}@{len(prompts)} prompts:{digest}"


def score_key(metrics: dict) -> str:
    """The evaluation score register reads: the judge's when there is one."""
    return "eval/judge_score_policy" if "eval/judge_score_policy" in metrics \
        else "eval/rm_score_policy"


def champion_evaluation(client, name: str) -> dict | None:
    """The champion's version, scorer and evaluation metrics, or None when there is none."""
    version = alias_version(client, name, CHAMPION)
    if version is None:
        return None
    parent = version_parent_run(client, version)
    return {"version": str(version.version), "scorer": parent.data.tags.get(EVAL_SCORER_TAG),
            "metrics": dict(parent.data.metrics)}


class Decision(BaseModel):
    """A champion decision: the retrain gate's (``scorer`` set), the register rule's
    (``verdict``, ``champion_score``), or a move a resume finds already made."""

    model_config = ConfigDict(frozen=True)
    promote: bool
    reason: str
    scorer: str | None = None
    verdict: str = ""
    champion_score: float | None = None
    hold: bool = False  # promote, once a person approves (retrain.approval: required)

    @property
    def register_tag(self) -> str:
        """The version's tag: the verdict, or ``gate: promote|keep[, awaiting approval]``."""
        held = ", awaiting approval" if self.hold else ""
        return self.verdict or "gate: " + ("promote" if self.promote else "keep") + held

    def noted(self, note: str) -> Decision:
        return self.model_copy(update={"reason": f"{self.reason}; {note}"})


def register_decision(champion: dict | None, scorer: str | None, key: str,
                      score: float) -> Decision:
    """``first`` (no champion: promote), ``beats``/``loses`` (same scorer), or
    ``not-compared`` (different or unknown scorers: champion stays)."""
    if champion is None:
        return Decision(promote=True, verdict="first",
                        reason=f"no champion yet: this policy becomes champion ({key} {score:.4g})")
    v, theirs = champion["version"], champion["scorer"]
    current = champion["metrics"].get(key)
    if scorer is None or theirs != scorer or current is None:
        return Decision(promote=False, verdict="not-compared", reason=f"not compared with "
                        f"champion v{v}: this run was scored by {scorer or 'an unknown scorer'}, "
                        f"the champion by {theirs or 'an unknown scorer'}; scores from different "
                        "scorers (e.g. two reward models) are not comparable, so the champion "
                        "stays (the retrain gate or `rlhf promote` moves it)")
    promote = score > current
    word = "beats" if promote else "does not beat"
    return Decision(promote=promote, verdict="beats" if promote else "loses",
                    champion_score=current, reason=f"{key} {score:.4g} {word} champion v{v}'s "
                    f"{current:.4g} (same scorer: {scorer})")


# fewer paired prompts than this and the bootstrap interval is too unreliable to refuse on
FIRST_CHAMPION_MIN_PROMPTS = 32


def first_champion(decision: Decision, metrics: dict, start_scorer: str | None) -> Decision:
    """A first champion whose paired interval vs its start policy (``eval/vs_start_diff_*``,
    by an independent scorer) lies wholly below 0 stays challenger; too few prompts or no
    such scorer: the promotion stands, saying so. Other decisions pass through."""
    if decision.verdict != "first":
        return decision
    if "eval/vs_start_diff_high" not in metrics:
        return decision.noted("it rests on the reward model alone: no scorer independent of it "
                              "(gold judge, ppo.health.scorer, judge reward model) compared it "
                              "with its start policy")
    n = int(metrics.get("eval/num_prompts", FIRST_CHAMPION_MIN_PROMPTS))
    if n < FIRST_CHAMPION_MIN_PROMPTS:
        return decision.noted(f"its comparison with its start policy ({n} prompts, fewer than "
                              f"{FIRST_CHAMPION_MIN_PROMPTS}) is too small to refuse it on")
    diff, low, high = (metrics[f"eval/vs_start_diff{k}"] for k in ("", "_low", "_high"))
    rate = metrics.get("eval/vs_start_win_rate", float("nan"))
    figures = (f"by {start_scorer or 'an independent scorer'}: mean difference {diff:+.3f}, "
               f"95% CI [{low:+.3f}, {high:+.3f}], win rate {rate:.3f}")
    if high < 0:
        return Decision(promote=False, verdict="worse-than-start",
                        reason=f"not made the first champion: worse than the policy it started "
                               f"from {figures}; it stays challenger")
    return decision.noted(f"not worse than its start policy {figures}")


def tax_veto(decision: Decision, over: str | None, override: bool) -> Decision:
    """Refuse a promotion over the alignment-tax budget (``over``: why), a gate's win too,
    since the gate does not see what the policy lost elsewhere; ``override`` keeps it.
    Idempotent: a reason it already holds is not added twice."""
    if not decision.promote or over is None or over in decision.reason:
        return decision
    return _overridden_or_refused(decision, over, override, "tax")


def _overridden_or_refused(decision: Decision, why: str, override: bool, verdict: str) -> Decision:
    """A promotion that ``why`` blocks: kept with the override said, else refused naming it."""
    if override:
        return decision.noted(f"promoted although {why} (tracking.promote_flagged)")
    return Decision(promote=False, verdict=verdict, scorer=decision.scorer,
                    champion_score=decision.champion_score, reason=f"not made champion: {why} "
                    "(to promote it anyway: tracking.promote_flagged, or rlhf promote VERSION "
                    f"--flagged); without that: {decision.reason}")


def health_veto(decision: Decision, blocked: str | None, override: bool,
                gated: bool = False, bootstrap: bool = False) -> Decision:
    """Refuse a promotion a health detector ``blocked`` unless ``override``. It stands when
    ``gated`` (the gate's paired test outweighs an in-run finding) or ``bootstrap`` (a
    retrain's first champion; without it no round could start), noting the finding."""
    if not decision.promote or blocked is None:
        return decision
    if bootstrap or gated:
        why = ("a retrain's first champion (the next rounds collect pairs on its answers and "
               "every move after passes the gate)" if bootstrap else
               "the gate's paired test against the champion outweighs the health finding")
        return decision.noted(f"promoted although {blocked}: {why}")
    return _overridden_or_refused(decision, blocked, override, "health")
