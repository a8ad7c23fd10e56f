"""The stages read the gate's token ids (tasks/pipeline/stages/token_data.py,
data/<name>.tokens.arrow) instead of tokenizing the texts again: the same batches as the per-text
encoding for SFT, the reward model, reward normalisation and PPO's prompts; a stale token file is an
error; and an SFT stage killed mid-run over a few hundred rows resumes without tokenizing, to the
uninterrupted run's weights."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from data_checks.tokens import tokens_path
from rlhf_core.models.loader import load_tokenizer
from rlhf_core.models.ragged import Joined
from rlhf_core.train.sft import sft_batch
from tasks.config.pipeline_config import load_config
from tasks.pipeline.prepare import Prepared
from tasks.pipeline.stages.table import STAGES
from tasks.pipeline.stages.token_data import preference_pairs, sft_examples, text_ids
from tasks.platform.mlflow.runs import RunContext
from tests.conftest import WORDS
from tests.fake_stage import FakeStageContext
from tests.shared import write_config, write_jsonl

N = 300  # rows per set: several hundred, above one record batch of a chunked gate


def _text(rng: random.Random, most: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, most + 1)))


def _rows(seed: int):
    rng = random.Random(seed)
    sft = [{"prompt": _text(rng, 6), "response": _text(rng, 7)} for _ in range(N)]
    pref = [{"prompt": _text(rng, 6), "chosen": _text(rng, 7), "rejected": _text(rng, 7)}
            for _ in range(N)]
    prompts = [{"prompt": _text(rng, 7)} for _ in range(N)]
    return sft, pref, prompts


class Spy:
    """Counts the tokenizer's text calls (what encode makes)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = PreTrainedTokenizerBase.__call__

        def counted(tok, *args, **kwargs):
            self.calls += 1
            return real(tok, *args, **kwargs)

        monkeypatch.setattr(PreTrainedTokenizerBase, "__call__", counted)


@pytest.fixture(scope="module")
def gated(tmp_path_factory, tiny_model_dir):
    """(cfg, prep, the validate record) over N rows per set."""
    tmp = tmp_path_factory.mktemp("token_ids")
    sft, pref, prompts = _rows(0)
    path = write_config(tmp, tiny_model_dir, pref=pref)
    write_jsonl(tmp / "sft.jsonl", sft)
    write_jsonl(tmp / "prompts.jsonl", prompts)
    cfg = load_config(path, ["seed=3", "sft.batch_size=4", "sft.epochs=0.08",
                             "sft.checkpoint_every=2", "sft.log_every=1"])
    ctx = RunContext(tracking_uri=f"sqlite:///{tmp}/mlflow.db", experiment_id="0",
                     parent_run_id="parent", workdir=str(tmp / "work"), seed=cfg.seed)
    prep = Prepared(ctx=ctx, data=cfg.data, base_model=str(tiny_model_dir),
                    tokenizer=str(tiny_model_dir), judge="none")
    sc = FakeStageContext(cfg, "validate", tmp / "work", seed=cfg.seed)
    return cfg, prep, STAGES["validate"].body(sc, prep=prep)


def _without_tokens(data_dir: Path, tmp_path: Path, name: str) -> Path:
    """A copy of a cleaned file with no token file beside it (an older run's)."""
    copy = tmp_path / f"{name}.jsonl"
    shutil.copy(data_dir / f"{name}.jsonl", copy)
    return copy


def test_each_stage_gets_the_same_batches_from_the_ids_as_from_the_texts(gated, tmp_path,
                                                                          monkeypatch):
    cfg, _, data = gated
    data_dir, tok = Path(data.data.path), load_tokenizer(data.tokenizer.path)
    for name in ("sft", "preference", "prompts"):
        assert tokens_path(data_dir / f"{name}.jsonl").is_file(), name
    spy = Spy(monkeypatch)
    sft = sft_examples(data_dir / "sft.jsonl", tok, "response")
    pairs = preference_pairs(data_dir / "preference.jsonl", tok)
    prompts = text_ids(data_dir / "prompts.jsonl", ("prompt",), tok)[0]
    norm = Joined(text_ids(data_dir / "sft.jsonl", ("prompt", "response"), tok),
                  [tok.eos_token_id])
    seen = [sft[i] for i in range(len(sft))], [pairs[i] for i in range(len(pairs))], \
        list(prompts), list(norm)
    assert spy.calls == 0  # read, not tokenized
    assert len(sft) > 250 and len(pairs) > 250 and len(prompts) > 250  # nothing lost
    texts = (sft_examples(_without_tokens(data_dir, tmp_path, "sft"), tok, "response"),
             preference_pairs(_without_tokens(data_dir, tmp_path, "preference"), tok),
             text_ids(_without_tokens(data_dir, tmp_path, "prompts"), ("prompt",), tok)[0])
    assert spy.calls > 0  # the fallback encodes
    assert seen[0] == list(texts[0]) and seen[1] == list(texts[1])
    assert seen[2] == list(texts[2])
    assert seen[3] == [ids for ids, _ in (texts[0].with_loss_on("all")[i]
                                          for i in range(len(texts[0])))]
    idx = torch.randperm(len(sft), generator=torch.Generator().manual_seed(0))[:16].tolist()
    for got, want in zip(sft_batch([sft[i] for i in idx], tok.pad_token_id, "cpu"),
                         sft_batch([texts[0][i] for i in idx], tok.pad_token_id, "cpu")):
        assert torch.equal(got, want)


