"""A round's candidate waits for a person: a served run suspends with the approval form below
the round's evidence and, resumed, carries out the answer; `rlhf serve`'s :func:`keeper` thread
ends overdue waits and finishes answers left half done."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.results import publish_summary, publish_text
from tasks.pipeline.rule import Decision
from tasks.pipeline.stages.records import RegisterRecord
from tasks.platform.mlflow.addresses import compare_url, default_tracking_uri, run_page
from tasks.platform.mlflow.runs import RunContext, tracking_client
from tasks.platform.prefect.events import APPROVAL_REQUESTED
from tasks.platform.prefect.prefect_api import report
from tasks.retrain.approval import answers, store, suspend
from tasks.retrain.approval.store import PENDING, Candidate, RoundEvidence
from tasks.retrain.gate.stage import SIDE_BY_SIDE
from tasks.retrain.records import RetrainResult
from tasks.retrain.round import OUTCOME, announce_outcome

CHECK_ENV = "RLHF_APPROVAL_CHECK_S"  # how often `rlhf serve` settles waiting candidates
GRACE_S = 600  # Prefect fails a wait this long after the deadline, if nothing ended it first


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


def held_for_approval(config: PipelineConfig, decision: Decision) -> Decision:
    """The gate's decision, held for a person when it promotes and approval is required."""
    if config.retrain.approval == "required" and decision.promote:
        return decision.model_copy(update={"hold": True})
    return decision


def settle_approvals(config: PipelineConfig) -> None:
    """Before a round: end overdue waits and finish answers left half done."""
    if config.retrain.approval != "required":
        return
    client = tracking_client(default_tracking_uri(config.tracking.tracking_uri))
    for outcome in answers.settle_waiting(client, config.tracking.registered_policy):
        print(outcome.text())


def publish_answer(config: PipelineConfig, answered: RetrainResult) -> None:
    """Publish a resumed round's outcome artifact and summary."""
    title = f"Retrain {answered.status}: candidate v{answered.candidate}"
    report(OUTCOME, f"# {title}\n\n{answered.answer}\n", "retrain outcome")
    publish_text(f"retrain: {answered.status}", answered.answer or "")


def publish_outcome(config: PipelineConfig, result: RetrainResult) -> None:
    """Publish a trained round's event and summary, saying why (or that it waits, and the
    ways to answer)."""
    name = config.tracking.registered_policy
    announce_outcome(name, result.status, result.decision and result.decision.reason,
                     result.run and result.run.parent_run_id)
    if result.run is None:
        return
    reason = result.decision.reason if result.decision else ""
    text = f"Retrain {result.status}" + (f": {reason}" if reason else ".")
    if result.status == "awaiting approval":
        client = tracking_client(default_tracking_uri(config.tracking.tracking_uri))
        cand = store.candidate(client, name, str(result.candidate))
        v, champion = cand.version, answers.champion_now(client, name)
        text = (f"Retrain awaiting approval: candidate `models:/{name}/{v}` (alias `candidate`)"
                f"; the gate: {cand.gate_reason}. Champion v{champion} stays "
                f"until a person approves, by {cand.deadline}: the flow run's Resume form (a "
                f"served round), or `rlhf approve {v} --reason \"...\"` / `rlhf reject {v} "
                "--reason \"...\"`.")
    publish_summary(result.run, f"{result.run.run_name}: {result.status}", text)


def hold_candidate(ctx: RunContext, config: PipelineConfig, reg: RegisterRecord) -> None:
    """A version register held for a person becomes ``candidate`` with its deadline."""
    if reg.awaiting_approval:
        answers.request_approval(ctx.client(), reg.model_name, reg.version, ctx.parent_run_id,
                                 config.retrain.approval_timeout_h)


