"""The Prefect events the pipeline emits, for deployment triggers and users' automations (without
a Prefect API dropped silently, as Prefect does), and `rlhf notify`'s automations: a webhook post
when PPO's health detectors fire or a flow run fails, seen and changed in the Prefect UI."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tasks.platform.redact import redacted

LABELLED, COLLECTION_READY = "rlhf.preferences.labelled", "rlhf.collection.ready"
QUARANTINED = "rlhf.preferences.quarantined"
PROMOTED, KEPT = "rlhf.champion.promoted", "rlhf.champion.kept"
UNHEALTHY = "rlhf.ppo.unhealthy"
APPROVAL_REQUESTED = "rlhf.champion.approval-requested"
ANSWERED = {"approve": "rlhf.champion.approved", "reject": "rlhf.champion.rejected",
            "timeout": "rlhf.champion.timed-out"}
# the events' resources (+ batch digest, collection id, registered policy name) and labels:
# Prefect's vocabulary, not MLflow tags (those are in tasks/platform/mlflow/tags.py)
PREFERENCES_RESOURCE, COLLECTION_RESOURCE = "rlhf.preferences.", "rlhf.collection."
POLICY_RESOURCE, RUN_RESOURCE = "rlhf.policy.", "rlhf.run."  # + a pipeline's parent run id
DETECTOR_LABEL = "rlhf.detector"  # the health detector that fired
POLICY_LABEL, POLICY_VERSION_LABEL = "rlhf.policy", "rlhf.policy_version"
IMPORTED_BY_LABEL, LABELS_FILE_LABEL = "rlhf.imported_by", "rlhf.labels.file"
OUTCOME_LABEL = "rlhf.outcome"


def emit(event: str, resource_id: str, name: str, labels: dict[str, str] | None = None,
         payload: dict[str, Any] | None = None) -> None:
    """Emit one event; outside a flow run, wait until it is sent (a CLI may exit right after)."""
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker

    from tasks.platform.prefect.prefect_api import in_prefect_run

    # what a user gave (a file, a reason quoting a setting) is shown as MLflow params are
    resource = redacted({"prefect.resource.id": resource_id, "prefect.resource.name": name,
                         **(labels or {})})
    sent = emit_event(event=event, resource=resource, payload=redacted(payload or {}))
    if sent is not None and not in_prefect_run():
        EventsWorker.drain_all(timeout=30)
    print(f"event {event}: {resource['prefect.resource.name']}")


BLOCK_NAME = "rlhf-notify"  # the webhook block
FAILED = ("prefect.flow-run.Failed", "prefect.flow-run.Crashed")  # Prefect's own events
# every flow of the project (a failed or crashed run of any of them is told)
FLOWS = ("rlhf_pipeline", "retrain", "compare", "collect", "label-import", "label-pull", "gc",
         "rlhf_validate", "rlhf_sweep", "rlhf_sweep_point", "rlhf-stage")


@dataclass(frozen=True)
class Notice:
    """One kind of notification; ``subject`` and ``body`` are Prefect templates."""

    automation: str
    events: tuple[str, ...]  # the events it fires on (named above)
    subject: str
    body: str
    flows: bool = False  # the events are a flow run's: only the project's flows count


def set_up(url: str, notices: list[Notice]) -> list[str]:
    """Create or replace the webhook block and each notice's automation -> their names."""
    from prefect.automations import Automation, EventTrigger, SendNotification
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    block = CustomWebhookNotificationBlock(
        name=BLOCK_NAME, url=url, json_data={"subject": "{{subject}}", "text": "{{body}}"})
    block_id = block.save(BLOCK_NAME, overwrite=True)
    for notice in notices:
        related = {"prefect.resource.role": "flow", "prefect.resource.name": list(FLOWS)} \
            if notice.flows else {}
        automation = Automation(
            name=notice.automation, description=f"rlhf notify -> {url}",
            trigger=EventTrigger(expect=set(notice.events), match_related=related,
                                 posture="Reactive", threshold=1),
            actions=[SendNotification(block_document_id=block_id, subject=notice.subject,
                                      body=notice.body)])
        remove(notice.automation)
        automation.create()
    return [notice.automation for notice in notices]


def remove(name: str) -> bool:
    """Delete the automation called ``name`` -> whether there was one."""
    from prefect.automations import Automation

    try:
        found = Automation.read(name=name)
    except ValueError:
        return False
    found.delete()
    return True
