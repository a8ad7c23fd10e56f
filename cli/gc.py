"""`rlhf gc`: list what no longer serves (tasks/gc/plan.py decides), and with --yes delete it,
one log line each. Without --yes nothing is deleted."""

from __future__ import annotations

import argparse
from contextlib import nullcontext

from cli.runs import config_command
from tasks.config.pipeline_config import ConfigError
from tasks.platform.prefect.logins import Needs
from tasks.platform.prefect.preflight import check_servers
from tasks.platform.redact import redact


def gc_text(plan, done: list | None = None) -> str:
    """The plan as the command prints it: what would go (``done`` None: a dry run) or what
    went, what stays and why."""
    applied = done is not None
    deletions, kept = (done if applied else plan.deletions), plan.kept
    total = sum(f.bytes for f in deletions) / 1e6
    verb = "deleted" if applied else "would delete"
    lines = [f"rlhf gc ({redact(plan.tracking_uri)}): {verb} {len(deletions)} item(s), "
             f"{total:.1f} MB"]
    if not applied:
        lines += [f"  delete {f.line()}" for f in deletions]
    lines += [f"  keep   {f.line()}" for f in kept]
    lines += [f"note: {n}" for n in plan.notes]
    if not deletions:
        lines.append("nothing to delete")
    elif not applied:
        lines.append("a dry run: nothing was deleted; `rlhf gc --yes` deletes the items above")
    return "\n".join(lines)


def cmd_gc(args, config) -> int:
    from tasks.gc.lock import one_gc
    from tasks.gc.plan import apply_gc, plan_gc
    from tasks.gc.store import store_missing

    check_servers(config.tracking.tracking_uri, prefect=False,
                  needs=Needs(config.tracking.experiment, write=args.yes))
    missing = store_missing(config.tracking.tracking_uri)
    if missing:
        raise ConfigError(missing)
    # a second gc of the store waits for this one; a dry run changes nothing, not even the lock
    with one_gc(config) if args.yes else nullcontext():
        plan = plan_gc(config, keep_runs=args.keep_runs)
        print(gc_text(plan, apply_gc(config, plan) if args.yes else None))
    return 0


def add_command(sub) -> None:
    gc = config_command(sub, "gc", cmd_gc, "list what no longer serves (old finished runs' "
                                           "folders, runs deleted in MLflow, old batches, pull "
                                           "records); --yes deletes it")
    gc.add_argument("--keep-runs", type=_count, metavar="N",
                    help="local folders of the newest N finished runs kept "
                         "(default tracking.gc_keep_runs)")
    gc.add_argument("--yes", action="store_true",
                    help="delete (without it: a dry run that lists what would go)")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text!r}")
    return value
