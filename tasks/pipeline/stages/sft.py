"""sft: fine-tune the base model on the demonstrations; save it as the SFT policy (with
``model.lora``: its adapter alone, naming the base model)."""

from __future__ import annotations

from rlhf_core.models.adapters import save_policy_adapter
from rlhf_core.models.checkpoint import save_policy
from rlhf_core.models.loader import add_lora, load_pretrained, load_tokenizer
from rlhf_core.models.models import resize_for_tokenizer
from rlhf_core.models.precision import autocast
from rlhf_core.train.loop import total_steps
from rlhf_core.train.sft import sft_eval_loss, train_sft
from tasks.pipeline.prepare import Prepared
from tasks.pipeline.stages.context import Stage, StageContext
from tasks.pipeline.stages.records import DataRecord, ModelRecord
from tasks.pipeline.stages.run import stage_task
from tasks.pipeline.stages.tax import pretrain_chunks
from tasks.pipeline.stages.token_data import sft_examples


def body(sc: StageContext, prep: Prepared, data: DataRecord) -> ModelRecord | None:
    """On ranks, only rank 0 logs, saves the model and returns the record."""
    cfg, device, spec = sc.cfg, sc.device, sc.spec
    generator = sc.seeded()
    tokenizer = load_tokenizer(sc.local(data.tokenizer, "validate's tokenizer"), spec)
    model = load_pretrained(prep.base_model, spec)
    base_rows = model.get_input_embeddings().num_embeddings
    resize_for_tokenizer(model, tokenizer)
    if spec.lora is not None:  # adapters over the frozen base, saved alone
        model = add_lora(model, spec.lora)
    examples = sft_examples(sc.local(data.data, "validate's data") / "sft.jsonl", tokenizer,
                            cfg.sft.loss_on)
    ck = sc.checkpointer({"model": model}, cfg.sft.checkpoint_every)
    live = sc.live(total_steps(len(examples), cfg.sft.batch_size, cfg.sft.epochs))
    last = train_sft(model, examples, tokenizer.pad_token_id, cfg.sft, device, generator,
                     on_log=live, progress=sc.progress, checkpointer=ck, precision=spec.precision,
                     dp=sc.dp, pretrain_ids=pretrain_chunks(cfg, tokenizer, "sft"))
    if not sc.is_main:
        return None
    sc.say("saving the model" + (" (its LoRA adapter)" if spec.lora else ""))
    if spec.lora is None:
        out_dir = save_policy(model, tokenizer, sc.dir / "model")
    else:
        out_dir = save_policy_adapter(model, tokenizer, sc.dir / "model", prep.base_model,
                                      base_rows, prep.base_source)
    sc.log_artifacts(out_dir, "checkpoint")
    sc.say(f"the response loss of {min(len(examples), 256)} training examples")
    with autocast(spec.precision, device):  # as it trained
        metrics = {"sft/response_loss_train": sft_eval_loss(model, examples[:256],
                                                            tokenizer.pad_token_id, device)}
    sc.log(0, metrics)
    return ModelRecord(model=sc.publish(out_dir, "checkpoint", logged=True),
                       metrics={"train/loss": last.get("train/loss", float("nan")), **metrics})


STAGE = Stage("sft", body, ModelRecord, sections=("sft", "model"), seed_offset=0, ranks=True,
              metrics=("train/loss", "train/grad_norm", "train/lr", "train/tokens",
                       "ptx/loss", "sft/response_loss_train"),
              artifacts=("checkpoint",))
sft = stage_task(STAGE)
