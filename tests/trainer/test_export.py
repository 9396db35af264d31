"""``rlforge export CHECKPOINT --out HF_DIR``: a one-step CPU run's checkpoint becomes a Hugging Face
folder that ``AutoModelForCausalLM.from_pretrained`` loads with the trained weights."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from rlforge.cli import main
from rlforge.trainer.dcp_io import saved_model_state

pytestmark = pytest.mark.e2e

TOK = os.environ.get("RLFORGE_TEST_TOKENIZER") or None  # offline machines without the default model's package
TOKENIZER = [f"actor_rollout_ref.model.tokenizer_path={TOK}"] if TOK else []
RUN = ["actor_rollout_ref.model.path=preset:tiny", *TOKENIZER, "data.seed=1", "trainer.device=cpu", "data.val_files=null",
       "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "data.max_response_length=4",
       "trainer.val_before_train=false", "trainer.logger=[file]", "trainer.total_training_steps=1",
       "trainer.save_freq=1", "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export_run")
    assert main(["train", *RUN, f"trainer.default_local_dir={out}"]) == 0
    return out


def token_log_probs(model, ids: torch.Tensor) -> torch.Tensor:
    """log p(ids[t+1] | ids[:t+1]) in nats, float32, ``(batch, seq - 1)``."""
    with torch.no_grad():
        logits = model.eval()(input_ids=ids).logits.float()
    return logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def test_export_loads_with_transformers_and_gives_the_trained_log_probs(run_dir, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlforge.models import load_causal_lm, load_tokenizer

    ckpt = run_dir / "global_step_1"
    assert (ckpt / "config.yaml").is_file()  # saved with the checkpoint: export needs nothing else
    out = tmp_path / "hf"
    assert main(["export", str(ckpt), "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    exported = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tok("12 + 30 = 42, and 7 * 6 = 42.")["input_ids"]] * 2)
    ids[1, :3] = torch.tensor([5, 6, 7])
    # the reference: the checkpoint's state dict in a freshly built model (the run's initial weights: data.seed)
    state = saved_model_state(ckpt)
    fresh = load_causal_lm("preset:tiny", load_tokenizer("preset:tiny", TOK), seed=1)
    moved = [k for k, v in fresh.state_dict().items() if k in state and not torch.equal(v, state[k])]
    assert moved  # the step changed the weights: the export holds the trained ones, not the initial ones
    fresh.load_state_dict(state)
    want = token_log_probs(fresh, ids)
    got = token_log_probs(exported, ids)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    for k in moved:
        torch.testing.assert_close(exported.state_dict()[k], state[k], atol=0, rtol=0)
    run_export = AutoModelForCausalLM.from_pretrained(ckpt / "actor" / "huggingface")  # save_contents hf_model
    torch.testing.assert_close(token_log_probs(run_export, ids), want, atol=1e-5, rtol=0)
    assert tok.get_vocab() == AutoTokenizer.from_pretrained(ckpt / "actor" / "huggingface").get_vocab()


def test_a_run_folder_exports_its_latest_checkpoint_in_bf16(run_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    out.mkdir()  # an empty folder may exist
    assert main(["export", str(run_dir), "--out", str(out), "--dtype", "bfloat16"]) == 0
    assert AutoModelForCausalLM.from_pretrained(out, dtype="auto").dtype == torch.bfloat16


def test_an_old_checkpoint_without_config_uses_its_hf_model_folder(run_dir, tmp_path):
    old = tmp_path / "global_step_1"
    shutil.copytree(run_dir / "global_step_1", old)
    (old / "config.yaml").unlink()
    (old / "manifest.json").unlink()  # an rlforge without config.yaml wrote no manifest either
    assert main(["export", str(old), "--out", str(tmp_path / "a")]) == 0
    shutil.rmtree(old / "actor" / "huggingface")
    assert main(["export", str(old), "--out", str(tmp_path / "b"), "--model-path", "preset:tiny",
                 *(["--tokenizer-path", TOK] if TOK else [])]) == 0
    # both folders hold the checkpoint's trained weights (the reference: the saved actor itself)
    from transformers import AutoModelForCausalLM

    state = saved_model_state(old)
    for folder in ("a", "b"):
        got = AutoModelForCausalLM.from_pretrained(tmp_path / folder).state_dict()
        assert set(state) <= set(got), (folder, set(state) - set(got))
        for k, v in state.items():
            torch.testing.assert_close(got[k], v, atol=0, rtol=0, msg=f"{folder}: {k}")


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("rlforge: error: ")]
    assert len(lines) == 1, err
    return lines[0]


def test_errors_name_the_path(run_dir, tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    assert main(["export", str(tmp_path / "notes"), "--out", str(tmp_path / "x")]) == 2
    line = _one_error(capsys)
    assert f"{tmp_path / 'notes'}: not an rlforge checkpoint" in line and "global_step_N" in line
    assert main(["export", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    assert f"{tmp_path / 'missing'}: no such file or folder" in _one_error(capsys)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "a.txt").write_text("keep me")
    assert main(["export", str(run_dir), "--out", str(tmp_path / "full")]) == 2
    assert "not an empty folder" in _one_error(capsys)
    assert (tmp_path / "full" / "a.txt").read_text() == "keep me"
    bare = tmp_path / "global_step_1"
    (bare / "actor").mkdir(parents=True)
    for f in (run_dir / "global_step_1" / "actor").iterdir():  # the sharded actor, without its huggingface/
        if f.is_file():
            shutil.copy(f, bare / "actor" / f.name)
    assert main(["export", str(bare), "--out", str(tmp_path / "y")]) == 2
    assert "--model-path" in _one_error(capsys)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_default_job_saves_the_trained_policy_as_a_hugging_face_folder(tmp_path, capsys):
    """The default job (here on ``preset:tiny``, one step) ends by writing the policy as a Hugging Face
    folder (``save_freq`` = its last step, ``save_contents=[hf_model]``), not a resumable checkpoint, and
    its summary names the folder.  Reference: one AdamW step from the initial weights moves every
    element by at most lr (Adam's first update is lr * g / |g|) plus the decoupled weight decay."""
    from transformers import AutoModelForCausalLM

    from rlforge.config import load_config
    from rlforge.models import load_causal_lm, load_tokenizer

    run = ["actor_rollout_ref.model.path=preset:tiny", *TOKENIZER, "trainer.device=cpu", "trainer.logger=[console]",
           "trainer.total_training_steps=1", "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "data.max_response_length=4",
           "data.builtin.train_size=8", "data.builtin.val_size=4", f"trainer.default_local_dir={tmp_path}"]
    assert main(["train", *run]) == 0  # `rlforge train` runs the default job
    hf = tmp_path / "global_step_1" / "actor" / "huggingface"
    where = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("rlforge train: metrics")]
    assert where == [f"rlforge train: metrics console only (trainer.logger=[console,file] writes metrics.jsonl) "
                     f"| model {hf} (Hugging Face folder)"]
    assert (hf / "model.safetensors").is_file() and (hf / "tokenizer.json").is_file()
    assert sorted(p.name for p in (tmp_path / "global_step_1").iterdir()) == ["actor", "config.yaml"]
    assert not (tmp_path / "latest_checkpointed_iteration.txt").exists()  # nothing to resume from
    for folder in (tmp_path, tmp_path / "global_step_1"):  # `rlforge export` of it: one error naming the folder
        assert main(["export", str(folder), "--out", str(tmp_path / "x")]) == 2
        assert f"needs no export: load {hf} as it is" in _one_error(capsys)

    trained = AutoModelForCausalLM.from_pretrained(hf).state_dict()
    optim = load_config(run, job="default").actor_rollout_ref.actor.optim
    initial = load_causal_lm("preset:tiny", load_tokenizer("preset:tiny", TOK), seed=1).state_dict()
    assert trained.keys() == initial.keys()
    moved = 0
    for k, w in initial.items():
        step = (trained[k] - w).abs()
        bound = optim.lr * (1 + optim.weight_decay * w.abs()) * (1 + 1e-3) + 1e-9
        assert bool((step <= bound).all()), (k, float((step - bound).max()))
        moved += int((step > 0).sum())
    assert moved > 0  # the trained weights, not the initial ones


