"""The alignment tax at a retrain's gate, measured as evaluate measures it: a challenger over
``eval.tax.budget`` does not win, however it scores on the task."""

from __future__ import annotations

from tasks.pipeline.rule import Decision, tax_veto
from tasks.pipeline.stages.tax import base_cache, measure, over_budget, tax_inputs


def challenger_tax(sc, prep, tokenizer, policy) -> tuple[dict, list[dict]]:
    """``policy``'s tax against ``model.base_model`` (not the prepared base, which is the
    champion) -> ``eval/tax/*`` metrics and the probe's rows."""
    from rlhf_core.models.loader import load_policy
    from rlhf_core.models.models import resize_for_tokenizer
    from rlhf_core.models.sources import resolve_model_source

    tax = sc.cfg.eval.tax
    probe, text = tax_inputs(tax)
    base_dir = resolve_model_source(sc.cfg.model.base_model)
    base = load_policy(base_dir, sc.spec, trainable=False).to(sc.device)
    resize_for_tokenizer(base, tokenizer)  # the data gate's PAD, if it added one
    kept = base_cache(prep.model_copy(update={"base_model": base_dir}), sc.spec, sc.device)
    return measure(tax, probe, text, {"base": base, "policy": policy}, tokenizer,
                   base_cache=kept)


def taxed(decision: dict, tax: dict, cfg) -> dict:
    """The gate's decision after the tax veto, its figures gaining ``tax_lost``."""
    from rlhf_core.eval.tax import tax_lost

    lost = tax_lost(tax)
    if lost is None:
        return decision
    ruled = tax_veto(Decision(promote=decision["promote"], reason=decision["reason"]),
                     over_budget(tax, cfg.eval.tax.budget), cfg.tracking.promote_flagged)
    return {**decision, "promote": ruled.promote, "reason": ruled.reason,
            "figures": {**decision["figures"], "tax_lost": lost}}
