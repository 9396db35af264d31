"""``model.override_config`` entries the model's config class does not define warn by name (a misspelt
override would otherwise change nothing, silently); known ones are applied without a word."""

from __future__ import annotations

import warnings

import pytest

from rlforge.errors import RLForgeWarning
from rlforge.models import load_tokenizer
from rlforge.models.loader import model_config


def test_a_misspelt_override_warns_with_the_close_name_and_a_known_one_does_not():
    tok = load_tokenizer("preset:tiny", "builtin:integers")
    with pytest.warns(RLForgeWarning, match=r"^actor_rollout_ref.model.override_config.attention_dropoutt: "
                      r"LlamaConfig has no such setting \(did you mean attention_dropout\?\); set as given"):
        model_config("preset:tiny", tok, {"attention_dropoutt": 0.1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model_config("preset:tiny", tok, {"attention_dropout": 0.25}).attention_dropout == 0.25
