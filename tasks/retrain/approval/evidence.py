"""The evidence a person reads above the approval form (and in the round's outcome), as
markdown."""

from __future__ import annotations

from tasks.platform.mlflow.addresses import compare_url, run_page
from tasks.retrain.approval.store import Candidate, RoundEvidence


def _cell(text, limit: int = 160) -> str:
    """A table cell: one line, no pipe, cut at ``limit`` characters."""
    one = " ".join(str(text).split()).replace("|", "\\|")
    return one if len(one) <= limit else one[: limit - 1] + "…"


def _num(figures: dict[str, str], key: str, signed: bool = False) -> str:
    value = figures.get(key)
    if value is None:
        return "n/a"
    try:
        return f"{float(value):+.3f}" if signed else f"{float(value):.3f}"
    except ValueError:
        return value


def figure_lines(ev: RoundEvidence) -> list[str]:
    """The evidence, one bullet per figure (markdown: the form is narrow)."""
    f, level = ev.figures, f"{float(ev.confidence):.0%}"
    lines = [
        f"- **paired win rate**: {_num(f, 'win_rate')}, {level} CI [{_num(f, 'win_rate_low')}, "
        f"{_num(f, 'win_rate_high')}] over {f.get('n_prompts', '?')} prompts (the share "
        "the candidate wins; a tie counts half)",
        f"- **held-out judge's gain** ({ev.scorer}): {_num(f, 'diff_mean', True)}, {level} "
        f"CI [{_num(f, 'ci_low', True)}, {_num(f, 'ci_high', True)}] (champion "
        f"{_num(f, 'score_champion')} -> candidate {_num(f, 'score_challenger')})"]
    if ev.gold:
        g = ev.gold
        lines.append(f"- **the gold judge** would have decided {g.get('decision', '?')}: "
                     f"{_num(g, 'diff_mean', True)}, CI [{_num(g, 'ci_low', True)}, "
                     f"{_num(g, 'ci_high', True)}]")
    lines += [
        f"- **KL to the reference**: candidate {_num(f, 'kl_challenger')}, champion "
        f"{_num(f, 'kl_champion')} (the gate's cap {ev.max_kl})",
        f"- **EOS rate**: candidate {_num(f, 'eos_rate_challenger')}, champion "
        f"{_num(f, 'eos_rate_champion')}",
        f"- **health flags**: {', '.join(ev.health_flags) or 'none'}"]
    return lines


def side_by_side_lines(ev: RoundEvidence, champion: str, version: str) -> list[str]:
    """Each prompt, then both answers with their scores."""
    if not ev.side_by_side:
        return ["(the gate run kept no side-by-side table)"]
    out = []
    for n, r in enumerate(ev.side_by_side, 1):
        out += [f"{n}. {_cell(r['prompt'], 120)}",
                f"    - champion v{champion} ({float(r['score_champion']):.2f}): "
                f"{_cell(r['champion'])}",
                f"    - candidate v{version} ({float(r['score_challenger']):.2f}): "
                f"{_cell(r['challenger'])}"]
    return out


def evidence_markdown(cand: Candidate, ev: RoundEvidence, tracking_uri: str) -> str:
    """The markdown a person reads before answering."""
    champion = cand.gated_against or "?"
    runs = [ev.round_run_id, *([ev.champion_run_id] if ev.champion_run_id else [])]
    compare = compare_url(tracking_uri, cand.experiment_id, runs)
    page = run_page(tracking_uri, cand.experiment_id, ev.round_run_id)
    local = "" if page else f" (after `mlflow ui --backend-store-uri {tracking_uri}`)"
    links = f"[compare this round with the champion's]({compare})" + (
        f" · [this round's run]({page})" if page else f" · round run `{ev.round_run_id}`")
    return "\n".join([
        f"## Candidate v{cand.version} of `{cand.name}` against champion v{champion}", "",
        f"The gate says **promote**: {_cell(ev.reason, 400)}", "",
        *figure_lines(ev), "",
        f"**Side by side**, the first {len(ev.side_by_side)} of {ev.n_side_by_side} held-out "
        "prompts (each answer's score by the same scorer; every prompt: the gate run's "
        "`gate/side_by_side.json`):", "",
        *side_by_side_lines(ev, champion, cand.version), "",
        f"MLflow{local}: {links}", "",
        f"Answer by **{cand.deadline}** (`retrain.approval_timeout_h`); no answer by then "
        f"keeps champion v{champion}. From a terminal: `rlhf approve {cand.version} "
        f"--reason \"...\"` or `rlhf reject {cand.version} --reason \"...\"`.", ""])
