"""Prefect automations that post to a webhook when PPO's health detectors fire or a flow run
fails, built from Prefect's own parts so they can be seen and changed in the Prefect UI."""

from __future__ import annotations

from dataclasses import dataclass

BLOCK_NAME = "rlhf-notify"  # the webhook block
FAILED = ("prefect.flow-run.Failed", "prefect.flow-run.Crashed")  # Prefect's own events
# every flow of the project (a failed or crashed run of any of them is told)
FLOWS = ("rlhf_pipeline", "retrain", "compare", "collect", "label-import", "label-pull", "gc",
         "rlhf_validate", "rlhf_sweep", "rlhf_sweep_point", "rlhf-stage")


@dataclass(frozen=True)
class Notice:
    """One kind of notification; ``subject`` and ``body`` are Prefect templates."""

    automation: str
    events: tuple[str, ...]  # the events it fires on (events.py names ours)
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
    names = []
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
        names.append(notice.automation)
    return names


def remove(name: str) -> bool:
    """Delete the automation called ``name`` -> whether there was one."""
    from prefect.automations import Automation

    try:
        found = Automation.read(name=name)
    except ValueError:
        return False
    found.delete()
    return True
