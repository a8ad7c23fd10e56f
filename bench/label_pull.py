"""Speed of `rlhf label pull` against a running Label Studio server (docs/retraining.md): a
collection of N pairs (a record written to a fresh MLflow store, no model sampled) is sent to
a new project, annotated through the API as three accounts (made when missing; the key's
account must own the organisation), then pulled; reports the send, annotate and pull walls
(median over ``--repeats`` fresh collections) and what a second pull of the same collection
takes.

    LABEL_STUDIO_URL=http://127.0.0.1:8080 LABEL_STUDIO_API_KEY=... \\
        python bench/label_pull.py --pairs 200 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tasks.config.pipeline_config import load_config  # noqa: E402
from tasks.platform.mlflow.runs import tracking_client  # noqa: E402
from tasks.platform.mlflow.tags import COLLECTION_TAG  # noqa: E402
from tasks.retrain.labels import imports as labels  # noqa: E402
from tasks.retrain.labels import pull  # noqa: E402
from tasks.retrain.labels.client import LabelStudio  # noqa: E402
from tasks.retrain.labels.collect import experiment_for  # noqa: E402
from tasks.retrain.labels.studio import accounts, send, vote  # noqa: E402
from tasks.retrain.store import RECORD  # noqa: E402

LABELLERS = ("bench-1@rlhf.bench", "bench-2@rlhf.bench", "bench-3@rlhf.bench")
CONFIG = Path(__file__).resolve().parent.parent / "configs" / "test.yaml"


def one(cfg, client, pairs: int, known: int) -> dict[str, float]:
    cid = f"v1-{uuid.uuid4().hex[:8]}"
    record = [{"id": f"{cid}-{i:04d}", "prompt": f"prompt {i}", "response_a": f"a {i}",
               "response_b": f"b {i}", "known": ("a" if i % 2 else "b") if i < known else None,
               "rm_a": 1.0, "rm_b": 0.0} for i in range(pairs)]
    run = client.create_run(experiment_for(client, cfg), tags={COLLECTION_TAG: cid})
    client.log_dict(run.info.run_id, record, RECORD)
    t0 = time.perf_counter()
    link = send(cfg, client, run.info.run_id, cid, record)
    client.set_terminated(run.info.run_id)
    t1 = time.perf_counter()
    ls = LabelStudio.from_env(cfg.collect.destination.url)
    ids = accounts(ls, list(LABELLERS))
    for task_id, pair_id in link.tasks.items():
        i = int(pair_id.rsplit("-", 1)[1])
        for email in LABELLERS:
            vote(ls, task_id, ("a" if i % 2 else "b") if i < known else "a", ids[email])
    t2 = time.perf_counter()
    (first,) = pull.pull(cfg, cid)
    t3 = time.perf_counter()
    (second,) = pull.pull(cfg, cid)
    t4 = time.perf_counter()
    assert first.status in ("imported", "quarantined"), first.text()
    assert second.status == "done", second.text()
    return {"send_s": t1 - t0, "annotate_s": t2 - t1, "pull_s": t3 - t2,
            "second_pull_s": t4 - t3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=200)
    ap.add_argument("--known", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="label-pull-"))
    uri = f"sqlite:///{tmp}/mlflow.db"
    cfg = load_config(CONFIG, [f"tracking.tracking_uri={uri}", f"retrain.watch_dir={tmp}/w",
                               f"collect.out_dir={tmp}/to_label",
                               "collect.destination.kind=label_studio",
                               f"collect.destination.project=bench {uuid.uuid4().hex[:6]}",
                               "collect.destination.annotations_per_task=3"])
    labels.emit = lambda *a, **k: None  # no Prefect API here: events are not timed
    client = tracking_client(uri)
    rows = [one(cfg, client, args.pairs, args.known) for _ in range(args.repeats)]
    for key in rows[0]:
        vals = [r[key] for r in rows]
        print(f"{key:>14}: median {statistics.median(vals):6.2f} s  (min {min(vals):.2f}, "
              f"max {max(vals):.2f}; {args.pairs} tasks x {len(LABELLERS)} annotations)")


if __name__ == "__main__":
    main()
