"""The README's pictures of the UIs, taken as a newcomer gets there (headless Chromium through
Playwright's Python package, Debian's ``chromium``): two Custom runs of the served pipeline
(configs/test.yaml) from the Prefect form, with ppo -> kl_coef 0.07 and 0.1; the second's flow
run page (its graph) and its summary artifact; MLflow's compare view of the two parent runs.

    python bench/ui_screenshots.py --out docs/img
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import ui  # noqa: E402
from tests.flows.prefect_procs import wait_run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/img"))
    args = ap.parse_args()
    if ui.missing():
        sys.exit(ui.missing())
    from mlflow.tracking import MlflowClient

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, ui.served(Path(tmp)) as srv, \
            ui.browser() as page:
        runs = []
        for value in ("0.07", "0.1"):
            run = wait_run(srv.client, ui.custom_run(page, srv, {"Kl Coef": value}), 400)
            print(run.name, run.state.type.value)
            runs.append(run)
        ui.flow_run_page(page, srv, str(runs[-1].id), args.out / "prefect-flow-run.png")
        ui.run_summary(page, srv, str(runs[-1].id), args.out / "prefect-run-summary.png")
        mlflow = MlflowClient(srv.mlflow)
        exp = mlflow.get_experiment_by_name("rlhf-test").experiment_id
        parents = [mlflow.search_runs([exp], filter_string=(
            f"tags.`rlhf.prefect_flow_run_id` = '{r.id}'"))[0].info.run_id for r in runs]
        ui.mlflow_compare(page, srv.mlflow, exp, parents, args.out / "mlflow-compare.png")
    print(f"screenshots in {args.out}")


if __name__ == "__main__":
    main()
