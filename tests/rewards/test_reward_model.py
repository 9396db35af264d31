"""The discriminative reward model (``reward_model.enable``): a tiny sequence-classification model,
trained for a few steps here and saved, loaded through the config; its scores equal a direct
transformers forward pass of each chat alone at its last token; bad folders give one error."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import text_prompts
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

import rlforge.config
from rlforge.errors import ModelError, RewardError
from rlforge.rewards import RewardManager
from rlforge.rewards.model_reward import (
    ModelScoredRewards,
    build_model_scorer,
    reward_metrics,
    with_model_reward,
)
from rlforge.rewards.reward_model import load_sequence_rm
from rlforge.rollout.base import assemble

PROMPTS = ["What is 2+3?", "Name a colour.", "Say hi.", "What is 7*6?"]
RESPONSES = ["The answer is 5.", "Blue", "hi there, how are you doing today?", "#### 42"]


def _tiny_config(vocab: int, pad: int, **kw) -> LlamaConfig:
    return LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                       num_key_value_heads=1, vocab_size=vocab, pad_token_id=pad, max_position_embeddings=512,
                       **kw)


def _chats(tok) -> list[list[int]]:
    return [tok(tok.apply_chat_template([{"role": "user", "content": p}, {"role": "assistant", "content": r}],
                                        tokenize=False), add_special_tokens=False)["input_ids"]
            for p, r in zip(PROMPTS, RESPONSES, strict=True)]


@pytest.fixture(scope="module")
def rm_folder(tmp_path_factory, tiny_tokenizer):
    """A 2-layer Llama reward model trained for 5 AdamW steps to score long responses high, saved."""
    torch.manual_seed(0)
    tok = tiny_tokenizer
    model = LlamaForSequenceClassification(_tiny_config(len(tok), tok.pad_token_id, num_labels=1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    targets = torch.tensor([len(r) / 10.0 for r in RESPONSES])
    before = None
    for _ in range(5):
        preds = torch.stack([model(input_ids=torch.tensor([ids])).logits[0, 0] for ids in _chats(tok)])
        loss = torch.nn.functional.mse_loss(preds, targets)
        before = float(loss.detach()) if before is None else before
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < before  # it trained
    out = tmp_path_factory.mktemp("rm") / "tiny_rm"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _batch(tok) -> object:
    prompts = text_prompts(tok, PROMPTS)
    ids = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in RESPONSES]
    raw = torch.full((len(ids), max(map(len, ids)) + 2), tok.pad_token_id, dtype=torch.long)
    for i, x in enumerate(ids):
        raw[i, : len(x)] = torch.tensor(x)
    batch = assemble(prompts, raw, [tok.eos_token_id], tok.pad_token_id)
    raw_prompt = np.empty(len(PROMPTS), dtype=object)
    for i, p in enumerate(PROMPTS):
        raw_prompt[i] = [{"role": "user", "content": p}]
    batch.non_tensor["raw_prompt"] = raw_prompt
    batch.non_tensor["data_source"] = np.array(["rlforge/arithmetic"] * len(PROMPTS), dtype=object)
    batch.non_tensor["ground_truth"] = np.array(["5", "x", "x", "42"], dtype=object)
    return batch


def _reference(folder) -> torch.Tensor:
    """transformers' own forward of each chat alone (no padding; pad id unset: the last token is read)."""
    model = LlamaForSequenceClassification.from_pretrained(folder).eval()
    model.config.pad_token_id = None
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        return torch.stack([model(input_ids=torch.tensor([ids])).logits[0, 0] for ids in _chats(tok)])


def _cfg(folder, *extra: str):
    return rlforge.config.load_config(["reward_model.enable=true", f"reward_model.model.path={folder}",
                                       "trainer.device=cpu", *extra])


@pytest.mark.parametrize("extra", [
    ("reward_model.micro_batch_size_per_gpu=3",),
    ("reward_model.use_dynamic_bsz=true", "reward_model.forward_max_token_len_per_gpu=60"),
])
def test_scores_equal_a_direct_forward_at_the_last_token(rm_folder, tiny_tokenizer, extra) -> None:
    cfg = _cfg(rm_folder, *extra)
    rlforge.config.validate_config(cfg)
    reward = with_model_reward(RewardManager(tiny_tokenizer), cfg, torch.device("cpu"))
    assert isinstance(reward, ModelScoredRewards)
    batch = _batch(tiny_tokenizer)
    out = reward.score(batch)
    ref = _reference(rm_folder)
    torch.testing.assert_close(out.scores, ref, rtol=1e-5, atol=1e-5)
    # override (verl): the model score is the sample's score, on its last valid response token
    last = batch["response_mask"].sum(-1) - 1
    torch.testing.assert_close(out.token_level_scores[torch.arange(4), last], ref, rtol=1e-5, atol=1e-5)
    assert float(out.token_level_scores.abs().sum()) == pytest.approx(float(ref.abs().sum()), rel=1e-5)
    assert reward_metrics(reward)["reward/model_score/mean"] == pytest.approx(float(ref.mean()), rel=1e-5)


