"""verl plugin: the suite's policy losses in verl's registry, computed by suite.core.losses.

Loaded by ``import verl`` in every process (driver, Ray workers, vLLM workers) through the
``verl.plugins`` entry point in pyproject.toml (verl 0.9.1 ``verl/__init__.py`` loads every
entry point of that group unless ``VERL_USE_EXTERNAL_PLUGINS=none``; a failing plugin is only
logged at debug level, so verl then reports "Unsupported loss mode: acr").

Registered loss modes (``actor_rollout_ref.actor.policy_loss.loss_mode``): every correction of
suite.core.losses.CORRECTIONS that verl does not run itself (``verl="plugin"``: ``acr``, ``tbpo``);
``naive`` is verl's stock vanilla loss, ``bypass`` verl's bypass mode and ``tis`` verl's token-level
rollout IS (suite.verl.translate). verl calls a registered loss as

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights)

with ``old_log_prob`` = log pi_prox (the full-precision actor's recomputed log-probs,
decoupled mode) and ``rollout_is_weights`` = the token-level rollout-correction weights
(``verl.trainer.ppo.rollout_corr_helper.compute_rollout_correction_weights``):
``exp(clamp(log pi_prox - log pi_behav, -20, 20)) * mask``, then ``.clamp(max=threshold)``. It
never hands the loss ``log pi_behav``. The translator sets ``rollout_is=token`` with threshold
1e9 > exp(20), so the weight is never truncated and on valid tokens
``log r = log(rollout_is_weights)``, ``log pi_behav = log pi_prox - log r`` exactly as far as the
clamp allows (|log r| <= 20, the same clamp suite.core.losses applies). The modes' own
parameters (``Correction.params``: the cap C, the TBPO bands) come in as one JSON value,
``SUITE_LOSS_PARAMS``, that the translator puts in Ray's runtime_env, because verl's ActorConfig
has no field for them; clip ranges and the dual clip come from verl's ``clip_ratio_low`` /
``clip_ratio_high`` / ``clip_ratio_c``.

QaRL's rollout-aligned forward (``correction.aligned_forward=true``): when the translator sets
``SUITE_ALIGNED_FORWARD`` (the rollout quantizer's spec) in the workers' environment, loading the
plugin also swaps verl's FSDP actor engines for aligned ones (suite.verl.aligned). That happens
before the losses are registered, so a failure there (which verl logs only at debug level) also
leaves the suite loss modes unregistered and the run stops at its first update instead of
training silently without the aligned forward.

Metrics: besides the loss's own stats, each registered loss returns the token quantiles of
``r = pi_prox / pi_behav`` (``rollout_corr/ratio_p1`` ...) and of ``R = pi_theta / pi_prox``
(``actor/ratio_p1`` ...) from suite.core.metrics, over the micro-batch's valid tokens; verl
averages a loss's metrics over micro-batches (and ranks), so a verl quantile is a mean of
micro-batch quantiles (docs/metrics.md).

Aggregation: suite.core.losses aggregates over the micro-batch it is given. Under data
parallelism verl normalises by global counts (``config.global_batch_info``); the loss is rescaled
by ``local count / global count * dp_size`` so the gradient equals verl's own aggregation.
"""

from __future__ import annotations

import json
import logging
import os

import torch

from suite.core.losses import CORRECTIONS, policy_loss
from suite.core.metrics import mismatch_ratio_metrics, policy_ratio_metrics
from suite.verl import LOSS_PARAMS_ENV



def _env_params(mode: str) -> dict[str, float | str]:
    wanted = CORRECTIONS[mode].params
    raw = os.environ.get(LOSS_PARAMS_ENV)
    if raw is None:
        raise RuntimeError(
            f"suite loss mode {mode!r} needs the environment variable {LOSS_PARAMS_ENV} (set by suite.verl.translate "
            f"through +ray_kwargs.ray_init.runtime_env.env_vars.{LOSS_PARAMS_ENV}); "
            "run verl through `suite run backend=verl`"
        )
    values = json.loads(raw)
    missing = [k for k in wanted if k not in values]
    if missing:
        raise RuntimeError(f"{LOSS_PARAMS_ENV} lacks {', '.join(missing)} for suite loss mode {mode!r}: {raw}")
    return {k: values[k] if isinstance(values[k], str) else float(values[k]) for k in wanted}


