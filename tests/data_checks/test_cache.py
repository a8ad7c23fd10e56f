"""A passed validation is reused for the same data files (wherever they lie), checks and
tokenizer: the same report, cleaned files and Data Docs, without running the suites; any
change of content, checks or tokenizer runs them again; a failure is never kept."""

import json

from data_checks.cache import CACHE_ENV, CHUNKS, ValidationCache, validation_cache
from data_checks.config import DataConfig, DataSource, ValidationConfig
from data_checks.validate import run_validation, write_data_docs
from tests.conftest import make_tokenizer
from tests.shared import PREF, PROMPTS, SFT, write_jsonl

CFG = ValidationConfig(max_prompt_tokens=8, max_response_tokens=8)


def data_config(where, sft=SFT, pref=PREF, prompts=PROMPTS):
    return DataConfig(**{role: DataSource(path=str(write_jsonl(where / f"{role}.jsonl", rows)))
                         for role, rows in (("sft", sft), ("preference", pref),
                                            ("prompts", prompts))})


def entries(cache: ValidationCache) -> list:
    """The cache's kept validations (not its tokenized chunks)."""
    root = cache.root
    return [p for p in root.iterdir() if p.name != CHUNKS] if root.exists() else []


def _run(where, cache, cfg=CFG, tokenizer=None, **data):
    where.mkdir(parents=True, exist_ok=True)
    report = run_validation(data_config(where, **data), tokenizer or make_tokenizer(), cfg,
                            where / "out", cache=cache)
    return report, write_data_docs(report, where / "docs")


def test_the_same_content_elsewhere_reuses_report_cleaned_files_and_data_docs(tmp_path):
    cache = ValidationCache(tmp_path / "cache")
    first, docs1 = _run(tmp_path / "a", cache)
    assert first.passed and not first.reused and first.gx_context is not None
    assert len(entries(cache)) == 1  # kept once, whole
    import os

    os.utime(entries(cache)[0], (1, 1))
    again, docs2 = _run(tmp_path / "b", cache)  # the same bytes in other files
    assert entries(cache)[0].stat().st_mtime > 1  # a reuse is a use (rlhf gc reads it)
    assert again.passed and again.reused and again.gx_context is None
    assert again.results_json == json.loads(json.dumps(first.results_json, default=str))
    assert again.stats == first.stats and again.warnings == first.warnings
    assert again.expectation_counts() == first.expectation_counts()
    for name in ("sft.jsonl", "preference.jsonl", "prompts.jsonl", "sft.tokens.arrow",
                 "preference.tokens.arrow", "prompts.tokens.arrow"):
        assert (tmp_path / "b" / "out" / name).read_bytes() == \
            (tmp_path / "a" / "out" / name).read_bytes()
    assert len(list((docs2 / "gx" / "validations").rglob("*.html"))) == 3
    assert "Reused" in again.summary_markdown() and "Reused" not in first.summary_markdown()


def test_other_content_checks_or_tokenizer_run_the_suites_again(tmp_path):
    cache = ValidationCache(tmp_path / "cache")
    _run(tmp_path / "a", cache)
    changed, _ = _run(tmp_path / "b", cache, sft=[*SFT, SFT[0]])  # one row more
    assert changed.passed and not changed.reused
    stricter, _ = _run(tmp_path / "c", cache, cfg=CFG.model_copy(update={"example_rows": 2}))
    assert not stricter.reused
    nopad, _ = _run(tmp_path / "d", cache, tokenizer=make_tokenizer(pad=False))
    assert not nopad.reused
    assert len(entries(cache)) == 4


def test_kept_files_are_hard_links_else_copies(tmp_path, monkeypatch):
    """No size limit: the cleaned and token files are linked, not copied, where one file
    system holds both; elsewhere copied, and reused all the same."""
    import data_checks.cache as cache_module

    cache = ValidationCache(tmp_path / "cache")
    first, _ = _run(tmp_path / "a", cache)
    (entry,) = entries(cache)
    for name in ("preference.jsonl", "preference.tokens.arrow"):
        assert (entry / "cleaned" / name).stat().st_ino == \
            (tmp_path / "a" / "out" / name).stat().st_ino
    again, _ = _run(tmp_path / "b", cache)
    assert again.reused and (tmp_path / "b" / "out" / "sft.jsonl").stat().st_ino == \
        (entry / "cleaned" / "sft.jsonl").stat().st_ino

    def no_links(*args):
        raise OSError("cross-device link")

    monkeypatch.setattr(cache_module.os, "link", no_links)
    copied, _ = _run(tmp_path / "c", cache)
    assert copied.reused
    for name in ("sft.jsonl", "sft.tokens.arrow"):
        ours, kept = tmp_path / "c" / "out" / name, entry / "cleaned" / name
        assert ours.stat().st_ino != kept.stat().st_ino
        assert ours.read_bytes() == kept.read_bytes()
    assert not [p for p in (tmp_path / "c" / "out").iterdir() if p.name.startswith(".")]


