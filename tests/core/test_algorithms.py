"""`suite.core.advantages.ALGORITHMS` is the one place an algorithm is defined: the config options,
the embedded trainer's estimator and critic, and verl's adv_estimator all come from it."""

from __future__ import annotations

import torch

from suite.core.advantages import ALGORITHMS, gae_advantages, grpo_advantages


def test_the_config_group_is_the_registry():
    from suite.config import ALGOS, compose_config
    from suite.hydra_compat import config_groups

    assert sorted(config_groups()["algo"]) == sorted(ALGORITHMS) == sorted(ALGOS)
    for name, algorithm in ALGORITHMS.items():
        cfg = compose_config([f"algo={name}"])
        assert cfg.algo.name == name
        for key, value in algorithm.config.items():
            assert cfg.algo[key] == value, (name, key)


def test_verl_gets_each_algorithms_estimator():
    from suite.config import compose_config
    from suite.verl.translate import verl_overrides

    base = ["backend=verl", "backend.model_path=/m", "backend.train_files=/t", "backend.val_files=/v", "quant=bf16",
            "uaq.s=1.0"]
    for name, algorithm in ALGORITHMS.items():
        o = verl_overrides(compose_config([*base, f"algo={name}"]), "/tmp/run")
        assert f"algorithm.adv_estimator={algorithm.verl_estimator}" in o
        assert ("critic.enable=true" in o) == algorithm.critic, name


def test_each_estimator_against_the_functions_it_wraps():
    from types import SimpleNamespace

    scores = torch.tensor([1.0, 0.0, 1.0, 1.0])
    lengths = torch.tensor([3, 2, 1, 3])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    values = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.4, 0.0], [0.2, 0.0, 0.0], [0.3, 0.3, 0.3]])
    algo = SimpleNamespace(gamma=1.0, lam=0.95, norm_adv_by_std=True)
    adv, returns = ALGORITHMS["grpo"].advantages(scores, lengths, mask, None, 2, algo)
    assert returns is None and torch.equal(adv, grpo_advantages(scores, torch.tensor([0, 0, 1, 1]), mask))
    adv, returns = ALGORITHMS["ppo"].advantages(scores, lengths, mask, values, 2, algo)
    rewards = torch.tensor([[0.0, 0, 1], [0, 0, 0], [1, 0, 0], [0, 0, 1]])  # the score on each last token
    want_adv, want_ret = gae_advantages(rewards, values * mask, mask, gamma=1.0, lam=0.95)
    assert torch.equal(adv, want_adv) and torch.equal(returns, want_ret)
