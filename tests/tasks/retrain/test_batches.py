"""tasks/retrain/batches.py with MLflow at tmp_path: ``rm_data: cumulative`` trains the reward
model on the configured pairs + every batch consumed before (read back from the watch folder, or
from the copy its consuming run logged when the file is gone) + the new batches; ``new_only`` on
the new batches alone; each batch's source is named (lineage)."""

from __future__ import annotations

import json

import pandas as pd
from mlflow.tracking import MlflowClient

from data_checks.config import DataConfig, DataSource
from tasks.config.pipeline_config import load_config
from tasks.pipeline.prepare import Prepared
from tasks.platform.mlflow.runs import RunContext
from tasks.platform.mlflow.tags import CONSUMED_TAG
from tasks.retrain.batches import (
    add_batches,
    file_digest,
    find_batches,
    mark_consumed,
    write_round_pairs,
)
from tasks.retrain.gate.champion import Champion
from tasks.retrain.labels.collect import experiment_for
from tasks.retrain.records import Batch
from tests.shared import TEST_CONFIG

CHAMPION = Champion(version="1", sft_run_id="r", ancestry="v1", policy_dir="x", rm_dir="x/rm",
                    sft_dir="x/sft")


def _pairs(path, tag: str, n: int):
    rows = [{"prompt": f"{tag} p{i}", "chosen": f"{tag} good {i}", "rejected": f"{tag} bad {i}"}
            for i in range(n)]
    pd.DataFrame(rows).to_json(path, orient="records", lines=True)
    return path


def _consume(client, exp_id, paths, tmp_path):
    """A finished retrain run that consumed ``paths`` (tag and file copies, as a retrain)."""
    run = client.create_run(exp_id)
    ctx = RunContext(tracking_uri=client.tracking_uri, experiment_id=exp_id,
                     parent_run_id=run.info.run_id, workdir=str(tmp_path / "w"), seed=0)
    mark_consumed.fn(ctx, [Batch(name=p.name, path=str(p), digest=file_digest(p))
                           for p in paths])
    client.set_terminated(run.info.run_id)


def _setup(tmp_path, rm_data="cumulative"):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    watch = tmp_path / "watch"
    watch.mkdir()
    cfg = load_config(TEST_CONFIG, [f"tracking.tracking_uri={uri}",
                                    f"retrain.watch_dir={watch}", f"retrain.rm_data={rm_data}",
                                    "retrain.gate.min_prompts=1", "retrain.gate.num_prompts=1"])
    client = MlflowClient(uri)
    exp_id = experiment_for(client, cfg)
    first, second = _pairs(watch / "a.jsonl", "first", 3), _pairs(watch / "b.jsonl", "second", 4)
    _consume(client, exp_id, [first], tmp_path)
    _consume(client, exp_id, [second], tmp_path)
    first.unlink()  # gone from the folder: its copy in MLflow must serve
    _pairs(watch / "c.jsonl", "new", 5)
    base = _pairs(tmp_path / "base.jsonl", "base", 2)
    pd.DataFrame([{"prompt": "q"}]).to_json(tmp_path / "ev.jsonl", orient="records",
                                            lines=True)
    data = DataConfig(sft=DataSource(path=str(base)), preference=DataSource(path=str(base)),
                      prompts=DataSource(path=str(tmp_path / "ev.jsonl")),
                      eval_prompts=DataSource(path=str(tmp_path / "ev.jsonl")))
    run = client.create_run(exp_id)
    ctx = RunContext(tracking_uri=uri, experiment_id=exp_id, parent_run_id=run.info.run_id,
                     workdir=str(tmp_path / "w2"), seed=0)
    return cfg, client, ctx, Prepared(ctx=ctx, data=data, base_model="b", tokenizer="b",
                                      judge="none")


def _prompts(out):
    path = out.data.preference.path
    return [json.loads(x)["prompt"].split()[0] for x in open(path)]


