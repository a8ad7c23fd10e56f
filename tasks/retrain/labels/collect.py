"""`collect`: sample a registered policy k times on fresh prompts of a pool and write a
labelling file (JSONL and CSV, one row per pair, an empty ``choice`` column).

Prompts are rendered and budgeted exactly as the run's data gate does, so a labelled batch
passes the gate. Each collection is one MLflow run holding the file, the prompts it used
(later collections skip them) and the pairs' record that an import checks labels against.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from prefect import task
from prefect.artifacts import create_table_artifact

from data_checks.adapters import is_conversational, render_chunks, start_chat
from data_checks.config import DataSource
from data_checks.loading import KINDS, DataError, iter_table, load_table
from rlhf_core.config import Sampling
from rlhf_core.demo import chat_row, training_prompts
from rlhf_core.eval.collect import (
    Prompt,
    fresh_prompts,
    gold_known,
    judged_known,
    pair_up,
    pool_order,
    prompt_key,
    prompt_text,
    shuffled_with_known,
)
from tasks.config.pipeline_config import PipelineConfig
from tasks.pipeline.judge import config_judge_name, gold_judge
from tasks.pipeline.prepare import setup_models
from tasks.platform.mlflow import registry
from tasks.platform.mlflow.addresses import default_tracking_uri
from tasks.platform.mlflow.artifacts import TableInput, log_table_inputs
from tasks.platform.mlflow.runs import (
    end_run,
    ensure_experiment,
    log_metrics,
    log_params,
    set_tags,
    tracking_client,
)
from tasks.platform.mlflow.tags import (
    COLLECTION_FILE_TAG,
    COLLECTION_POLICY_TAG,
    COLLECTION_POOL_DIGEST_TAG,
    COLLECTION_POOL_TAG,
    COLLECTION_TAG,
    POLICY_VERSION_INPUT_TAG,
)
from tasks.platform.prefect import events
from tasks.platform.prefect.prefect_api import in_prefect_run
from tasks.retrain.gate.champion import resolve_version
from tasks.retrain.labels.studio import send
from tasks.retrain.records import CollectResult
from tasks.retrain.store import log_collection_files, open_collection_run, pool_prompts_used

KNOWN_GAP = 2.0  # judge points between a known-answer pair's sides (clear cases only)
LABEL_COLUMNS = ("id", "prompt", "response_a", "response_b", "policy", "policy_version",
                 "temperature", "max_new_tokens", "choice", "labeller")


def conversational_run(cfg: PipelineConfig) -> bool:
    """Whether the data gate renders prompts with the chat template (any configured set is
    conversational, or ``demo.chat``)."""
    if cfg.data is None:
        return cfg.demo.enabled and cfg.demo.chat
    for name, kind in KINDS.items():
        source = getattr(cfg.data, name)
        if source is None:
            continue
        with closing(iter_table(source, kind, 1)) as rows:
            first = next(rows, None)
        if first is not None and is_conversational(first):
            return True
    return False


def prompt_pool(cfg: PipelineConfig) -> tuple[str, list[Prompt]]:
    """(pool name, distinct prompts in collection order) from ``collect.prompts``, else
    ``data.prompts``, else the demo's; in a conversational run a plain prompt becomes one
    user message, as the gate reads it."""
    path = cfg.collect.prompts or (cfg.data.prompts.path if cfg.data is not None else None)
    chat = conversational_run(cfg)
    if path is not None:
        prompts = load_table(DataSource(path=path), "prompts")["prompt"].tolist()
        prompts = [[{"role": "user", "content": p}] if chat and isinstance(p, str)
                   else p if isinstance(p, str) else [dict(m) for m in p] for p in prompts]
        return str(path), pool_order(prompts, cfg.seed)
    prompts = [chat_row({"prompt": p}, cfg.demo.system)["prompt"] if chat else p
               for p in training_prompts()]
    return "demo training prompts", pool_order(prompts, cfg.seed)


def rendered_prompts(cfg: PipelineConfig, tokenizer, prompts: list[Prompt]) -> list[str | None]:
    """Each prompt as the data gate renders it, None where over ``validation.max_prompt_tokens``
    (cutting it would make another prompt); DataError when the chat template cannot render one."""
    from rlhf_core.models.data import encode

    texts = list(prompts)
    if any(not isinstance(p, str) for p in prompts):
        from rlhf_core.models import chat

        where = "the collection's prompts"
        try:
            info = start_chat(tokenizer, chat, where)
            frame = pd.DataFrame({"prompt": list(prompts)})
            texts = next(render_chunks([frame], "prompts", tokenizer, chat, info, where,
                                       converted=True))["prompt"].tolist()
        except ValueError as err:
            raise DataError(str(err)) from None
    budget = cfg.validation.max_prompt_tokens
    return [t if len(encode(tokenizer, t)) <= budget else None for t in texts]


@dataclass(frozen=True)
class Sampled:
    """What :func:`sample_k` drew for the prompts within budget: responses, RM scores and
    response-budget fits, each [n][k]; ``over_budget``: prompts left out."""

    prompts: list
    responses: list[list[str]]
    scores: list[list[float]]
    fits: list[list[bool]]
    over_budget: int


def sample_k(cfg: PipelineConfig, dirs: dict, prompts: list[Prompt], seed: int) -> Sampled:
    """k responses per prompt and the reward-model score of each. Model code is imported
    here so a label import or pull, which imports this module, never loads it."""
    from rlhf_core.eval.evaluate import sample_policy
    from rlhf_core.models.data import encode
    from rlhf_core.models.loader import load_pretrained, load_tokenizer
    from rlhf_core.train.optim import seed_everything

    c, k = cfg.collect, cfg.collect.k
    device, spec = setup_models(cfg.model)
    tokenizer = load_tokenizer(dirs["policy_dir"], spec)
    texts = rendered_prompts(cfg, tokenizer, prompts)
    kept = [(p, t) for p, t in zip(prompts, texts) if t is not None]
    if not kept:
        return Sampled([], [], [], [], len(prompts))
    policy = load_pretrained(dirs["policy_dir"], spec, trainable=False).to(device)
    rm = load_pretrained(dirs["rm_dir"], spec, "scalar", trainable=False).to(device)
    seed_everything(seed)
    sampling = Sampling(temperature=c.temperature,
                        max_new_tokens=c.max_new_tokens or cfg.ppo.max_new_tokens,
                        batch_size=c.batch_size)
    out = sample_policy(policy, None, rm, tokenizer, [t for _, t in kept for _ in range(k)],
                        sampling, device=device, precision=spec.precision)
    budget = cfg.validation.max_response_tokens  # EOS included, as the gate counts
    responses = [out["response"][i * k:(i + 1) * k] for i in range(len(kept))]
    return Sampled([p for p, _ in kept], responses,
                   [out["score"][i * k:(i + 1) * k] for i in range(len(kept))],
                   [[len(encode(tokenizer, r)) + 1 <= budget for r in row] for row in responses],
                   len(prompts) - len(kept))


def _known_pairs(cfg: PipelineConfig, pairs: list[dict], prompts: list[Prompt],
                 seed: int) -> list[dict]:
    """Known-answer pairs from ``collect.gold``, else clear pairs the gold judge picks (taken
    out of ``pairs``, topped up with its own when too few); none without either."""
    n = cfg.collect.known_pairs
    if n == 0:
        return []
    if cfg.collect.gold:
        gold = load_table(DataSource(path=cfg.collect.gold), "preference").to_dict("records")
        known, answers = gold_known(gold, n, seed)
        return [{**p, "known": a} for p, a in zip(known, answers)]
    judge = gold_judge(config_judge_name(cfg))
    if judge is None:
        return []
    picked = judged_known(pairs, judge.score, n, KNOWN_GAP, seed)
    known = [{**pairs[i], "known": answer} for i, answer in picked.items()]
    for i in sorted(picked, reverse=True):
        del pairs[i]
    if len(known) < n:  # the judge reads the words; the pair keeps the prompt as pooled
        texts = {prompt_text(p): p for p in prompts}
        known += [{**pair, "prompt": texts[pair["prompt"]]} for pair in
                  judge.clear_pairs(list(texts), n - len(known), KNOWN_GAP, seed)]
    return known


def build_record(cfg: PipelineConfig, cid: str, prompts: list[Prompt], responses, scores,
                 seed: int, fits=None) -> tuple[list[dict], dict]:
    """Pairs (known-answer ones mixed in) with ids, RM scores and hidden answers; ``fits``
    [n][k]: which responses fit the gate's response budget (None: all)."""
    pairs, counts = pair_up(prompts, responses, fits)
    score_of = {(prompt_key(p), i): s for p, row in zip(prompts, scores) for i, s in enumerate(row)}
    for p in pairs:
        key = prompt_key(p["prompt"])
        p["rm_a"] = score_of[(key, p.pop("index_a"))]
        p["rm_b"] = score_of[(key, p.pop("index_b"))]
    known = _known_pairs(cfg, pairs, prompts, seed)
    rows = shuffled_with_known(pairs, known, seed)
    for i, r in enumerate(rows):
        r["id"] = f"{cid}-{i:04d}"
        r.setdefault("known", None)
    counts.update(known=len(known), rows=len(rows))
    return rows, counts


