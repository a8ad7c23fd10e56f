"""Driving the Prefect and MLflow UIs in headless Chromium as a newcomer does (Playwright's
Python package with Debian's ``chromium``; Playwright downloads no browser here): the servers
behind them (a Prefect server with its UI, an MLflow tracking server, ``rlhf serve``), the
deployment's Custom run form, the flow run page and its artifacts, the MLflow run page and the
compare view. Used by tests/flows/test_browser.py and bench/ui_screenshots.py."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from flows.serve import SERVED_FLOWS
from tests.flows.prefect_procs import ROOT, free_port, prefect_server, rlhf_serve, wait_deployment
from tests.servers import mlflow_server

CHROMIUM = "/usr/bin/chromium"


def missing() -> str | None:
    """Why the browser cannot run here (None: it can)."""
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "Playwright's Python package is not installed (pip install playwright)"
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        return f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)"
    return None


@dataclass(frozen=True)
class Served:
    """The servers of one UI session: Prefect's UI and API, MLflow's, the deployment."""

    prefect: str  # the UI's base URL (the API is under /api)
    api: str
    mlflow: str
    deployment_id: str
    client: object  # a SyncPrefectClient
    log: Path


@contextmanager
def served(tmp: Path, sets: list[str] = (), log_level: str = "WARNING") -> Iterator[Served]:
    """An MLflow server, a Prefect server with its UI on a free port (the port given as the
    server's setting, so the UI calls the same port), and ``rlhf serve`` of configs/test.yaml
    tracking to that MLflow server, its flow runs logging at ``log_level``."""
    from prefect.client.orchestration import SyncPrefectClient

    (tmp / "mlflow").mkdir(parents=True, exist_ok=True)
    port = free_port()
    ui = {"PREFECT_UI_ENABLED": "true", "PREFECT_SERVER_API_PORT": str(port),
          "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api"}
    with mlflow_server(f"sqlite:///{tmp}/mlflow.db", tmp / "mlflow") as mlflow_url, \
            prefect_server(tmp / "server", ui, port=port) as (api, env):
        env = {**env, "MLFLOW_TRACKING_URI": mlflow_url, "PREFECT_LOGGING_LEVEL": log_level}
        args = ["--config", str(ROOT / "configs" / "test.yaml"), "--name", "test",
                "--set", f"tracking.workdir={tmp}/runs", "--set", "tracking.system_metrics=false"]
        for item in sets:
            args += ["--set", item]
        with rlhf_serve(env, tmp, args) as (proc, log), SyncPrefectClient(api) as client:
            # serve registers its deployments one after another: wait for the last too
            deployment = wait_deployment(client, "rlhf_pipeline/test", proc, log)
            for flow in SERVED_FLOWS[1:]:
                wait_deployment(client, f"{flow}/test", proc, log)
            yield Served(api.removesuffix("/api"), api, mlflow_url, str(deployment.id),
                         client, log)


@contextmanager
def browser() -> Iterator[object]:
    """A page of headless Chromium, 1400 x 1000."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium"),
            args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            yield chromium.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            chromium.close()


def form_section(page, srv: Served, section: str, after: str) -> str:
    """The text of the Custom run form from the section labelled ``section`` up to the one
    labelled ``after`` (e.g. "data" up to "model")."""
    page.goto(f"{srv.prefect}/deployments/deployment/{srv.deployment_id}/run")
    page.wait_for_load_state("networkidle", timeout=60_000)
    page.locator(f"xpath=//*[normalize-space(text())='{after} (Optional)']").wait_for(
        timeout=60_000)
    text = page.inner_text("body")
    start = text.index(f"\n{section} (Optional)\n")
    return text[start: text.index(f"\n{after} (Optional)\n", start)]


def custom_run_form(page, srv: Served) -> str:
    """The whole Custom run form of the pipeline deployment, as text."""
    page.goto(f"{srv.prefect}/deployments/deployment/{srv.deployment_id}/run")
    page.wait_for_load_state("networkidle", timeout=60_000)
    page.locator("xpath=//*[normalize-space(text())='resume_run_id (Optional)']").wait_for(
        timeout=60_000)
    return page.inner_text("body")