def test_cumulative_trains_on_every_consumed_batch_even_one_whose_file_is_gone(tmp_path):
    cfg, client, ctx, prep = _setup(tmp_path)
    batches = find_batches.fn(cfg)
    assert [b.name for b in batches.new] == ["c.jsonl"]
    gone, kept = batches.consumed  # in the order consumed, the file gone or not
    assert (gone.name, kept.name) == (f"consumed-{gone.digest}", "b.jsonl")
    assert kept.path and gone.path is None
    assert gone.run_id and kept.run_id  # the runs that keep their copies
    out = add_batches.fn(ctx, cfg, prep, batches.new, CHAMPION,
                         batches.consumed)
    names = _prompts(out)
    assert names.count("base") == 2 and names.count("second") == 4
    assert names.count("first") == 3 and names.count("new") == 5  # read from MLflow
    assert len(out.trained_on) == 3
    tags = client.get_run(ctx.parent_run_id).data.tags
    assert json.loads(tags["rlhf.trained_on"]) == out.trained_on
    assert set(json.loads(tags["rlhf.batch_sources"]).values()) == {"offline"}
    assert CONSUMED_TAG not in tags  # consumed only once the retrain finished


def test_new_only_trains_on_the_new_batches_alone(tmp_path):
    cfg, _, ctx, prep = _setup(tmp_path, "new_only")
    batches = find_batches.fn(cfg)
    out = add_batches.fn(ctx, cfg, prep, batches.new, CHAMPION,
                         batches.consumed)
    assert _prompts(out) == ["new"] * 5


def test_a_rounds_file_is_the_last_rounds_with_the_new_batches_appended(tmp_path,
                                                                         monkeypatch):
    """So the next round's gate reads the last one's chunks from the validation cache: the
    consumed batches in the order consumed (a file that left the folder keeps its place, a
    consumed file named to sort first does not move), the configured pairs streamed."""
    import tasks.retrain.batches as batches_module

    monkeypatch.setattr(batches_module, "COMBINE_ROWS", 1)  # the configured pairs row by row
    cfg, client, ctx, prep = _setup(tmp_path)
    batches = find_batches.fn(cfg)
    last = add_batches.fn(ctx, cfg, prep, batches.new, CHAMPION, batches.consumed)
    last_text = open(last.data.preference.path).read()
    assert _prompts(last) == ["base"] * 2 + ["first"] * 3 + ["second"] * 4 + ["new"] * 5
    assert [(r["first"], r["last"]) for r in last.batch_rows] == [(3, 5), (6, 9), (10, 14)]
    _consume(client, experiment_for(client, cfg), [tmp_path / "watch" / "c.jsonl"], tmp_path)
    (tmp_path / "watch" / "b.jsonl").rename(tmp_path / "watch" / "0-b.jsonl")
    _pairs(tmp_path / "watch" / "d.jsonl", "newer", 2)
    batches = find_batches.fn(cfg)
    ctx = ctx.model_copy(update={"workdir": str(tmp_path / "w3")})
    out = add_batches.fn(ctx, cfg, prep, batches.new, CHAMPION, batches.consumed)
    text = open(out.data.preference.path).read()
    assert text.startswith(last_text) and _prompts(out)[14:] == ["newer"] * 2


def test_a_batch_pair_written_before_is_left_out_of_the_rounds_file(tmp_path, capsys):
    """A model's short answers repeat: a batch pair equal to a configured pair, to an earlier
    batch's or to one earlier in its batch is written once, and the rows name what is left."""
    configured = _pairs(tmp_path / "pref.jsonl", "c", 3)
    first = pd.read_json(_pairs(tmp_path / "b1.jsonl", "b", 2), lines=True)
    again = pd.concat([first.iloc[[1]], pd.read_json(configured, lines=True).iloc[[0]],
                       pd.read_json(_pairs(tmp_path / "b2.jsonl", "n", 1), lines=True)])
    again = pd.concat([again, again.iloc[[2]]])  # the new pair twice in its batch
    out = tmp_path / "round.jsonl"
    rows = write_round_pairs(out, DataSource(path=str(configured)),
                             [("b1", first), ("b2", again), ("b3", first)])
    written = pd.read_json(out, lines=True)
    assert written["prompt"].tolist() == ["c p0", "c p1", "c p2", "b p0", "b p1", "n p0"]
    assert rows == [{"name": "b1", "first": 4, "last": 5}, {"name": "b2", "first": 6, "last": 6}]
    said = capsys.readouterr().out
    assert "batch b2: 3 of its pairs repeat" in said and "batch b3: 2 of its pairs" in said
