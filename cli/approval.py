"""`rlhf approve` / `rlhf reject`: a person's answer to a retrain round's candidate
(``retrain.approval: required``), from a terminal, against the registry in use (on a shared
server MLFLOW_TRACKING_USERNAME is who answered). A served round waiting on its Prefect form for
the same answer is resumed with it.
"""

from __future__ import annotations

import shlex
import sys

from cli.runs import config_for, config_options
from tasks.platform.mlflow.addresses import default_tracking_uri
from tasks.platform.prefect.logins import Needs
from tasks.platform.prefect.preflight import check_servers
from tasks.platform.redact import redact


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
    for decision, says in (("approve", "the candidate becomes champion"),
                           ("reject", "the champion stays; the candidate stays registered")):
        p = sub.add_parser(decision, help=f"answer a retrain's candidate waiting for approval: "
                                          f"{says}")
        p.add_argument("version", nargs="?",
                       help="the candidate's version (default: the only one waiting)")
        p.add_argument("--reason", required=True, help="why (recorded with the answer)")
        config_options(p)
        p.set_defaults(func=lambda args, d=decision: cmd_answer(args, config_for(args), d))