def test_export_of_a_sharded_checkpoint_equals_the_export_of_its_full_state_copy(run_dir, tmp_path):
    """The run's checkpoint is sharded (DCP, ``actor/.metadata``); the same weights written in the old
    full format (``actor/state.pt``, as rlforge wrote before) export to the same safetensors, bit for bit."""
    from safetensors.torch import load_file

    dcp_ckpt = run_dir / "global_step_1"
    assert (dcp_ckpt / "actor" / ".metadata").is_file() and not (dcp_ckpt / "actor" / "state.pt").exists()
    old = tmp_path / "old" / "global_step_1"
    (old / "actor").mkdir(parents=True)
    shutil.copy(dcp_ckpt / "config.yaml", old / "config.yaml")
    torch.save({"model": saved_model_state(dcp_ckpt), "optimizer": {}, "scheduler": None}, old / "actor" / "state.pt")
    assert main(["export", str(dcp_ckpt), "--out", str(tmp_path / "from_dcp")]) == 0
    assert main(["export", str(old), "--out", str(tmp_path / "from_full")]) == 0
    a, b = load_file(tmp_path / "from_dcp" / "model.safetensors"), load_file(tmp_path / "from_full" / "model.safetensors")
    # the independent reference: the run's own hf_model folder, written from the engine's full (gathered) state
    c = load_file(dcp_ckpt / "actor" / "huggingface" / "model.safetensors")
    assert set(a) == set(b) == set(c) and a
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=0, rtol=0, msg=k)
        torch.testing.assert_close(a[k], c[k], atol=0, rtol=0, msg=k)


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    ckpt = tmp_path / "run" / "global_step_1"
    shutil.copytree(run_dir / "global_step_1", ckpt)
    shutil.copy(run_dir / "latest_checkpointed_iteration.txt", ckpt.parent)
    return ckpt


