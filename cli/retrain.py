"""`rlhf` subcommands of the retrain loop: collecting and labelling, retraining, comparing
versions, moving the champion, and a person's answer to a candidate waiting for approval
(`rlhf approve` / `rlhf reject`; on a shared server MLFLOW_TRACKING_USERNAME is who answered, and
a served round waiting on its Prefect form is resumed with it)."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

from cli.errors import EX_TEMPFAIL, quiet_expected_failures
from cli.runs import config_command, config_for, config_options
from tasks.config.pipeline_config import ConfigError
from tasks.pipeline.judge import config_judge_name, gold_judge
from tasks.platform.mlflow.addresses import default_tracking_uri
from tasks.platform.prefect.logins import Needs, needs_of
from tasks.platform.prefect.preflight import check_servers
from tasks.platform.redact import redact
from tasks.retrain.gate.prompts import check_retrainable
from tasks.retrain.labels.client import URL_VAR, check_label_studio


def _with(config, section: str, **fields):
    """``config`` (or a section) with some fields of one section replaced (flags over --set)."""
    fields = {k: v for k, v in fields.items() if v is not None}
    part = getattr(config, section).model_copy(update=fields)
    return config.model_copy(update={section: part})


def _preflight(config) -> None:
    """The MLflow store and (when PREFECT_API_URL is set) the Prefect API answer; an expected
    failure in the flow then prints no traceback."""
    check_servers(config.tracking.tracking_uri, needs=needs_of(config))
    quiet_expected_failures()


def waiting_lines(out, argv: list[str]) -> list[str]:
    """What `rlhf retrain` prints for a round whose candidate waits: `rlhf approve V` and `rlhf
    reject V` with the --config/--set arguments of ``argv`` (a command's own), so they act on
    the same store and policy; passwords hidden."""
    kept, take = [], False
    for arg in argv:
        if take or arg.startswith(("--config=", "--set=")):
            kept.append(redact(arg))
            take = False
        elif arg in ("--config", "--set"):
            kept.append(arg)
            take = True
    approve, reject = (shlex.join(["rlhf", word, str(out.candidate), "--reason", "...", *kept])
                       for word in ("approve", "reject"))
    return [f"candidate: v{out.candidate} (alias candidate) waits for a person's approval; "
            "the champion stays until then",
            f"  approve: {approve}", f"  reject:  {reject}"]


def registry_uri(configured: str | None, needs: Needs) -> str:
    """The registry's store, once it answers and the login may do what ``needs`` says."""
    check_servers(configured, prefect=False, needs=needs)
    return default_tracking_uri(configured)


def cmd_demo_batch(args, config) -> int:
    seed = args.seed if args.seed is not None else config.seed  # recorded, never the clock
    # a config whose retrain could never reach its gate is refused before anything starts
    check_retrainable(config)
    name = config_judge_name(config)  # the run's gold judge labels in place of people
    if name == "none":
        raise ConfigError("rlhf demo-batch labels with the run's gold judge, and eval.judge "
                          "resolves to none for this config; set eval.judge to a gold judge "
                          "of the data (demo, english) or label the collection yourself")
    if args.offline and name != "demo":
        raise ConfigError(f"rlhf demo-batch --offline writes the demo's made-up pairs, which "
                          f"are no data of this run (eval.judge {name}); run it without "
                          "--offline to label the champion's answers with that judge")
    judge = gold_judge(name)
    if args.offline:
        return _demo_offline(args, config, seed)
    _preflight(config)
    config = _with(config, "collect", num_prompts=args.n)
    if args.via == "label-studio":
        return _demo_via_label_studio(args, config, seed, judge)
    return _demo_on_policy(args, config, seed, judge)


DEMO_LABELLERS = ("judge@rlhf.demo", "judge-2@rlhf.demo", "reversed@rlhf.demo")


def _demo_via_label_studio(args, config, seed: int, judge) -> int:
    """Collect into a Label Studio project, annotate every task through the API as the
    DEMO_LABELLERS (the gold judge with two seeds, and reversed), then pull."""
    from concurrent.futures import ThreadPoolExecutor

    import pandas as pd

    from flows.collect import collect_flow, label_pull
    from tasks.platform.mlflow.runs import tracking_client
    from tasks.retrain.labels.client import LabelStudio
    from tasks.retrain.labels.studio import accounts, read_link, vote
    from tasks.retrain.store import collection_by_run_id

    dest = config.collect.destination.model_copy(update={"kind": "label_studio"})
    config = _with(config, "collect", destination=dest)
    check_label_studio(dest.url)
    out = collect_flow(config=config)
    rows = pd.read_json(out.paths["jsonl"], lines=True, dtype=False).to_dict("records")
    ls = LabelStudio.from_env(config.collect.destination.url)
    ids = accounts(ls, list(DEMO_LABELLERS))
    client = tracking_client(default_tracking_uri(config.tracking.tracking_uri))
    tasks = read_link(client, collection_by_run_id(client, out.run_id)).tasks
    votes = []
    for n, email in enumerate(DEMO_LABELLERS):
        choices = judge.label(rows, seed + n, degraded=email.startswith("reversed"))
        by_pair = {r["id"]: c for r, c in zip(rows, choices)}
        votes += [(task_id, by_pair[pair_id], ids[email]) for task_id, pair_id in tasks.items()]
    with ThreadPoolExecutor(4) as pool:  # as labellers do: several at once
        list(pool.map(lambda v: vote(ls, *v), votes))
    print(f"annotated {len(tasks)} tasks as {', '.join(DEMO_LABELLERS)} (the hidden judge, "
          f"seeds {seed} and {seed + 1}, and the judge reversed)")
    (result,) = label_pull(config=config, collection=out.collection)
    return 0 if result.status in ("imported", "quarantined") else 1


def _demo_offline(args, config, seed: int) -> int:
    """Generated pairs into the watch folder, announced as a labelled batch (the served
    retrain's trigger starts a round on it, as on an import)."""
    from rlhf_core.demo import write_preference_batch
    from tasks.platform.prefect import events
    from tasks.retrain.batches import file_digest

    n = args.n or 500
    path = write_preference_batch(config.retrain.watch_dir, n, seed, args.degraded)
    digest = file_digest(path)
    kind = "degraded (labels the judge reverses)" if args.degraded else "demo"
    print(f"wrote {n} {kind} offline preference pairs to {path} (batch digest {digest}; "
          f"labelled by the demo judge with seed {seed})")
    events.emit(events.LABELLED, events.PREFERENCES_RESOURCE + digest, path.name,
                {events.IMPORTED_BY_LABEL: "import", events.LABELS_FILE_LABEL: path.name},
                {"pairs": n, "offline": True, "degraded": args.degraded, "seed": seed})
    return 0


def _demo_on_policy(args, config, seed: int, judge) -> int:
    """Collect from the champion, label with the run's gold judge, import as a person would."""
    import pandas as pd

    from flows.collect import collect_flow, label_import

    out = collect_flow(config=config)
    table = pd.read_json(out.paths["jsonl"], lines=True, dtype=False)
    table["choice"] = judge.label(table.to_dict("records"), seed, args.degraded)
    table["labeller"] = "gold-judge-reversed" if args.degraded else "gold-judge"
    labelled = Path(out.paths["jsonl"]).with_suffix(".labelled.jsonl")
    table.to_json(labelled, orient="records", lines=True, force_ascii=False)
    print(f"labelled by the gold judge '{judge.name}'{' reversed' if args.degraded else ''} "
          f"with seed {seed}: {labelled}")
    print(label_import(config=config, path=str(labelled), labelling_seed=seed).summary())
    return 0


def cmd_collect(args, config) -> int:
    config = _with(config, "collect", policy=args.policy)
    if args.to or args.project:
        collect = _with(config.collect, "destination", kind=args.to and args.to.replace("-", "_"),
                        project=args.project)
        config = config.model_copy(update={"collect": collect})
    check_retrainable(config)  # labels for a loop that cannot retrain are wasted work
    if config.collect.destination.kind == "label_studio":
        # Label Studio answers and takes LABEL_STUDIO_API_KEY (one quick try), before the
        # servers' checks and torch's import
        check_label_studio(config.collect.destination.url)
    _preflight(config)
    from flows.collect import collect_flow

    collect_flow(config=config)
    return 0


def cmd_label_pull(args, config) -> int:
    if os.environ.get(URL_VAR) or config.collect.destination.url:
        check_label_studio(config.collect.destination.url)  # before torch's import
    _preflight(config)
    from flows.collect import label_pull

    out = label_pull(config=config, collection=args.collection, partial=args.partial)
    if not out:
        print("no collection went to Label Studio yet (`rlhf collect --to label-studio`)")
    return 0


def cmd_label_import(args, config) -> int:
    from flows.collect import label_import

    if not Path(args.file).is_file():
        raise ConfigError(f"{args.file}: no such labelled file")
    _preflight(config)
    from tasks.retrain.labels.studio import refuse_studio_rows

    refuse_studio_rows(config, args.file)
    print(label_import(config=config, path=str(args.file)).summary())
    return 0


def cmd_retrain(args, config) -> int:
    check_retrainable(config)
    from flows.retrain import retrain

    _preflight(config)
    start = time.perf_counter()
    out = retrain(config=config, control=args.control)
    if out.status == "skipped":  # exit 75 (EX_TEMPFAIL): nothing ran, try again later
        print(f"retrain: skipped: another retrain of this store is running: the slot "
              f"{out.slot} is held by {out.held_by}; nothing trained (exit "
              f"{EX_TEMPFAIL}: try again later, or set retrain.on_overlap=wait)")
        return EX_TEMPFAIL
    lines = [f"retrain: {out.status} ({time.perf_counter() - start:.1f} s)"]
    if out.decision is not None:
        lines.append(f"gate: {out.decision.reason}")
    if out.run is not None:
        lines.append(f"MLflow parent run: {out.run.parent_run_id} "
                     f"({redact(out.run.tracking_uri)})")
    if out.status == "awaiting approval":
        lines += waiting_lines(out, getattr(args, "argv", []))
    print("\n".join(lines))
    return 0


def cmd_compare(args, config) -> int:
    from flows.retrain import compare

    _preflight(config)
    out = compare(config=config, champion=args.champion, challenger=args.challenger)
    print(f"compare: v{out.challenger} against v{out.champion}, scored by "
          f"{out.decision.scorer}\ngate: {out.decision.reason}\n"
          f"MLflow parent run: {out.run.parent_run_id} ({redact(out.run.tracking_uri)})")
    return 0


def cmd_move(args, config) -> int:
    """`rlhf promote V` and `rlhf rollback`: the champion alias moved by hand."""
    from tasks.platform.mlflow.registry import promote, rollback

    name, reason = config.tracking.registered_policy, args.reason or "by hand"
    uri = registry_uri(config.tracking.tracking_uri, Needs(models=(name,)))
    if args.command == "rollback":
        old, new = rollback(uri, name, reason)
        print(f"{name}: champion v{old} -> v{new} (previous-champion: v{old})")
    else:
        before = promote(uri, name, args.version, reason, flagged=args.flagged)
        print(f"{name}: champion -> v{args.version} (previous-champion: v{before})")
    return 0


def cmd_answer(args, config, decision: str) -> int:
    from tasks.platform.mlflow.runs import tracking_client
    from tasks.retrain.approval.answers import answer
    from tasks.retrain.approval.waiting import tell_waiting_run

    # the login may write the round's run and manage the registered policy's aliases
    t = config.tracking
    client = tracking_client(registry_uri(t.tracking_uri, Needs(
        t.experiment, models=(t.registered_policy,), managed=(t.registered_policy,))))
    outcome = answer(client, config.tracking.registered_policy, args.version, decision,
                     args.reason, "cli")
    note = tell_waiting_run(outcome)
    text = outcome.text() + (f"\n{note}" if note else "")
    if not outcome.agrees:
        print(f"rlhf: {text}", file=sys.stderr)
        return 2
    print(text)
    return 0


def add_commands(sub) -> None:
    col = config_command(sub, "collect", cmd_collect, "sample a registered policy on fresh "
                         "prompts and write a labelling file (collect.out_dir)")
    col.add_argument("--policy", help="version number or alias (default collect.policy: "
                                      "champion)")
    col.add_argument("--to", choices=("files", "label-studio"),
                     help="where the pairs go (collect.destination.kind; label-studio: "
                          "LABEL_STUDIO_URL and LABEL_STUDIO_API_KEY)")
    col.add_argument("--project", help="Label Studio project title "
                                       "(collect.destination.project)")
    label = sub.add_parser("label", help="labelled files back in")
    label_sub = label.add_subparsers(dest="label_command", required=True)
    imp = config_command(label_sub, "import", cmd_label_import, "a labelled file -> a "
                         "preference batch in retrain.watch_dir (or quarantined)")
    imp.add_argument("file", type=Path, help="the labelled JSONL/CSV file")
    pul = config_command(label_sub, "pull", cmd_label_pull, "finished Label Studio "
                         "annotations -> a preference batch (each pair once)")
    pul.add_argument("collection", nargs="?", help="collection id (default: every "
                                                   "collection that went to Label Studio)")
    pul.add_argument("--partial", action="store_true",
                     help="make a batch now, below collect.destination.min_labelled")
    ret = config_command(sub, "retrain", cmd_retrain,
                         "one retrain round here, without a Prefect server")
    ret.add_argument("--control", action="store_true",
                     help="a control round: the same retrain on the batches consumed so far, "
                          "gated against the champion; nothing registered or moved")
    cmp = config_command(sub, "compare", cmd_compare, "two registered policy versions "
                         "through the retrain's gate (nothing trained or moved)")
    cmp.add_argument("champion", help="the version compared against (number or alias)")
    cmp.add_argument("challenger", nargs="?", default="champion",
                     help="the version tested (default: champion)")
    batch = config_command(sub, "demo-batch", cmd_demo_batch, "collect from the champion and "
                           "label with the run's hidden gold judge (eval.judge; --offline: the "
                           "demo's generated pairs)")
    batch.add_argument("--degraded", action="store_true",
                       help="label every pair the way the hidden judge would not")
    batch.add_argument("--offline", action="store_true",
                       help="generated pairs, not the champion's answers")
    batch.add_argument("--n", type=int, help="prompts collected (collect.num_prompts); "
                                             "--offline: pairs (500)")
    batch.add_argument("--seed", type=int, help="the judge's labelling seed, recorded on the "
                                                "import (default: the config's seed)")
    batch.add_argument("--via", choices=("file", "label-studio"), default="file",
                       help="label-studio: collect into a project, annotate as three demo "
                            "accounts through its API, pull (LABEL_STUDIO_URL/_API_KEY)")
    prom = config_command(sub, "promote", cmd_move,
                          "make a registered policy version the champion")
    prom.add_argument("version", help="registered version number")
    prom.add_argument("--reason", help="recorded with the move")
    prom.add_argument("--flagged", action="store_true",
                      help="promote it although its PPO run was stopped by a health detector "
                           "or flagged for reward hacking")
    back = config_command(sub, "rollback", cmd_move, "champion back to previous-champion")
    back.add_argument("--reason", help="recorded with the move")
    for decision, says in (("approve", "the candidate becomes champion"),
                           ("reject", "the champion stays; the candidate stays registered")):
        p = sub.add_parser(decision, help=f"answer a retrain's candidate waiting for approval: "
                                          f"{says}")
        p.add_argument("version", nargs="?",
                       help="the candidate's version (default: the only one waiting)")
        p.add_argument("--reason", required=True, help="why (recorded with the answer)")
        config_options(p)
        p.set_defaults(func=lambda args, d=decision: cmd_answer(args, config_for(args), d))
