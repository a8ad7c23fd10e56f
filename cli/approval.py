"""`rlhf approve` / `rlhf reject`: a person's answer to a retrain round's candidate
(``retrain.approval: required``), from a terminal, against the registry in use (on a shared
server MLFLOW_TRACKING_USERNAME is who answered). A served round waiting on its Prefect form for
the same answer is resumed with it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from tasks.platform.redact import redact


def answer_commands(argv: list[str], version: int | str) -> list[str]:
    """`rlhf approve V` and `rlhf reject V` with the --config/--set arguments of ``argv``
    (a command's own), so they act on the same store and policy; passwords hidden."""
    kept, take = [], False
    for arg in argv:
        if take or arg.startswith(("--config=", "--set=")):
            kept.append(redact(arg))
            take = False
        elif arg in ("--config", "--set"):
            kept.append(arg)
            take = True
    return [shlex.join(["rlhf", word, str(version), "--reason", "...", *kept])
            for word in ("approve", "reject")]


def waiting_lines(out, argv: list[str]) -> list[str]:
    """What `rlhf retrain` prints for a round whose candidate waits."""
    approve, reject = answer_commands(argv, out.candidate)
    return [f"candidate: v{out.candidate} (alias candidate) waits for a person's approval; "
            "the champion stays until then",
            f"  approve: {approve}", f"  reject:  {reject}"]


def _tracking_uri(config) -> str:
    """The store the candidate lives in, once it answers and the login may write the round's
    run and manage the registered policy's aliases."""
    from tasks.platform.mlflow.runs import default_tracking_uri
    from tasks.platform.prefect.logins import Needs
    from tasks.platform.prefect.preflight import check_servers

    t = config.tracking
    check_servers(t.tracking_uri, prefect=False, needs=Needs(
        t.experiment, models=(t.registered_policy,), managed=(t.registered_policy,)))
    return default_tracking_uri(t.tracking_uri)


def cmd_answer(args, config, decision: str) -> int:
    from tasks.platform.mlflow.runs import tracking_client
    from tasks.retrain.approval.answers import answer
    from tasks.retrain.approval.waiting import tell_waiting_run

    client = tracking_client(_tracking_uri(config))
    outcome = answer(client, config.tracking.registered_policy, args.version, decision,
                     args.reason, "cli")
    note = tell_waiting_run(outcome)
    text = outcome.text() + (f"\n{note}" if note else "")
    if not outcome.agrees:
        print(f"rlhf: {text}", file=sys.stderr)
        return 2
    print(text)
    return 0


def add_commands(sub, config_for) -> None:
    """`approve` and `reject`; ``config_for(args)`` resolves --config/--set."""
    for word, decision, says in (
            ("approve", "approve", "the candidate becomes champion"),
            ("reject", "reject", "the champion stays; the candidate stays registered")):
        p = sub.add_parser(word, help=f"answer a retrain's candidate waiting for approval: "
                                      f"{says}")
        p.add_argument("version", nargs="?",
                       help="the candidate's version (default: the only one waiting)")
        p.add_argument("--reason", required=True, help="why (recorded with the answer)")
        p.add_argument("--config", type=Path, help="YAML/JSON pipeline config (default: "
                                                   "demo)")
        p.add_argument("--set", action="append", metavar="KEY=VALUE",
                       help="override a field")
        p.set_defaults(func=_bound(config_for, decision))


def _bound(config_for, decision: str):
    def run(args: argparse.Namespace) -> int:
        return cmd_answer(args, config_for(args), decision)
    return run
