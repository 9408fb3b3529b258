"""Training data: where prompts come from and how answer records are read.

Prompts feed ``cerberus-hf distill``; its answer records (JSON Lines, one per prompt and mode) feed the
hidden-state cache, training and calibration.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------------------


PACKAGED_PROMPTS = Path(__file__).resolve().parents[1] / "data" / "prompts.jsonl"

# Columns tried, in order, when a dataset's prompt column is not given.
_PROMPT_FIELDS = ("turns", "prompt", "text", "instruction", "question", "query", "input", "messages",
                  "conversations", "conversation")


def _prompt_text(value) -> str | None:
    """The first user message of a field value: a string, a list of turns, or a list of chat messages."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)) and value:
        for item in value:
            if isinstance(item, str):
                return item
            if isinstance(item, dict):
                role = item.get("role", item.get("from", "user"))
                if role in ("user", "human"):
                    return item.get("content", item.get("value"))
    return None


def _record_prompt(record: dict, field: str | None) -> str | None:
    if field is not None:
        if field not in record:
            raise KeyError(f"prompt field {field!r} not in record with fields {sorted(record)}")
        return _prompt_text(record[field])
    for name in _PROMPT_FIELDS:
        if name in record:
            text = _prompt_text(record[name])
            if text:
                return text
    return None


def load_prompts(source: str | os.PathLike | None = None, *, prompt_field: str | None = None,
                 split: str = "train", limit: int | None = None) -> list[dict]:
    """Prompts as ``[{"id": str, "prompt": str, ...}]`` from a JSONL file or a Hugging Face dataset.

    ``source`` is a JSONL path (objects with a ``turns`` list, or a ``prompt`` / ``text`` field; ``id`` is
    used when present, else the line number) or a dataset name for ``datasets.load_dataset`` (its ``split``;
    the prompt column is auto-detected unless ``prompt_field`` names it). ``None`` means the packaged
    prompt set. Other fields of a JSONL record (e.g. ``category``) are kept. Empty prompts are skipped.
    """
    source = PACKAGED_PROMPTS if source is None else source
    path = Path(source)
    if path.is_file():
        rows = []
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle):
                if line.strip():
                    rows.append((number, json.loads(line)))
        origin = str(path)
    elif path.suffix in (".jsonl", ".json") or str(source).startswith((".", "/", "~")):
        raise FileNotFoundError(f"prompt file {source} does not exist")
    else:
        try:
            import datasets
        except ImportError as error:
            raise ImportError(f"{source!r} is not a file; loading it as a Hugging Face dataset needs "
                              "`pip install datasets`") from error
        dataset = datasets.load_dataset(str(source), split=split)
        if limit is not None:
            dataset = dataset.select(range(min(limit, len(dataset))))
        rows = list(enumerate(dataset))
        origin = str(source)

    prompts, seen = [], set()
    for number, record in rows:
        text = _record_prompt(record, prompt_field)
        if not text or not text.strip():
            continue
        prompt_id = str(record.get("id", record.get("question_id", number)))
        if prompt_id in seen:
            raise ValueError(f"duplicate prompt id {prompt_id!r} in {origin}")
        seen.add(prompt_id)
        extra = {k: v for k, v in record.items() if k in ("category",)}
        prompts.append({"id": prompt_id, "prompt": text, **extra})
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        field = prompt_field or f"any of {_PROMPT_FIELDS}"
        raise ValueError(f"no prompts found in {origin} (looked for {field})")
    return prompts


# --------------------------------------------------------------------------------------------------------
# Answer records
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One self-distillation record: the prompt ids (chat template applied) and the base's answer ids."""

    id: str
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    mode: str = "greedy"
    finished: bool = True

    def content_hash(self) -> str:
        payload = json.dumps([self.id, self.mode, list(self.input_ids), list(self.output_ids)], separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()


def read_records(path: str | os.PathLike) -> list[Record]:
    """Records of a distillation JSONL file, in file order.

    A truncated last line (a writer killed mid-line) is skipped with a warning; any other malformed line is
    an error naming the line. Records whose answer is empty are kept (they simply yield no positions).
    """
    records = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):
                logger.warning("%s: skipping a truncated last line (%s)", path, error)
                continue
            raise ValueError(f"{path}:{number} is not valid JSON: {error}") from error
        missing = [key for key in ("input_ids", "output_ids") if key not in raw]
        if missing:
            raise ValueError(f"{path}:{number} has no {' or '.join(missing)}; expected a cerberus-hf distill record.")
        records.append(
            Record(
                id=str(raw.get("id", number)),
                input_ids=tuple(int(t) for t in raw["input_ids"]),
                output_ids=tuple(int(t) for t in raw["output_ids"]),
                mode=str(raw.get("mode", "greedy")),
                finished=bool(raw.get("finished", True)),
            )
        )
    if not records:
        raise ValueError(f"{path} holds no records.")
    return records


def read_answer_file(path: str | os.PathLike, repair: bool = False) -> list[dict]:
    """The complete records of a distillation file; lines that do not parse are dropped.

    With ``repair`` the file is rewritten without them (a run killed mid-write leaves a truncated last
    line) so that appending continues on a clean line.
    """
    path = Path(path)
    if not path.is_file():
        return []
    records, good_lines, bad = [], [], 0
    with path.open("rb") as handle:
        data = handle.read()
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or "id" not in record or "mode" not in record:
                raise ValueError("not a record")
        except ValueError:
            bad += 1
            continue
        records.append(record)
        good_lines.append(line)
    needs_rewrite = bad > 0 or (data and not data.endswith(b"\n"))
    if needs_rewrite and repair:
        logger.warning("%s: dropping %d incomplete line(s) and rewriting the file", path, bad)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as handle:
            for line in good_lines:
                handle.write(line + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    return records