def test_a_failed_validation_is_never_kept(tmp_path):
    cache = ValidationCache(tmp_path / "cache")
    bad = [{**PREF[0], "rejected": PREF[0]["chosen"]}, PREF[1]]
    for where in ("a", "b"):
        report, _ = _run(tmp_path / where, cache, pref=bad)
        assert not report.passed and not report.reused
        # its own file named
        assert str(tmp_path / where / "preference.jsonl") in " ".join(report.failures)
    assert not entries(cache)


def test_the_cache_folder_comes_from_the_environment_and_off_turns_it_off(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "here"))
    assert validation_cache().root == tmp_path / "here"
    monkeypatch.setenv(CACHE_ENV, "off")
    assert validation_cache() is None
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert validation_cache().root == tmp_path / "xdg" / "rlhf-ppo" / "validation"


def _chat_tokenizer(template=None):
    from data_checks.validate import ensure_special_tokens
    from tests.families import FAMILIES, build_tokenizer

    tok = build_tokenizer(FAMILIES["qwen2"])
    if template:
        tok.chat_template = template
    ensure_special_tokens(tok)
    return tok


CHATS = {"sft": [{"messages": [{"role": "user", "content": f"hello {i}"},
                               {"role": "assistant", "content": f"sure {i}"}]} for i in range(3)],
         "pref": [{"prompt": [{"role": "user", "content": f"hi {i}"}],
                   "chosen": [{"role": "assistant", "content": "sure thanks"}],
                   "rejected": [{"role": "assistant", "content": "bad"}]} for i in range(3)],
         "prompts": [{"prompt": [{"role": "user", "content": "why rain"}]}]}


def test_a_conversational_rerun_reuses_the_gate_and_tokenizes_nothing(tmp_path, monkeypatch):
    import data_checks.validate as validate
    from rlhf_core.models import chat
    from tests.families import CHATML_TEMPLATE

    cache = ValidationCache(tmp_path / "cache")
    cfg = ValidationConfig(max_prompt_tokens=64, max_response_tokens=16)

    def gate(where, tok):
        where.mkdir(parents=True, exist_ok=True)
        data = data_config(where, sft=CHATS["sft"], pref=CHATS["pref"],
                           prompts=CHATS["prompts"])
        report = run_validation(data, tok, cfg, where / "out", chat=chat, cache=cache)
        write_data_docs(report, where / "docs")
        return report

    first_tok = _chat_tokenizer()
    first = gate(tmp_path / "a", first_tok)
    assert first.passed and first.chat and not first.reused and first.chunks_tokenized == 3
    real = validate.tokenize_frame
    monkeypatch.setattr(validate, "tokenize_frame", None)  # any tokenizing would fail
    monkeypatch.setattr(chat, "render_prompt", None)  # and any rendering
    monkeypatch.setattr(chat, "render_many", None)
    tok = _chat_tokenizer()
    again = gate(tmp_path / "b", tok)
    assert again.passed and again.reused and again.chat == json.loads(json.dumps(first.chat))
    assert tok.eos_token == first_tok.eos_token == "<|im_end|>"  # moved as the first gate did
    for name in ("sft.jsonl", "preference.jsonl", "sft.tokens.arrow"):
        assert (tmp_path / "b" / "out" / name).read_bytes() == \
            (tmp_path / "a" / "out" / name).read_bytes()
    monkeypatch.undo()
    monkeypatch.setattr(validate, "tokenize_frame", real)
    other = _chat_tokenizer(CHATML_TEMPLATE.replace("You are a helpful assistant.",
                                                    "You are a kind assistant."))
    changed = gate(tmp_path / "c", other)  # another template: the key differs
    assert changed.passed and not changed.reused and changed.chunks_tokenized == 3
