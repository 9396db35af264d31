"""The torch-free registry name lists that validation reads (:mod:`rlforge.config.registry_names`)
are the registries' own: same names, same kind and config key (so the same error message), and the
same policy losses asking for the reference forward."""

from __future__ import annotations

import pytest

from rlforge.algorithms import (
    ADV_ESTIMATORS,
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    loss_hooks,
)
from rlforge.config import registry_names as names
from rlforge.errors import ConfigError
from rlforge.rewards import REWARD_MANAGERS

PAIRS = [(names.ADV_ESTIMATORS, ADV_ESTIMATORS), (names.POLICY_LOSSES, POLICY_LOSSES),
         (names.KL_ESTIMATORS, KL_ESTIMATORS), (names.LOSS_AGG_MODES, LOSS_AGG_MODES),
         (names.KL_CONTROLLERS, KL_CONTROLLERS), (names.REWARD_MANAGERS, REWARD_MANAGERS)]


@pytest.mark.parametrize("listed, registry", PAIRS, ids=lambda x: getattr(x, "kind", ""))
def test_the_lists_are_the_registries(listed, registry) -> None:
    assert sorted(listed.names) == registry.names()
    assert (listed.kind, listed.config_key) == (registry.kind, registry.config_key)


@pytest.mark.parametrize("listed, registry", PAIRS, ids=lambda x: getattr(x, "kind", ""))
def test_an_unknown_name_gets_the_registrys_message(listed, registry) -> None:
    with pytest.raises(ConfigError) as from_registry:
        registry.get("nope")
    with pytest.raises(ConfigError) as from_list:
        listed.check("nope")
    assert str(from_list.value) == str(from_registry.value)


def test_the_losses_that_ask_for_the_reference_are_the_hooks() -> None:
    hooked = {n: loss_hooks(POLICY_LOSSES.get(n)).needs_ref_log_prob for n in POLICY_LOSSES.names()}
    assert {n: f for n, f in hooked.items() if f is not None} == names.LOSSES_NEEDING_REF