def test_flipped_bytes_in_a_shard_fail_the_export_naming_the_file(run_dir, tmp_path, capsys):
    """Same size, other bytes: only the manifest's SHA-256 sees it; the export is refused before reading."""
    ckpt = _copy(run_dir, tmp_path)
    shard = ckpt / "actor" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 4096):
        data[i] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["export", str(ckpt), "--out", str(tmp_path / "hf")]) == 2
    line = _one_error(capsys)
    assert f"checkpoint {ckpt}: file actor/__0_0.distcp does not match its SHA-256" in line, line
    assert "nothing was exported" in line
    assert main(["export", str(ckpt.parent), "--out", str(tmp_path / "hf")]) == 2  # the run folder: same check
    assert "actor/__0_0.distcp" in _one_error(capsys)
    assert not (tmp_path / "hf").exists()


def test_an_unreadable_manifest_fails_the_export(run_dir, tmp_path, capsys):
    ckpt = _copy(run_dir, tmp_path)
    (ckpt / "manifest.json").write_text('{"format": 1, "files": ')
    assert main(["export", str(ckpt), "--out", str(tmp_path / "hf")]) == 2
    assert f"checkpoint {ckpt}: manifest.json is unreadable" in _one_error(capsys)
    assert not (tmp_path / "hf").exists()


def _no_manifest_full_copy(run_dir: Path, tmp_path: Path, name: str, value: float) -> Path:
    """A checkpoint as an older rlforge wrote it (full format, no manifest) with one element of ``name`` set."""
    old = tmp_path / "old" / "global_step_1"
    (old / "actor").mkdir(parents=True)
    shutil.copy(run_dir / "global_step_1" / "config.yaml", old / "config.yaml")
    state = saved_model_state(run_dir / "global_step_1")
    state[name] = state[name].clone()
    state[name].view(-1)[3] = value
    torch.save({"model": state, "optimizer": {}, "scheduler": None}, old / "actor" / "state.pt")
    return old


def test_a_checkpoint_without_manifest_exports_with_one_warning_but_never_nan(run_dir, tmp_path, capsys):
    """No manifest (an older rlforge): one warning, as on resume; a NaN in the weights, or a value out of
    --dtype float16's range (max 65504), is one error naming the tensor, and nothing is written."""
    name = sorted(k for k in saved_model_state(run_dir / "global_step_1") if k.endswith("mlp.down_proj.weight"))[0]
    big = _no_manifest_full_copy(run_dir, tmp_path / "a", name, 1e6)
    assert main(["export", str(big), "--out", str(tmp_path / "f32")]) == 0  # finite in float32
    err = capsys.readouterr().err
    assert err.count("has no manifest.json") == 1 and "cannot be checked" in err, err
    assert main(["export", str(big), "--out", str(tmp_path / "f16"), "--dtype", "float16"]) == 2
    line = _one_error(capsys)
    assert f"tensor {name} has 1 NaN/inf value(s)" in line and "--dtype float16" in line, line
    nan = _no_manifest_full_copy(run_dir, tmp_path / "b", name, float("nan"))
    assert main(["export", str(nan), "--out", str(tmp_path / "nan")]) == 2
    line = _one_error(capsys)
    assert f"{nan / 'actor' / 'state.pt'}: tensor {name} has 1 NaN/inf value(s)" in line, line
    assert "checkpoint holds them" in line
    assert not (tmp_path / "f16").exists() and not (tmp_path / "nan").exists()


def test_an_sft_run_is_pointed_at_its_model_folder(tmp_path, capsys):
    """``rlforge sft`` writes ``global_step_N/huggingface`` (no ``actor/``): export says that folder needs no
    export and names it, for the run folder and for the step folder alike."""
    step = tmp_path / "global_step_2"
    (step / "huggingface").mkdir(parents=True)
    (step / "huggingface" / "config.json").write_text("{}")
    (step / "trainer_state.pt").write_bytes(b"")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    for given in (tmp_path, step):
        assert main(["export", str(given), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err == (f"rlforge: error: {given} is an SFT run's checkpoint, whose Hugging Face folder needs no "
                       f"export: load {step / 'huggingface'} as it is (rlforge train "
                       f"actor_rollout_ref.model.path={step / 'huggingface'})\n")