def behav_from_is_weights(old_log_prob: torch.Tensor, rollout_is_weights: torch.Tensor | None,
                          mask: torch.Tensor) -> torch.Tensor:
    """log pi_behav recovered from verl's untruncated token IS weights (see module docstring)."""
    if rollout_is_weights is None:
        raise RuntimeError(
            "suite loss modes need verl's rollout_is_weights: set algorithm.rollout_correction.rollout_is=token "
            "and rollout_is_threshold=1e9 (suite.verl.translate does), with bypass_mode=false"
        )
    valid = mask.bool()
    w = torch.where(valid, rollout_is_weights.to(old_log_prob.dtype), torch.ones_like(old_log_prob))  # [B, T]
    return old_log_prob - torch.log(w)  # [B, T]; log pi_behav = log pi_prox - log r


def _global_scale(mask: torch.Tensor, agg: str, config) -> float:
    """verl normalises by global token / sequence counts under data parallelism (core_algos.agg_loss)."""
    info = dict(getattr(config, "global_batch_info", None) or {})
    dp = int(info.get("dp_size", 1) or 1)
    m = mask.to(torch.float32)
    if agg == "token-mean":
        total = info.get("batch_num_tokens")
        local = m.sum()
    else:
        total = info.get("global_batch_size")
        local = (m.sum(-1) > 0).to(torch.float32).sum()
    if total is None:
        if dp > 1:
            raise ValueError(f"verl gave dp_size={dp} without the global count for loss_agg_mode={agg!r}")
        return 1.0
    return float(local) / float(total) * dp


def _suite_loss(mode: str, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                rollout_is_weights):
    if config is None:
        raise ValueError("verl passed no actor config to the suite policy loss")
    behav = behav_from_is_weights(old_log_prob, rollout_is_weights, response_mask)
    clip_low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    clip_high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    loss, stats = policy_loss(
        log_prob,
        old_log_prob,
        behav,
        advantages,
        response_mask,
        mode=mode,
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=config.get("clip_ratio_c", 3.0),
        agg=loss_agg_mode,
        **_env_params(mode),
    )
    stats.update(mismatch_ratio_metrics(old_log_prob, behav, response_mask))
    stats.update(policy_ratio_metrics(log_prob, old_log_prob, response_mask))
    return loss * _global_scale(response_mask, loss_agg_mode, config), stats


def plugin_modes() -> tuple[str, ...]:
    """The corrections this plugin registers with verl (the rest verl runs with its own losses)."""
    return tuple(name for name, c in CORRECTIONS.items() if c.verl == "plugin")


def _register() -> None:
    from verl.trainer.ppo.core_algos import register_policy_loss

    def make(mode: str):
        def loss_fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                    rollout_is_weights=None):
            return _suite_loss(mode, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                               rollout_is_weights)

        loss_fn.__name__ = loss_fn.__qualname__ = f"suite_{mode}"
        loss_fn.__doc__ = f"{CORRECTIONS[mode].label}: {CORRECTIONS[mode].reproduces} (suite.core.losses mode {mode})."
        return loss_fn

    for mode in plugin_modes():
        register_policy_loss(mode)(make(mode))


def _install_aligned() -> None:
    from suite.verl.aligned import install

    try:
        install()  # a no-op unless SUITE_ALIGNED_FORWARD is set
    except Exception:
        logging.getLogger(__name__).exception("suite plugin: the QaRL aligned forward could not be installed")
        raise


def _install_cpu() -> None:
    from suite.verl.cpu_workarounds import CPU_ENV, register

    if os.environ.get(CPU_ENV) == "1":  # CPU runs and tests only (backend.device=cpu)

        register()


_install_cpu()
_install_aligned()
_register()

__all__ = ["LOSS_PARAMS_ENV", "behav_from_is_weights", "plugin_modes"]
