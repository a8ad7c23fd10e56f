"""Tokenize once (data_checks/tokens.py): the gate's one batched pass gives every family's
tokenizer the ids a per-text call gives, whatever the batch and the threads; a bad row at any
place in a batch is named by its row; a file the CLI read ahead is not read again; repeated
SFT rows and PPO prompts are reported."""

import json
import os

import pandas as pd
import pytest

import data_checks.tokens as tokens_module
from data_checks import files, loading
from data_checks.adapters import render_chunks, start_chat
from data_checks.config import DataConfig, DataSource, ValidationConfig
from data_checks.tokens import tokenize_frame
from data_checks.validate import ensure_special_tokens, run_validation
from rlhf_core.models import chat
from rlhf_core.models.data import encode
from tests.conftest import make_tokenizer
from tests.families import CHAT_FAMILIES, FAMILIES, build_tokenizer
from tests.shared import PROMPTS, SFT, write_jsonl

TEXTS = ["hello world", "", "tell me about cats\n\nand dogs", "  the weather is nice  ",
         "why? how can i help today", "unknown zzz ÿ 猫 🙂", "a\tb\r\nc", None,
         "you are a helpful assistant " * 9]


@pytest.fixture
def small_batches(monkeypatch):
    """Batches of 3 texts: every fixture spans several tokenizer calls."""
    monkeypatch.setattr(tokens_module, "BATCH", 3)


def _ids(tokens, column: str) -> list[list[int]]:
    return tokens.table.column(f"{column}_ids").to_pylist()


def _family(name):
    tok = build_tokenizer(FAMILIES[name])
    ensure_special_tokens(tok)
    return tok


@pytest.mark.parametrize("name", list(FAMILIES))
def test_plain_text_ids_are_the_per_text_encoding_for_every_family(name, small_batches):
    tok = _family(name)
    df = pd.DataFrame({"prompt": TEXTS, "response": TEXTS[::-1]})
    got = tokenize_frame(df, tok)
    for col in ("prompt", "response"):
        want = [encode(tok, t) if isinstance(t, str) else [] for t in df[col]]
        assert _ids(got, col) == want
        assert got.lengths(col).tolist() == [len(x) for x in want]
        unk = tok.unk_token_id  # each row's unknown tokens, as the text checks add them up
        assert got.table.column(f"{col}_unk").to_pylist() == [
            x.count(unk) if unk is not None else 0 for x in want]


@pytest.mark.parametrize("name", CHAT_FAMILIES)
def test_rendered_conversation_ids_are_the_per_text_encoding(name, small_batches):
    tok = _family(name)
    user = [{"role": "user", "content": t} for t in ("hi there", "tell me about rain",
                                                    "and the sun?", "why", "cats")]
    frames = {"sft": pd.DataFrame({"prompt": [[u] for u in user],
                                   "response": ["sure", "rain is wet", "hot", "because", "meow"]}),
              "prompts": pd.DataFrame({"prompt": [[u] for u in user]})}
    info = start_chat(tok, chat, "test")
    for kind, frame in frames.items():
        (df,) = render_chunks([frame], kind, tok, chat, info, kind, True)
        got = tokenize_frame(df, tok)
        for col in got.columns:
            assert _ids(got, col) == [encode(tok, t) for t in df[col]]


def test_ids_do_not_depend_on_the_batch_or_the_threads(monkeypatch):
    tok = _family("gpt2")
    texts = [t or "" for t in TEXTS * 40]
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    one_thread = tokens_module.encode_batch(tok, texts)  # one call, one thread
    threaded = tokenize_frame(pd.DataFrame({"prompt": texts}), tok)  # batches of 1,024
    monkeypatch.setattr(tokens_module, "BATCH", 7)
    assert _ids(threaded, "prompt") == one_thread
    assert _ids(tokenize_frame(pd.DataFrame({"prompt": texts}), tok), "prompt") == one_thread
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"  # given back