def write_labelling(out_dir: Path, cid: str, rows: list[dict], meta: dict) -> dict[str, Path]:
    """``<cid>.jsonl`` and ``<cid>.csv``: one row per pair, ``choice`` and ``labeller``
    empty for the labellers to fill."""
    out_dir.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame([{"id": r["id"], "prompt": r["prompt"], "response_a": r["response_a"],
                           "response_b": r["response_b"], **meta, "choice": "",
                           "labeller": ""} for r in rows], columns=list(LABEL_COLUMNS))
    paths = {"jsonl": out_dir / f"{cid}.jsonl", "csv": out_dir / f"{cid}.csv"}
    table.to_json(paths["jsonl"], orient="records", lines=True, force_ascii=False)
    table["prompt"] = table["prompt"].map(  # a conversation's messages as JSON text
        lambda p: p if isinstance(p, str) else json.dumps(p, ensure_ascii=False))
    table.to_csv(paths["csv"], index=False)
    return paths


def experiment_for(client, cfg: PipelineConfig) -> str:
    uri = default_tracking_uri(cfg.tracking.tracking_uri)
    return ensure_experiment(client, cfg.tracking.experiment, uri)


@task(name="collect")
def collect(cfg: PipelineConfig) -> CollectResult:
    """Sample ``collect.policy`` on the pool's next fresh prompts; write the labelling file
    to ``collect.out_dir``; record it in MLflow -> paths, counts, the collection run."""
    c, start = cfg.collect, time.perf_counter()
    client = tracking_client(default_tracking_uri(cfg.tracking.tracking_uri))
    name = cfg.tracking.registered_policy
    version = resolve_version(client, name, c.policy)
    pool_name, pool = prompt_pool(cfg)
    exp_id = experiment_for(client, cfg)
    digest = hashlib.sha256("\n".join(sorted(map(prompt_key, pool))).encode()).hexdigest()[:16]
    earlier, used = pool_prompts_used(client, exp_id, digest)
    prompts = fresh_prompts(pool, used, c.num_prompts)
    if not prompts:
        raise DataError(f"prompt pool {pool_name}: all {len(pool)} prompts were collected "
                        "before; add prompts or set collect.prompts to another file")
    cid, ref = f"v{version.version}-{uuid.uuid4().hex[:8]}", f"{name}/{version.version}"
    run_id = open_collection_run(client, exp_id, f"collect-{name}-{cid}", {
        COLLECTION_TAG: cid, COLLECTION_POOL_DIGEST_TAG: digest, COLLECTION_POOL_TAG: pool_name,
        COLLECTION_POLICY_TAG: ref})
    try:
        # the version's policy checkpoint (with its tokenizer) and its reward model
        got = registry.download_policy(client, version,
                                       Path(cfg.tracking.workdir) / "collect" / cid)
        dirs = {"policy_dir": got["ppo"][1], "rm_dir": got["reward_model"][1]}
        seed = cfg.seed + 1000 + earlier
        drawn = sample_k(cfg, dirs, prompts, seed)
        rows, counts = build_record(cfg, cid, drawn.prompts, drawn.responses, drawn.scores,
                                    seed, drawn.fits)
        meta = {"policy": name, "policy_version": str(version.version),
                "temperature": c.temperature,
                "max_new_tokens": c.max_new_tokens or cfg.ppo.max_new_tokens}
        paths = write_labelling(Path(c.out_dir), cid, rows, meta)
        log_params(client, run_id, {**{f"collect.{k}": v for k, v in c.model_dump().items()
                                       if k not in ("quality", "schedule", "destination")},
                                    "collect.destination.kind": c.destination.kind})
        # the collection run's artifacts, and the labelling file as its dataset input
        log_collection_files(client, run_id, list(paths.values()), rows, prompts)
        table = pd.read_json(paths["jsonl"], lines=True, dtype=False).astype(str)
        labelling = TableInput(table, str(paths["jsonl"]), paths["jsonl"].name,
                               tags={POLICY_VERSION_INPUT_TAG: ref})
        log_table_inputs(client, run_id, [labelling], "collection",
                         registry._logged_model_id(version))
        page = None
        if c.destination.kind == "label_studio":
            page = send(cfg, client, run_id, cid, rows).page
        counts.update(prompts=len(prompts), prompts_over_budget=drawn.over_budget,
                      pool=len(pool), pool_used=len(used) + len(prompts))
        log_metrics(client, run_id, {f"collect/{k}": v for k, v in counts.items()}, 0)
        set_tags(client, run_id, {COLLECTION_FILE_TAG: str(paths["jsonl"].resolve())})
    except BaseException:
        end_run(client, run_id, "FAILED")
        raise
    end_run(client, run_id, "FINISHED")
    if in_prefect_run():
        create_table_artifact(key="rlhf-collection", description="first pairs to label",
                              table=[{"id": r["id"], "prompt": prompt_text(r["prompt"]),
                                      "response_a": r["response_a"],
                                      "response_b": r["response_b"]} for r in rows[:10]])
    out = CollectResult(collection=cid, run_id=run_id, policy=ref,
                        paths={k: str(v) for k, v in paths.items()}, counts=counts,
                        label_studio=page, wall_s=round(time.perf_counter() - start, 1))
    events.emit(events.COLLECTION_READY, events.COLLECTION_RESOURCE + cid, cid,
                {events.POLICY_LABEL: name, events.POLICY_VERSION_LABEL: str(version.version)},
                {"file": out.paths["jsonl"], "pairs": len(rows), "mlflow_run_id": run_id,
                 **({"label_studio": page} if page else {})})
    return out