def ask_for_approval(config: PipelineConfig, result: RetrainResult) -> RetrainResult:
    """Announce the wait; a served run then suspends with the form (its process ends here),
    any other returns ``result``."""
    uri = default_tracking_uri(config.tracking.tracking_uri)
    client = tracking_client(uri)
    cand = store.candidate(client, config.tracking.registered_policy, str(result.candidate))
    flow_run_id, served = suspend.this_flow_run()
    answers.announce_approval(APPROVAL_REQUESTED, cand.name, cand.version, {
        "deadline": cand.deadline, "parent_run_id": cand.parent_run_id,
        "gated_against": cand.gated_against, "flow_run_id": flow_run_id if served else None})
    if not served:
        return result
    store.note_flow_run(client, cand, flow_run_id)
    evidence = evidence_markdown(cand, store.round_evidence(client, cand, SIDE_BY_SIDE), uri)
    print(f"waiting for a person: candidate v{cand.version}, answer by {cand.deadline} "
          "(this flow run's Resume form, or rlhf approve / rlhf reject)")
    suspend.ask(suspend.pause_key(cand.version), evidence,
                store.utc_seconds(cand.deadline) - time.time() + GRACE_S)
    return result  # not reached in a served run: the process ends in ask()


def resumed_round(config: PipelineConfig) -> RetrainResult | None:
    """Carry out the answer this resumed flow run waited for -> the result (None: no wait)."""
    if config.retrain.approval != "required":  # (a resumed run has the same parameters)
        return None
    key = suspend.resumed_key()
    if key is None:
        return None
    form = suspend.ask(key)  # the stored answer, at once
    client = tracking_client(default_tracking_uri(config.tracking.tracking_uri))
    cand = store.candidate(client, config.tracking.registered_policy,
                           key.removeprefix(suspend.KEY_PREFIX))
    given = answers.form_answer(form)
    kept = cand.answer
    if cand.status != PENDING and kept and (kept.decision, kept.reason) == \
            (given.decision, given.reason):  # resumed by the answer that decided (the CLI)
        given = None
    else:
        answers.check_current(client, cand, given)
    outcome = answers.carry_out(client, cand, given)
    print(outcome.text())
    return RetrainResult(status=answers.WORDS[outcome.answer.decision],
                         candidate=int(cand.version), answer=outcome.text())


@contextmanager
def keeper(config: PipelineConfig) -> Iterator[None]:
    """While the body runs, settle waiting candidates in a thread every
    ``RLHF_APPROVAL_CHECK_S`` seconds (approval required only)."""
    if config.retrain.approval != "required":
        yield
        return
    every = float(os.environ.get(CHECK_ENV) or 60)
    stop = threading.Event()
    client = tracking_client(default_tracking_uri(config.tracking.tracking_uri))

    def loop() -> None:
        failing = False
        while not stop.wait(every):
            try:
                for outcome in answers.settle_waiting(client, config.tracking.registered_policy):
                    print(f"rlhf: {outcome.text()}", flush=True)
                failing = False
            except Exception as err:  # noqa: BLE001 - a server away: try again next time
                if not failing:
                    print(f"rlhf: approvals not settled ({type(err).__name__}: {err}); "
                          f"trying every {every:g} s", flush=True)
                failing = True

    thread = threading.Thread(target=loop, name="rlhf-approvals", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()


def tell_waiting_run(outcome: answers.Outcome) -> str | None:
    """Resume a served round still waiting on its form with the kept answer -> a line saying
    so (None: no run waits)."""
    cand, kept = outcome.candidate, outcome.answer
    if not cand.flow_run_id or kept.decision == "timeout":
        return None
    where = f"the round's flow run {cand.flow_run_id}"
    if suspend.prefect_api() is None:
        return (f"{where} may still wait on its Prefect form: with PREFECT_API_URL set to "
                "its server, run this command again to end it (else it ends at the deadline)")
    try:
        resumed = suspend.resume_with(cand.flow_run_id, kept.decision.capitalize(), kept.reason)
    except Exception as err:  # noqa: BLE001 - the answer is kept in MLflow either way
        return f"{where} was not resumed ({type(err).__name__}: {err}); it ends at the deadline"
    return f"{where} resumed with this answer" if resumed else None