def test_the_threads_setting_comes_back_when_the_last_gate_is_done(monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    with tokens_module.tokenizer_threads():
        with tokens_module.tokenizer_threads():  # a sweep's second point, side by side
            assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
        assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"


CFG = ValidationConfig(max_prompt_tokens=8, max_response_tokens=8)


def _pairs(n):
    words = "cats dogs rain sun tea the weather nice good".split()
    return [{"prompt": f"tell me about {words[i % 9]} {words[(i // 9) % 9]} :",
             "chosen": f"{words[i % 9]} is nice .", "rejected": "bad"} for i in range(n)]


def _gate(tmp_path, pref):
    tmp_path.mkdir()
    data = DataConfig(sft=DataSource(path=str(write_jsonl(tmp_path / "sft.jsonl", SFT))),
                      preference=DataSource(path=str(write_jsonl(tmp_path / "p.jsonl", pref))),
                      prompts=DataSource(path=str(write_jsonl(tmp_path / "q.jsonl", PROMPTS))))
    return run_validation(data, make_tokenizer(), CFG.model_copy(
        update={"max_dropped_fraction": 1.0}), tmp_path / "out")


@pytest.mark.parametrize("position", range(9))  # batches of 4: first, inside, last, next
def test_a_bad_row_anywhere_in_a_batch_is_named_by_its_row(tmp_path, monkeypatch, position):
    monkeypatch.setattr(tokens_module, "BATCH", 4)
    pref = _pairs(9)
    long = [dict(r) for r in pref]
    long[position]["chosen"] = "cats are nice . " * 4  # over the budget: dropped
    report = _gate(tmp_path / "long", long)
    assert report.passed, report.failures
    kept = [json.loads(x) for x in (tmp_path / "long" / "out" / "preference.jsonl")
            .read_text().splitlines()]
    assert kept == pref[:position] + pref[position + 1:]
    blank = [dict(r) for r in pref]
    blank[position]["prompt"] = None
    report = _gate(tmp_path / "null", blank)
    budget = [f for f in report.failures if "outside the token budget" in f]
    assert budget and f"rows {position + 1} [" in budget[0], report.failures


def test_a_file_read_ahead_by_the_cli_is_parsed_once(tmp_path, monkeypatch):
    data = DataConfig(sft=DataSource(path=str(write_jsonl(tmp_path / "sft.jsonl", SFT))),
                      preference=DataSource(path=str(write_jsonl(tmp_path / "p.jsonl",
                                                                 _pairs(4)))),
                      prompts=DataSource(path=str(write_jsonl(tmp_path / "q.jsonl", PROMPTS))))
    reads = []
    real = files.read_local
    monkeypatch.setattr(loading, "read_local", lambda p, *a: reads.append(p) or real(p, *a))
    streamed = files.iter_jsonl  # the gate streams a file not read ahead
    monkeypatch.setattr(loading, "iter_jsonl", lambda p, *a: reads.append(p) or streamed(p, *a))
    loading.read_every_source(data)
    assert len(reads) == 3
    assert run_validation(data, make_tokenizer(), CFG, tmp_path / "out").passed
    assert len(reads) == 3 and not loading._READ  # taken, not read again
    loading.read_every_source(data)
    write_jsonl(tmp_path / "q.jsonl", PROMPTS[:1])  # changed after the read ahead
    report = run_validation(data, make_tokenizer(), CFG, tmp_path / "out2")
    assert len(reads) == 7 and report.stats["prompts/n_in"] == 1.0 and not loading._READ


def test_repeated_sft_rows_and_prompts_are_reported_with_their_rows(tmp_path):
    sft = [SFT[0], SFT[1], SFT[0], {**SFT[1], "response": "cats are nice ."}]
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[1], PROMPTS[1]]
    data = DataConfig(sft=DataSource(path=str(write_jsonl(tmp_path / "sft.jsonl", sft))),
                      preference=DataSource(path=str(write_jsonl(tmp_path / "p.jsonl",
                                                                 _pairs(3)))),
                      prompts=DataSource(path=str(write_jsonl(tmp_path / "q.jsonl", prompts))))
    report = run_validation(data, make_tokenizer(), CFG, tmp_path / "out")
    assert report.passed, report.failures  # reported, kept
    sft_warning = [w for w in report.warnings if w.startswith("sft (")]
    assert sft_warning == [f"sft ({tmp_path / 'sft.jsonl'}): 1 rows repeat another row's "
                           "prompt + response: rows 3 (kept; each copy weighs in training as "
                           "one more row)"]
    assert any(w.startswith("prompts (") and "2 rows repeat another row's prompt: rows 3, 4"
               in w for w in report.warnings), report.warnings
    assert not any(w.startswith("preference") for w in report.warnings)
    assert report.stats["prompts/n_rows"] == 4.0


