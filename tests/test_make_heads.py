"""`cerberus-hf make-heads` end to end on a tiny random base: distill, train, calibrate, bench, card into one folder
that loads with from_pretrained; a run stopped in a stage and run again ends with the same data and heads."""

from __future__ import annotations

import json
import time

import pytest
import torch
from safetensors.torch import load_file

from cerberus_hf import CerberusForCausalLM
from cerberus_hf.tools import make_heads
from cerberus_hf.tools.cli import main
from helpers import save_chat_base

HEADS_FILE = "cerberus_heads.safetensors"


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory):
    return save_chat_base(tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    g = torch.Generator().manual_seed(3)
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    lines = []
    for i in range(40):
        words = " ".join(f"w{int(t)}" for t in torch.randint(5, 90, (int(torch.randint(2, 8, (1,), generator=g)),),
                                                             generator=g))
        lines.append(json.dumps({"id": f"p{i:02d}", "turns": [words]}))
    path.write_text("\n".join(lines) + "\n")
    return path


def command(base_folder, prompts_file, output, *extra: str) -> list[str]:
    return ["make-heads", "--base", str(base_folder), "--head-type", "medusa", "--output", str(output),
            "--prompts", str(prompts_file), "--budget-tokens", "600", "--dtype", "float32", "--max-new-tokens", "24",
            "--batch-size", "8", "--train-vocab", "64", "--train-args", "--max-steps 6 --batch-size 32 --save-every 3",
            "--calibration-limit", "6", "--held-out-prompts", "2", "--bench-tokens", "8", "--no-progress", *extra]


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CERBERUS_HF_CACHE", str(tmp_path / "cache"))


def test_one_command_makes_a_folder_that_loads_and_says_its_speedup(base_folder, prompts_file, tmp_path, hf_cache,
                                                                     capsys, monkeypatch):
    out = tmp_path / "heads"
    monkeypatch.setattr("sys.argv", ["cerberus-hf", *command(base_folder, prompts_file, out)])
    assert main(command(base_folder, prompts_file, out)) == 0
    said = capsys.readouterr().out.strip().splitlines()
    assert "plain generate()" in said[-1] and "held-out prompts" in said[-1] and "from_pretrained" in said[-1]
    state = json.loads((out / make_heads.STATE).read_text())
    assert list(state["stages"]) == list(make_heads.STAGES)
    assert state["stages"]["distill"]["answer_tokens"] >= 600
    assert (out / "README.md").is_file() and (out / make_heads.BENCH).is_file()
    card = (out / "README.md").read_text()  # what made it, and how its answers were decoded
    assert "Card written by `cerberus-hf make-heads" in card and "own answers (greedy)" in card
    assert not (out / "checkpoints").exists()  # the folder holds what loads, not training's optimizer state
    model = CerberusForCausalLM.from_pretrained(out)
    assert model.config.head_type == "medusa" and model.config.prompt_lookup_num_tokens == 5

    assert main(command(base_folder, prompts_file, out)) == 0  # done: every stage skipped
    assert capsys.readouterr().out.count("skipped") == len(make_heads.STAGES)
    assert main(command(base_folder, prompts_file, out, "--epochs", "3")) == 2  # other settings: refused in one line
    assert "was made with" in capsys.readouterr().err
    assert main(command(base_folder, prompts_file, out, "--budget-tokens", "900")) == 2  # not skipped unsaid
    assert "--budget-tokens 600 (now 900)" in capsys.readouterr().err
    other = tmp_path / "other"  # another folder on the same answers: none generated, the recipe goes on
    assert main(command(base_folder, prompts_file, other, "--data-dir", str(out / "data"))) == 0
    reused = json.loads((other / make_heads.STATE).read_text())["stages"]["distill"]
    assert reused["answer_tokens"] == state["stages"]["distill"]["answer_tokens"] and reused["hours"] == 0


class Stop(Exception):
    pass


@pytest.mark.slow  # three runs of the recipe each: `make test-slow`
@pytest.mark.parametrize("stage", ["distill", "train"])
def test_a_run_stopped_in_a_stage_resumes_to_the_same_data_and_heads(base_folder, prompts_file, tmp_path, hf_cache,
                                                                     monkeypatch, stage):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    monkeypatch.setenv("CERBERUS_HF_CACHE", str(tmp_path / "whole-cache"))
    assert main(command(base_folder, prompts_file, whole)) == 0
    monkeypatch.setenv("CERBERUS_HF_CACHE", str(tmp_path / "resumed-cache"))  # nothing of the first run's reused
    if stage == "distill":  # killed after its first answers were written
        from cerberus_hf.training import distill

        original = distill._sync
        calls = []

        def stop_after_two(handle):
            original(handle)
            calls.append(1)
            if len(calls) == 2:
                raise Stop
        monkeypatch.setattr(distill, "_sync", stop_after_two)
        stopped = distill, "_sync", original
    else:  # killed after training's first checkpoint
        from cerberus_hf.training import trainer

        original = trainer.save_checkpoint

        def stop_after_saving(*args, **kwargs):
            original(*args, **kwargs)
            raise Stop
        monkeypatch.setattr(trainer, "save_checkpoint", stop_after_saving)
        stopped = trainer, "save_checkpoint", original
    with pytest.raises(Stop):
        main(command(base_folder, prompts_file, resumed))
    monkeypatch.setattr(*stopped)  # the rerun as a user's: the same cache as the run that was stopped
    assert main(command(base_folder, prompts_file, resumed)) == 0
    data = "data/answers-prompts.jsonl"
    assert (resumed / data).read_text() == (whole / data).read_text()
    ours, theirs = load_file(resumed / HEADS_FILE), load_file(whole / HEADS_FILE)
    assert ours.keys() == theirs.keys()
    # The states kept while distilling come from batched steps, whose sums depend on the rows beside them: a kill,
    # which changes which answers share a step, changes a few by a float16 rounding step (here with AVX-512 and with
    # AVX2 kernels), and the heads trained on them may then differ in their last bits (docs/training.md). Where the
    # kept states come out the same, so does every bit of the heads.
    kept, kept_whole = _cached_states(tmp_path / "resumed-cache"), _cached_states(tmp_path / "whole-cache")
    assert kept.keys() == kept_whole.keys()
    if all(torch.equal(kept[k], kept_whole[k]) for k in kept):
        assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    else:
        assert all(torch.allclose(kept[k].float(), kept_whole[k].float(), rtol=2 ** -10, atol=0) for k in kept)
        assert all(torch.allclose(ours[k].float(), theirs[k].float(), rtol=1e-5, atol=1e-8) for k in ours)


def _cached_states(cache) -> dict:
    """Every tensor of the hidden-state cache under ``cache``, by its file's name and its own."""
    return {(path.name, name): tensor for path in sorted(cache.rglob("*.safetensors"))
            for name, tensor in load_file(path).items()}


def test_the_demo_finds_the_heads_shipped_for_its_base():
    from cerberus_hf.tools.demo import MODEL_CARDS, shipped_heads

    assert shipped_heads("smollm2-135m-instruct") == [MODEL_CARDS / "hydra-smollm2-135m-instruct",
                                                      MODEL_CARDS / "cerberus-smollm2-135m-instruct"]
    assert shipped_heads("no-such-base") == []


@pytest.mark.parametrize("families, words", [
    (("hydra", "cerberus"), "hydra and cerberus heads (Hydra: the fastest shipped family or within 5% of it in every "
                            "run measured; Cerberus, the namesake, beside it)"),
    (("hydra",), "hydra heads (Hydra: the fastest shipped family or within 5% of it in every run measured)"),
    (("clover",), "clover heads (every family shipped for tiny)"),
])
def test_the_demo_says_which_shipped_heads_it_decodes_with(monkeypatch, tmp_path, capsys, families, words):
    """The demo's first line names the families it loaded and why, and claims no family the base ships none of."""
    import argparse

    from cerberus_hf.testing import tiny_model
    from cerberus_hf.tools import demo

    base = tiny_model("llama")
    folders = []
    for family in families:
        CerberusForCausalLM.from_base(base, head_type=family).save_pretrained(tmp_path / family)
        folders.append(tmp_path / family)
    monkeypatch.setattr(demo, "shipped_heads", lambda name: folders)
    models = demo._load_heads(argparse.Namespace(heads=None, base="tiny", head_type="cerberus"), base, "float32: why")
    assert list(models) == list(families)
    assert capsys.readouterr().out.startswith(f"{words} in float32: why; from ")


@pytest.mark.parametrize("isa, dtype, strict, words", [
    ("AMX", "bfloat16", True, "AMX"),
    ("AVX512-BF16", "float32", False, "rows change with the batch"),  # strict bf16 would decode plain there
    (None, "float32", False, "no bf16 instructions"),
])
def test_the_demo_picks_the_dtype_that_keeps_output_identical(monkeypatch, isa, dtype, strict, words):
    from cerberus_hf.tools import demo

    monkeypatch.setattr(demo, "bf16_matmul", lambda device: isa)
    chosen, strict_chosen, why = demo.best_setup("cpu")
    assert (chosen, strict_chosen) == (dtype, strict) and words in why


def test_each_stage_counts_its_seconds_over_runs_killed_ones_included(base_folder, prompts_file, tmp_path, hf_cache,
                                                                      monkeypatch):
    """A stage's time spent is written every COUNT_EVERY seconds while it runs, so a run killed without unwinding
    (SIGKILL) has it counted too (towards --budget-hours); the stage's seconds in recipe.json add up every run's,
    a folder's count from before every stage was counted (``distill_seconds``) included."""
    from cerberus_hf.training import distill, trainer

    state = tmp_path / "made" / make_heads.STATE
    seen = []

    def distilling(*args, **kwargs):  # stands in for the base's answers: waits until the count reaches the disk
        started = time.perf_counter()
        while time.perf_counter() - started < 5:
            if state.is_file() and json.loads(state.read_text()).get("spent", {}).get("distill", 0) > 0:
                seen.append(json.loads(state.read_text())["spent"]["distill"])
                raise Stop
            time.sleep(0.01)

    monkeypatch.setattr(make_heads, "COUNT_EVERY", 0.02)
    with monkeypatch.context() as patched:
        patched.setattr(distill, "generate_distillation_data", distilling)
        with pytest.raises(Stop):
            main(command(base_folder, prompts_file, tmp_path / "made", "--budget-hours", "1"))
    assert len(seen) == 1 and 0 < seen[0] <= json.loads(state.read_text())["spent"]["distill"] < 5
    written = json.loads(state.read_text())
    written["distill_seconds"] = written.pop("spent")["distill"] + 100  # as a folder written before this count
    state.write_text(json.dumps(written))

    def stop_after_saving(*args, **kwargs):
        save_checkpoint(*args, **kwargs)
        raise Stop
    save_checkpoint = trainer.save_checkpoint
    with monkeypatch.context() as patched:
        patched.setattr(trainer, "save_checkpoint", stop_after_saving)
        with pytest.raises(Stop):
            main(command(base_folder, prompts_file, tmp_path / "made", "--budget-hours", "1"))
    written = json.loads(state.read_text())
    assert "distill_seconds" not in written and written["stages"]["distill"]["seconds"] > 100 + seen[0]
    assert written["spent"]["distill"] == pytest.approx(written["stages"]["distill"]["seconds"], abs=0.1)
    killed_training = written["spent"]["train"]
    assert killed_training > 0 and "train" not in written["stages"]
    assert main(command(base_folder, prompts_file, tmp_path / "made", "--budget-hours", "1")) == 0
    assert json.loads(state.read_text())["stages"]["train"]["seconds"] > killed_training