def test_a_token_file_of_other_data_is_refused_naming_it(gated, tmp_path):
    _, _, data = gated
    data_dir, tok = Path(data.data.path), load_tokenizer(data.tokenizer.path)
    cleaned = _without_tokens(data_dir, tmp_path, "sft")
    cleaned.write_text("".join(cleaned.read_text().splitlines(keepends=True)[:-1]))
    shutil.copy(tokens_path(data_dir / "sft.jsonl"), tokens_path(cleaned))
    with pytest.raises(ValueError, match=r"sft\.tokens\.arrow: \d+ rows of token ids"):
        sft_examples(cleaned, tok, "response")


class Interrupt(Exception):
    pass


def _sft(cfg, prep, data, work: Path, stop_at: int | None = None):
    sc = FakeStageContext(cfg, "sft", work, seed=cfg.seed)
    if stop_at is not None:
        def live(total):
            def on_log(step, metrics):
                if step == stop_at:
                    raise Interrupt(step)
            return on_log
        sc.live = live
    return sc, STAGES["sft"].body(sc, prep=prep, data=data)


@pytest.mark.slow
def test_sft_killed_mid_run_resumes_from_the_token_ids_to_the_same_weights(gated, tmp_path,
                                                                           monkeypatch):
    cfg, prep, data = gated
    _, reference = _sft(cfg, prep, data, tmp_path / "a")
    spy = Spy(monkeypatch)
    with pytest.raises(Interrupt):
        _sft(cfg, prep, data, tmp_path / "b", stop_at=5)  # 6 steps, saved at 2 and 4
    assert max(p.name for p in (tmp_path / "b").rglob("step_*")) == "step_00000004"
    sc, resumed = _sft(cfg, prep, data, tmp_path / "b")
    assert min(step for step in sc.metrics if step > 0) == 5  # went on from the checkpoint
    assert spy.calls == 0  # neither run tokenized a text
    weights = [(Path(r.model.path) / "model.safetensors").read_bytes()
               for r in (reference, resumed)]
    assert weights[0] == weights[1]


def test_the_judge_split_gives_each_part_its_own_rows_token_ids(tmp_path):
    """The split rewrites preference.jsonl: the whole set's token file copied beside it would
    belong to other rows; each part gets its rows' ids instead."""
    import json

    import pyarrow as pa
    from mlflow.tracking import MlflowClient

    from data_checks.tokens import read_tokens, write_tokens
    from tasks.pipeline.stages.judge_model import judge_split
    from tasks.pipeline.stages.records import Artifact, DataRecord
    from tests.shared import TEST_CONFIG

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("gate")
    ctx = RunContext(tracking_uri=uri, experiment_id=exp,
                     parent_run_id=client.create_run(exp).info.run_id,
                     workdir=str(tmp_path / "w"), seed=0)
    src = tmp_path / "data"
    src.mkdir()
    rows = [{"prompt": f"p{i}", "chosen": f"good {i}", "rejected": f"bad {i}"}
            for i in range(300)]
    (src / "preference.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ids = pa.array([[i] for i in range(300)], type=pa.list_(pa.int32()))
    write_tokens(pa.table({"prompt_ids": ids, "chosen_ids": ids, "rejected_ids": ids}),
                 tokens_path(src / "preference.jsonl"))
    cfg = load_config(TEST_CONFIG, ["retrain.gate.judge_fraction=0.25"])
    out = judge_split.fn(ctx, cfg, DataRecord(data=Artifact(path=str(src)),
                                              tokenizer=Artifact(path="t")))
    for name in ("preference", "judge_preference"):
        cleaned = Path(out.data.path) / f"{name}.jsonl"
        written = [int(json.loads(x)["prompt"][1:]) for x in open(cleaned)]
        table = read_tokens(tokens_path(cleaned))
        assert 0 < len(written) < 300
        assert table.column("chosen_ids").to_pylist() == [[i] for i in written], name


def test_the_reward_models_split_takes_ids_and_margins_of_the_same_rows(tmp_path):
    """No held-out file: the first eval_fraction of the pairs are held out, the rest train,
    with their margins (reward.use_margin) read from the same rows as the ids."""
    import pyarrow as pa

    from data_checks.tokens import write_tokens
    from rlhf_core.config import RewardConfig
    from rlhf_core.models.data import encode
    from tasks.pipeline.stages.reward_model import preference_split
    from tests.conftest import encode_pair, make_tokenizer

    tok = make_tokenizer()
    rng = random.Random(1)
    rows = [{"prompt": _text(rng, 5), "chosen": _text(rng, 5), "rejected": _text(rng, 5),
             "margin": float(i)} for i in range(40)]
    write_jsonl(tmp_path / "preference.jsonl", rows)
    write_tokens(pa.table({f"{c}_ids": [encode(tok, r[c]) for r in rows]
                           for c in ("prompt", "chosen", "rejected")}),
                 tokens_path(tmp_path / "preference.jsonl"))
    split = preference_split(tmp_path, tok, RewardConfig(use_margin=True, eval_fraction=0.25))
    pairs = [encode_pair(tok, r["prompt"], r["chosen"], r["rejected"]) for r in rows]
    assert list(split.held_out) == pairs[:10] and list(split.train) == pairs[10:]
    assert split.margins.tolist() == [r["margin"] for r in rows[10:]]
    assert split.held_rows() == rows[:10]
