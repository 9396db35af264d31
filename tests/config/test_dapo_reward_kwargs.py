"""verl's DAPO scripts give the over-long penalty as reward-manager keywords
(``+reward_model.reward_kwargs.overlong_buffer_cfg.*``, ``max_resp_len``): mapped onto rlforge's keys."""

from __future__ import annotations

from rlforge.config import load_config, validate_config
from rlforge.config.check import check_config

K = "+reward_model.reward_kwargs"
DAPO = [f"{K}.overlong_buffer_cfg.enable=True", f"{K}.overlong_buffer_cfg.len=64",
        f"{K}.overlong_buffer_cfg.penalty_factor=0.5", f"{K}.overlong_buffer_cfg.log=False",
        "reward_model.reward_manager=dapo", "data.max_response_length=512"]


def test_overlong_buffer_cfg_maps_onto_overlong_buffer():
    cfg = load_config([*DAPO, f"{K}.max_resp_len=512"])
    ob = cfg.reward_model.overlong_buffer
    assert (ob.enable, ob.len, ob.penalty_factor, ob.log) == (True, 64, 0.5, False)
    assert dict(cfg.reward_model.reward_kwargs) == {"max_resp_len": 512}
    assert not any(w.startswith("reward_model.reward_kwargs") for w in validate_config(cfg))  # nothing lost


def test_a_max_resp_len_other_than_the_max_response_length_warns():
    warned = validate_config(load_config([*DAPO, f"{K}.max_resp_len=100"]))
    assert any(w.startswith("reward_model.reward_kwargs={'max_resp_len': 100}") for w in warned), warned


def test_check_config_says_mapped():
    report = check_config([*DAPO, f"{K}.max_resp_len=512"])
    verdicts = {v.key: (v.verdict, v.detail) for v in report.keys}
    assert verdicts["reward_model.reward_kwargs.overlong_buffer_cfg.len"] == ("mapped", "reward_model.overlong_buffer.len")
    assert verdicts["reward_model.reward_kwargs.max_resp_len"][0] == "takes effect"