def test_the_token_files_beside_the_cleaned_files_are_their_per_text_encoding(tmp_path):
    """What the stages read (data_checks/tokens.py): row for row with each cleaned file,
    the ids ``encode`` gives of its texts, prompts cut to the budget included."""
    from data_checks.tokens import read_tokens, tokens_path
    from tests.shared import PREF

    def ids_of(cleaned, column):
        path = tokens_path(cleaned)
        return read_tokens(path).column(f"{column}_ids").to_pylist() if path.is_file() else None

    long_prompt = {"prompt": "the first part\n\n" + "word " * 40, "response": "ok"}
    data = DataConfig(**{role: DataSource(path=str(write_jsonl(tmp_path / f"{role}.jsonl",
                                                               rows)))
                         for role, rows in (("sft", SFT + [long_prompt]), ("preference", PREF),
                                            ("prompts", PROMPTS))})
    tok = make_tokenizer()
    cfg = ValidationConfig(max_prompt_tokens=12, max_response_tokens=12,
                           max_truncated_fraction=1.0)
    report = run_validation(data, tok, cfg, tmp_path / "out")
    assert report.passed, report.failures
    for name, cols in (("sft", ("prompt", "response")),
                       ("preference", ("prompt", "chosen", "rejected")),
                       ("prompts", ("prompt",))):
        cleaned = tmp_path / "out" / f"{name}.jsonl"
        rows = [json.loads(line) for line in cleaned.read_text().splitlines() if line.strip()]
        assert tokens_path(cleaned).is_file()
        for col in cols:
            assert ids_of(cleaned, col) == [encode(tok, r[col]) for r in rows], (name, col)
    cut = [json.loads(x) for x in (tmp_path / "out" / "sft.jsonl").read_text().splitlines()]
    assert any(r["prompt"] != long_prompt["prompt"] and r["response"] == "ok" for r in cut)
    assert ids_of(tmp_path / "out" / "missing.jsonl", "prompt") is None


def test_kept_chunk_tokens_come_back_only_under_their_key(tmp_path):
    import os

    import pyarrow as pa

    from data_checks.cache import ChunkTokens

    store = ChunkTokens(tmp_path / "chunks", salt="tokenizer A")
    texts = {"prompt": ["a b", ""], "response": ["c", "d e"]}
    key = store.key(texts)
    table = pa.table({"prompt_ids": pa.array([[1, 2], []], type=pa.list_(pa.int32()))})
    assert store.get(key) is None
    store.put(key, table)
    os.utime(store.file(key), (1, 1))
    assert store.get(key).equals(table)
    assert store.file(key).stat().st_mtime > 1  # a read is a use (rlhf gc reads it)
    others = [{"prompt": ["a b", ""], "response": ["c", "d f"]},  # one text changed
              {"prompt": ["a b", ""], "chosen": ["c", "d e"]},  # a column renamed
              {"prompt": ["a", "b"], "response": ["c", "d e"]},  # the same bytes, cut apart
              {"prompt": ["a b", ""]}]
    assert len({key, *map(store.key, others)}) == 5
    assert all(store.get(store.key(t)) is None for t in others)
    assert ChunkTokens(tmp_path / "chunks", salt="tokenizer B").key(texts) != key
    store.file(key).write_bytes(b"half a file")
    assert store.get(key) is None
    store.put(key, table)
    store.file(key).rename(store.file(store.key(others[0])))  # a file under another's name
    assert store.get(store.key(others[0])) is None
    assert [p.name for p in (tmp_path / "chunks").iterdir()] == [f"{store.key(others[0])}.arrow"]
    store.clear()
    assert not (tmp_path / "chunks").exists()


def test_the_encoding_identity_survives_a_save_and_load_and_tells_tokenizers_apart(tmp_path):
    """A retrain round loads the champion's saved tokenizer: its chunks must hit what the
    first run's tokenizer made; another vocabulary must not."""
    from transformers import AutoTokenizer

    from data_checks.cache import encoding_identity

    tok = make_tokenizer()
    tok("cats are nice", add_special_tokens=False)  # a call sets truncation and padding
    tok.save_pretrained(tmp_path / "saved")
    loaded = AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert encoding_identity(loaded) == encoding_identity(tok) is not None
    assert encoding_identity(make_tokenizer(pad=False)) != encoding_identity(tok)
