"""`rlhf` subcommands of the retrain loop: demo-batch, promote, rollback.

    rlhf demo-batch [--config FILE] [--degraded] [--n N] [--seed S]
    rlhf promote VERSION [--config FILE] [--reason TEXT]
    rlhf rollback [--config FILE] [--reason TEXT]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def cmd_demo_batch(args, config) -> int:
    from rlhf_core.demo import write_preference_batch

    seed = args.seed if args.seed is not None else int(time.time())
    path = write_preference_batch(config.retrain.watch_dir, args.n, seed, args.degraded)
    kind = "degraded (labels the judge reverses)" if args.degraded else "demo"
    print(f"wrote {args.n} {kind} preference pairs to {path}")
    return 0


def _client(config):
    from mlflow.tracking import MlflowClient

    from flows.preflight import check_servers
    from tasks.tracking import default_tracking_uri

    check_servers(config.tracking.tracking_uri, prefect=False)

    return MlflowClient(default_tracking_uri(config.tracking.tracking_uri))


def cmd_promote(args, config) -> int:
    from tasks.registry import promote

    name = config.tracking.registered_policy
    before = promote(_client(config), name, args.version, args.reason or "by hand")
    print(f"{name}: champion -> v{args.version} (previous-champion: v{before})")
    return 0


def cmd_rollback(args, config) -> int:
    from tasks.registry import rollback

    name = config.tracking.registered_policy
    old, new = rollback(_client(config), name, args.reason or "by hand")
    print(f"{name}: champion v{old} -> v{new} (previous-champion: v{old})")
    return 0


def add_commands(sub, config_for) -> None:
    """Register the subcommands; ``config_for(args)`` resolves --config/--set."""

    def wrap(fn):
        return lambda args: fn(args, config_for(args))

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", type=Path, help="YAML/JSON pipeline config (default: demo)")
        p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field")

    batch = sub.add_parser("demo-batch", help="write a new batch of demo preference pairs "
                                              "into retrain.watch_dir")
    common(batch)
    batch.add_argument("--degraded", action="store_true",
                       help="label every pair the way the hidden judge would not")
    batch.add_argument("--n", type=int, default=500, help="pairs in the batch")
    batch.add_argument("--seed", type=int, help="seed (default: the current time)")
    batch.set_defaults(func=wrap(cmd_demo_batch))
    prom = sub.add_parser("promote", help="make a registered policy version the champion")
    common(prom)
    prom.add_argument("version", help="registered version number")
    prom.add_argument("--reason", help="recorded with the move")
    prom.set_defaults(func=wrap(cmd_promote))
    back = sub.add_parser("rollback", help="champion back to previous-champion")
    common(back)
    back.add_argument("--reason", help="recorded with the move")
    back.set_defaults(func=wrap(cmd_rollback))
