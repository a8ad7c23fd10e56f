"""Reuse of a passed validation (the same data, checks and tokenizer give the same verdict) and
of tokenized chunks (:class:`ChunkTokens`).

A passed gate is kept under a key of all it depends on (data bytes, settings, tokenizer, GX
version, this package's source); failed ones are never kept, so their messages name the run's own
files. Files are hard-linked where possible, safe as they are only ever replaced whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pyarrow as pa

from data_checks.tokens import SUFFIX

CACHE_ENV = "RLHF_VALIDATION_CACHE"
CHUNKS = "chunks"  # the folder, in the cache, of tokenized chunks
_PACKAGE = Path(__file__).resolve().parent
_MARK = "{{rlhf-path:%s}}"  # a data file's path in a kept report, by its data set's name


@dataclass(frozen=True)
class ValidationCache:
    root: Path

    def entry(self, key: str) -> Path:
        return self.root / key


def validation_cache() -> ValidationCache | None:
    """``$RLHF_VALIDATION_CACHE`` (``off``: None), else ``$XDG_CACHE_HOME/rlhf-ppo/validation``."""
    where = os.environ.get(CACHE_ENV, "").strip()
    if where.lower() in ("off", "0", "false", "no"):
        return None
    if not where:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        where = str(Path(base) / "rlhf-ppo" / "validation")
    return ValidationCache(Path(where).expanduser())


def encoding_identity(tokenizer) -> str | None:
    """What a text's token ids depend on, narrower than :func:`validation_key`'s so that a
    tokenizer saved with a policy and reloaded keeps it. None: not a fast tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = {k: v for k, v in json.loads(backend.to_str()).items()
            if k not in ("truncation", "padding")}
    code = hashlib.sha256((_PACKAGE / "tokens.py").read_bytes()).hexdigest()
    return json.dumps([spec, tokenizer.unk_token_id, type(tokenizer).__qualname__, code],
                      sort_keys=True, default=str)


def chunk_folder(cache: ValidationCache) -> Path:
    """Where the cache keeps tokenized chunks."""
    return cache.root / CHUNKS


def _source_code() -> str:
    h = hashlib.sha256()
    for path in sorted(_PACKAGE.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def validation_key(sources: dict, tokenizer, cfg, chat: bool) -> str | None:
    """The key of one validation (``sources``: name -> DataSource), or None when it cannot be
    reused (a source that is not a local file, or not a fast tokenizer)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    tok = json.dumps([backend.to_str(), tokenizer.special_tokens_map,
                      getattr(tokenizer, "chat_template", None),
                      getattr(tokenizer, "model_max_length", None)], sort_keys=True, default=str)
    files = {}
    for name, src in sorted(sources.items()):
        path = Path(src.path).expanduser()
        if src.format == "hf" or not path.is_file():
            return None
        with open(path, "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        files[name] = [digest, path.suffix,
                       src.model_dump(mode="json", exclude={"path"})]
    try:
        gx = metadata.version("great_expectations")
    except metadata.PackageNotFoundError:
        gx = "none"
    blob = json.dumps({"files": files, "validation": cfg.model_dump(mode="json"),
                       "tokenizer": hashlib.sha256(tok.encode()).hexdigest(), "chat": chat,
                       "gx": gx, "code": _source_code()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _unpath(text: str, paths: dict[str, str]) -> str:
    for name, path in sorted(paths.items(), key=lambda kv: -len(kv[1])):
        text = text.replace(path, _MARK % name)
    return text


def _repath(text: str, paths: dict[str, str]) -> str:
    for name, path in paths.items():
        text = text.replace(_MARK % name, path)
    return text


def place(source: Path, target: Path) -> None:
    """``target`` becomes ``source``'s content: a hard link where possible, else a copy."""
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
    try:
        try:
            os.link(source, tmp)
        except OSError:  # another file system, or one without links
            shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def load(cache: ValidationCache, key: str, paths: dict[str, str], out_dir: Path):
    """A kept validation -> (report fields, its GX Data Docs or None), its cleaned files placed
    in ``out_dir``; None when nothing is kept under ``key``."""
    entry = cache.entry(key)
    try:
        fields = json.loads(_repath((entry / "report.json").read_text(encoding="utf-8"), paths))
        for name in fields["cleaned"]:
            place(entry / "cleaned" / name, out_dir / name)
        os.utime(entry)  # last used now (rlhf gc)
    except (OSError, ValueError, KeyError):
        return None
    gx = entry / "gx"
    return fields, (gx if gx.is_dir() else None)


def keep(cache: ValidationCache, key: str, fields: dict, paths: dict[str, str], out_dir: Path,
         gx_docs: Path | None) -> None:
    """Keep a passed validation under ``key`` (written aside, renamed into place); never fails
    the validation."""
    entry = cache.entry(key)
    if entry.exists():
        return
    tmp = cache.root / f".{key}.{uuid.uuid4().hex}"
    try:
        (tmp / "cleaned").mkdir(parents=True)
        cleaned = sorted(p.name for p in Path(out_dir).glob("*.jsonl"))
        cleaned += sorted(p.name for p in Path(out_dir).glob(f"*{SUFFIX}"))
        for name in cleaned:
            place(Path(out_dir) / name, tmp / "cleaned" / name)
        if gx_docs is not None and gx_docs.is_dir():
            shutil.copytree(gx_docs, tmp / "gx")
        text = json.dumps({**fields, "cleaned": cleaned}, default=str)
        (tmp / "report.json").write_text(_unpath(text, paths), encoding="utf-8")
        os.replace(tmp, entry)
    except OSError:
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class ChunkTokens:
    """Tokenized chunks, ``<folder>/<key>.arrow`` keyed by their texts and ``salt`` (the
    encoding's identity), so a rerun gate or a retrain round tokenizes only new or changed
    chunks. A read sets the file's modification time, which ``rlhf gc`` ages by."""

    def __init__(self, folder: Path | str, salt: str):
        self.folder = Path(folder)
        self.salt = salt.encode()

    def key(self, texts: dict[str, list[str]]) -> str:
        h = hashlib.sha256(self.salt)
        for column, values in texts.items():
            array = pa.array(values, type=pa.large_string())
            h.update(b"\0" + column.encode() + b"\0" + str(len(array)).encode())
            for buffer in array.buffers()[1:]:  # offsets, then the text's bytes
                if buffer is not None:
                    h.update(buffer)
        return h.hexdigest()

    def file(self, key: str) -> Path:
        return self.folder / f"{key}.arrow"

    def get(self, key: str) -> pa.Table | None:
        """The table kept under ``key``, or None."""
        path = self.file(key)
        try:
            reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
            if (reader.schema.metadata or {}).get(b"rlhf.key") != key.encode():
                return None
            table = reader.read_all().replace_schema_metadata(None)
            os.utime(path)  # last used now
        except (OSError, pa.ArrowInvalid):
            return None
        return table

    def put(self, key: str, table: pa.Table) -> None:
        path = self.file(key)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
        self.folder.mkdir(parents=True, exist_ok=True)
        table = table.replace_schema_metadata({"rlhf.key": key})
        try:
            with pa.ipc.new_file(str(tmp), table.schema) as out:
                out.write_table(table)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)

    def clear(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
