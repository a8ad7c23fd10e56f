"""`rlhf notify`: be told on a webhook when PPO's health detectors fire or an rlhf flow run
fails, through Prefect automations on the server PREFECT_API_URL names
(tasks/platform/prefect/events.py); `--off` removes them."""

from __future__ import annotations

import os

from tasks.config.pipeline_config import ConfigError
from tasks.platform.prefect.events import FAILED, UNHEALTHY, Notice, remove, set_up
from tasks.platform.prefect.preflight import check_servers, prefect_api_url

# what each kind of notification says (Prefect's templates: event, flow_run, flow)
NOTICES = {
    "unhealthy": Notice(
        "rlhf: PPO unhealthy", (UNHEALTHY,),
        "rlhf: PPO {{ event.payload.failure }} ({{ event.payload.action }})",
        "{{ event.payload.failure }} ({{ event.payload.detector }}) at iteration "
        "{{ event.payload.iteration }}: "
        "{{ event.payload.message }}. Advice: {{ event.payload.advice }}. "
        "MLflow parent run {{ event.payload.parent_run_id }}."),
    "failed": Notice(
        "rlhf: run failed", FAILED,
        "rlhf: {{ flow.name }} run {{ flow_run.name }} {{ flow_run.state.name }}",
        "{{ flow.name }} run {{ flow_run.name }} ended {{ flow_run.state.name }}: "
        "{{ flow_run.state.message }}", flows=True),
}


def cmd_notify(args) -> int:
    url, _ = prefect_api_url()
    if not url:
        raise ConfigError("rlhf notify: automations live on a Prefect server, and "
                          "PREFECT_API_URL is not set (start one with `prefect server start` "
                          "and export PREFECT_API_URL=http://127.0.0.1:4200/api)")
    check_servers(mlflow=False)
    if args.off:
        gone = [n.automation for n in NOTICES.values() if remove(n.automation)]
        print(f"removed: {', '.join(gone) or 'nothing (none was set up)'}")
        return 0
    if not args.url:
        raise ConfigError("rlhf notify: give the webhook URL to post to (or --off)")
    names = set_up(args.url, [NOTICES[kind] for kind in args.on or NOTICES])
    print(f"Prefect automations on {os.environ.get('PREFECT_API_URL', url)}: "
          f"{', '.join(names)} -> POST {args.url} (JSON: subject, text)")
    return 0


def add_command(sub) -> None:
    notify = sub.add_parser("notify", help="post to a webhook when PPO's health detectors "
                            "fire or an rlhf flow run fails (Prefect automations)")
    notify.add_argument("url", nargs="?", help="the webhook URL (Slack, Teams, your own...)")
    notify.add_argument("--on", action="append", choices=sorted(NOTICES),
                        help="what to be told of (repeatable; default: all): unhealthy = a "
                             "health detector fired; failed = a flow run failed or crashed")
    notify.add_argument("--off", action="store_true", help="remove the automations")
    notify.set_defaults(func=cmd_notify)
