"""The Prefect events the pipeline emits, for deployment triggers and users' automations;
without a Prefect API an event is dropped silently, as Prefect does."""

from __future__ import annotations

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
    """Emit one event; outside a flow run, wait until it is sent (a CLI process may exit
    right after)."""
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