def custom_run(page, srv: Served, values: dict[str, str], tries: int = 3) -> str:
    """Deployments -> the pipeline -> Run -> Custom run: set each field labelled as a key of
    ``values`` (e.g. "Kl Coef") to its value, Submit -> the new flow run's id (read from the
    API). A submit that leaves the form where it was (a form still loading on a busy machine,
    or Prefect's "Failed to schedule flow run") is tried again, as a user would."""
    before = {str(r.id) for r in _runs(srv)}
    form = f"{srv.prefect}/deployments/deployment/{srv.deployment_id}/run"
    for _ in range(tries):
        page.goto(form)
        page.wait_for_load_state("networkidle", timeout=60_000)
        typed = True
        for field, value in values.items():
            box = page.locator(f"xpath=//*[normalize-space(text())='{field} (Optional)']"
                               "/following::*[self::input or self::textarea][1]")
            box.wait_for(timeout=60_000)
            box.fill(value)
            page.wait_for_timeout(500)
            typed &= box.input_value() == value
        if not typed:  # the form re-rendered over the typing
            continue
        page.get_by_role("button", name="Submit").last.click()
        deadline = time.time() + 60
        while time.time() < deadline:
            new = [str(r.id) for r in _runs(srv) if str(r.id) not in before]
            if new:
                return new[0]
            time.sleep(0.5)
    raise TimeoutError(f"the Custom run form created no flow run in {tries} tries; the page "
                       f"says: {page.inner_text('body')[-1500:]}")


def quick_run(page, srv: Served, deployment: str, tries: int = 3) -> str:
    """The deployment's page -> Run -> Quick run (no form) -> the new flow run's id; a click
    that creates no run (a page still loading) is tried again."""
    dep_id = str(srv.client.read_deployment_by_name(deployment).id)
    before = {str(r.id) for r in _runs(srv, dep_id)}
    for _ in range(tries):
        page.goto(f"{srv.prefect}/deployments/deployment/{dep_id}")
        page.wait_for_load_state("networkidle", timeout=60_000)
        page.get_by_role("button", name="Run", exact=True).first.click()
        page.get_by_text("Quick run", exact=True).first.click()
        deadline = time.time() + 60
        while time.time() < deadline:
            new = [str(r.id) for r in _runs(srv, dep_id) if str(r.id) not in before]
            if new:
                return new[0]
            if page.get_by_text("Run Deployment", exact=True).count():
                raise AssertionError("Quick run opened the parameters form instead of running")
            time.sleep(0.5)
    raise TimeoutError(f"Quick run of {deployment} created no flow run in {tries} tries")


def _runs(srv: Served, deployment_id: str | None = None) -> list:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    return srv.client.read_flow_runs(deployment_filter=DeploymentFilter(
        id=DeploymentFilterId(any_=[deployment_id or srv.deployment_id])))


def flow_run_page(page, srv: Served, flow_run_id: str, shot: Path | None = None) -> str:
    """The flow run's page (its graph first) -> the page's text; ``shot``: a screenshot."""
    page.goto(f"{srv.prefect}/runs/flow-run/{flow_run_id}")
    page.get_by_text("Task runs", exact=False).first.wait_for(timeout=60_000)
    page.wait_for_timeout(2500)  # the graph draws after the page
    if shot is not None:
        page.screenshot(path=str(shot))
    return page.inner_text("body")


def run_summary(page, srv: Served, flow_run_id: str, shot: Path | None = None) -> str:
    """Artifacts tab -> the run's own summary (``rlhf-run-summary``) -> its page's text."""
    page.goto(f"{srv.prefect}/runs/flow-run/{flow_run_id}")
    page.get_by_text("Artifacts", exact=True).first.click()
    page.get_by_text("rlhf-run-summary", exact=True).first.click()
    page.get_by_text("key figures", exact=False).first.wait_for(timeout=60_000)
    if shot is not None:
        page.screenshot(path=str(shot))
    return page.inner_text("body")