def test_micro_batches_are_bounded(rm_folder, tiny_tokenizer) -> None:
    scorer_rm = load_sequence_rm(str(rm_folder))
    from rlforge.rewards.reward_model import SequenceRewardModel

    rm = SequenceRewardModel(*scorer_rm, torch.device("cpu"), max_token_len=40)
    groups = rm.micro_batches([30, 10, 12, 20, 5])
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3, 4]
    assert all(len(g) * max([30, 10, 12, 20, 5][i] for i in g) <= 40 for g in groups)
    assert SequenceRewardModel(*scorer_rm, torch.device("cpu"), micro_batch_size=2).micro_batches([1] * 5) == \
        [[0, 1], [2, 3], [4]]


def test_sum_adds_the_rule_score(rm_folder, tiny_tokenizer) -> None:
    manager = RewardManager(tiny_tokenizer)
    batch = _batch(tiny_tokenizer)
    rule = manager.score(batch).scores
    assert rule.tolist() == [1.0, 0.0, 0.0, 1.0]  # the arithmetic rule: last integer equals ground truth
    out = with_model_reward(manager, _cfg(rm_folder, "reward_model.combine=sum"), torch.device("cpu")).score(batch)
    torch.testing.assert_close(out.scores, rule + _reference(rm_folder), rtol=1e-5, atol=1e-5)


def test_policy_ids_without_retokenizing(rm_folder, tiny_tokenizer) -> None:
    """``input_tokenizer=null``: the reward model reads the policy's prompt + response ids as they are."""
    batch = _batch(tiny_tokenizer)
    scorer = build_model_scorer(_cfg(rm_folder, "reward_model.model.input_tokenizer=null"), torch.device("cpu"))
    scores, _ = scorer(batch, [], [])
    model = LlamaForSequenceClassification.from_pretrained(rm_folder).eval()
    model.config.pad_token_id = None
    p, pm = batch["prompts"], batch["attention_mask"][:, : batch["prompts"].shape[1]]
    with torch.no_grad():
        ref = [model(input_ids=torch.cat([p[i][pm[i] != 0], batch["responses"][i][batch["response_mask"][i] != 0]])
                     [None]).logits[0, 0] for i in range(4)]
    torch.testing.assert_close(scores, torch.stack(ref), rtol=1e-5, atol=1e-5)


def test_longer_than_max_length_is_an_error(rm_folder, tiny_tokenizer) -> None:
    reward = with_model_reward(RewardManager(tiny_tokenizer), _cfg(rm_folder, "reward_model.max_length=8"),
                               torch.device("cpu"))
    with pytest.raises(RewardError, match=r"reward_model.max_length=8") as info:
        reward.score(_batch(tiny_tokenizer))
    assert "\n" not in str(info.value)


def test_causal_lm_folder_is_one_error(tmp_path, tiny_tokenizer) -> None:
    folder = tmp_path / "causal"
    LlamaForCausalLM(_tiny_config(len(tiny_tokenizer), tiny_tokenizer.pad_token_id)).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    with pytest.raises(ModelError) as info:
        build_model_scorer(_cfg(folder), torch.device("cpu"))
    msg = str(info.value)
    assert str(folder) in msg and "LlamaForCausalLM" in msg and "\n" not in msg, msg


def test_causal_lm_weights_under_a_classification_config_are_one_error(tmp_path, tiny_tokenizer) -> None:
    folder = tmp_path / "relabelled"
    cfg = _tiny_config(len(tiny_tokenizer), tiny_tokenizer.pad_token_id)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    import json

    meta = json.loads((folder / "config.json").read_text())
    meta.update(architectures=["LlamaForSequenceClassification"], id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    (folder / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ModelError, match="no weights for the classification head") as info:
        load_sequence_rm(str(folder))
    assert str(folder) in str(info.value) and "\n" not in str(info.value)


def test_vocabulary_mismatch_is_one_error(tmp_path, tiny_tokenizer) -> None:
    folder = tmp_path / "small_vocab"
    LlamaForSequenceClassification(_tiny_config(100, 0, num_labels=1)).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    with pytest.raises(ModelError, match="vocabulary does not match") as info:
        build_model_scorer(_cfg(folder), torch.device("cpu"))
    assert str(folder) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.e2e
def test_causal_lm_folder_through_rlforge_train_is_one_line(tmp_path, tiny_tokenizer, capsys) -> None:
    from helpers import FAST, SMALL

    from rlforge.cli import main

    folder = tmp_path / "causal"
    LlamaForCausalLM(_tiny_config(len(tiny_tokenizer), tiny_tokenizer.pad_token_id)).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    capsys.readouterr()  # the save's progress bar
    rc = main(["train", *SMALL, *FAST, "trainer.total_training_steps=1", f"trainer.default_local_dir={tmp_path / 'o'}",
               "reward_model.enable=true", f"reward_model.model.path={folder}"])
    err = [x for x in capsys.readouterr().err.strip().splitlines() if x.strip()]
    assert rc == 2 and len(err) == 1 and str(folder) in err[0] and "ForSequenceClassification" in err[0], err