def summary_markdown(srv: Served, flow_run_id: str) -> str:
    """The run's own summary artifact (``rlhf-run-summary``) as markdown, from the API."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    found = srv.client.read_artifacts(artifact_filter=ArtifactFilter(
        flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return next(str(a.data) for a in found if a.key == "rlhf-run-summary")


def mlflow_run_page(page, url: str) -> str:
    """An MLflow run page, opened in a browser that never set the UI's GenAI / Model
    training switch -> its text (the left bar has "Model registry" in Model training mode,
    "Observability" in GenAI mode)."""
    page.goto(url)
    page.evaluate("window.localStorage.clear()")
    page.goto(url)
    page.get_by_text("Model metrics", exact=True).first.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)
    return page.inner_text("body")


def mlflow_param(page, mlflow_url: str, experiment_id: str, run_id: str, key: str) -> str:
    """The MLflow run page's Parameters table, searched for ``key`` -> its value."""
    page.goto(f"{mlflow_url}/#/experiments/{experiment_id}/runs/{run_id}")
    search = page.get_by_placeholder("Search parameters")
    search.wait_for(timeout=60_000)
    search.fill(key)
    cell = page.get_by_text(key, exact=True).first
    cell.wait_for(timeout=30_000)
    row = cell.locator("xpath=ancestor::*[@role='row'][1]").inner_text().split("\n")
    return row[row.index(key) + 1]


def mlflow_compare(page, mlflow_url: str, experiment_id: str, run_ids: list[str],
                   shot: Path | None = None) -> str:
    """MLflow's compare view of ``run_ids`` -> its text; ``shot``: a screenshot."""
    ids = ",".join(f'"{r}"' for r in run_ids)
    page.goto(f"{mlflow_url}/#/compare-runs?runs=[{ids}]&experiments=[\"{experiment_id}\"]")
    page.get_by_text("Parameters", exact=False).first.wait_for(timeout=60_000)
    page.wait_for_timeout(2000)
    if shot is not None:
        page.screenshot(path=str(shot), full_page=True)
    return page.inner_text("body")


def approval_form(page, srv: Served, flow_run_id: str, shot: Path | None = None) -> str:
    """A suspended flow run's page -> Resume -> the form's text (the evidence above it);
    ``shot``: a screenshot of the form, the page made tall enough to show it whole."""
    if shot is not None:
        page.set_viewport_size({"width": 1400, "height": 1800})
    page.goto(f"{srv.prefect}/runs/flow-run/{flow_run_id}")
    page.get_by_role("button", name="Resume").first.click()
    page.get_by_text("Resume Flow Run", exact=True).wait_for(timeout=60_000)
    page.get_by_text("Reason", exact=True).wait_for(timeout=60_000)
    page.wait_for_timeout(1000)
    if shot is not None:  # the form alone: from its title to its buttons
        top = page.get_by_text("Resume Flow Run", exact=True).bounding_box()
        end = page.get_by_role("button", name="Submit").last.bounding_box()
        left, bottom = top["x"] - 20, end["y"] + end["height"] + 20
        page.screenshot(path=str(shot), clip={
            "x": left, "y": top["y"] - 20, "width": end["x"] + end["width"] + 20 - left,
            "height": bottom - top["y"] + 20})
        page.set_viewport_size({"width": 1400, "height": 1000})
    return _dialog_text(page)


def _dialog_text(page) -> str:
    """The open dialog's text, else the page's."""
    return page.locator("[role=dialog]").last.inner_text() if page.locator(
        "[role=dialog]").count() else page.inner_text("body")


def answer_form(page, decision: str, reason: str) -> None:
    """In the open Resume form: choose ``decision`` (Approve or Reject), type ``reason``,
    Submit, and wait until the form has closed (the server took the answer). On a loaded
    machine a choice or a click can be lost while the form is still settling: the answer is
    given again, up to three times, and a form still open after that raises with what it
    shows, instead of leaving the run waiting."""
    select = page.locator(".p-select-button__control").last
    title = page.get_by_text("Resume Flow Run", exact=True)
    shown = ""
    for _ in range(3):
        for _ in range(5):
            select.focus()  # a click leaves the options closed; the arrow key opens them
            page.keyboard.press("ArrowDown")
            page.get_by_role("option", name=decision, exact=True).click()
            page.wait_for_timeout(300)
            if decision in select.inner_text():
                break
        page.locator("textarea").last.fill(reason)
        page.get_by_role("button", name="Submit").last.click()
        try:
            title.wait_for(state="hidden", timeout=30_000)
            return
        except Exception:  # playwright's TimeoutError: the form is still open
            shown = _dialog_text(page)
    raise AssertionError(f"the Resume form is still open after three answers: {shown}")
