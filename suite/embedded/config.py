"""The embedded backend's checks of what its task needs (``backend=embedded``), run by
suite.config ``validate`` at compose time: a run that its task's prompts, traces or answers
cannot serve is refused naming the key, before a run dir or MLflow run exists.

Registered with ``suite.backend_config.register_backend`` on import (suite.config imports this
module last, by name; it imports suite.backend_config, never suite.config back). The bounds come
from the task level's own budgets (suite.embedded.tasks ``LEVELS``, ``HELD_OUT_PROMPTS``,
``FINAL_OPS``), never from drawing prompts, so the check is
cheap per cell (docs/bench.md, "Measurements behind the code"). Token counts are character
counts: `CharTokenizer` gives one token per character, and the trainer encodes prompts without
``<bos>`` (suite.embedded.trainer).
"""

from __future__ import annotations

from omegaconf import DictConfig

from suite.backend_config import BackendConfig, register_backend
from suite.overrides import check

TRAIN_POOL = 20_000  # training prompts drawn per run seed (suite.embedded.trainer)
WARM_START_POOL = 20_000  # training prompts drawn for the warm start (suite.embedded.warmstart)


def validate_embedded(cfg: DictConfig) -> None:
    """Refuse an embedded run its task cannot serve, naming the key and the allowed values."""
    # here, not at the top: suite.embedded.tasks imports suite.config, which imports this module
    from suite.embedded.model import PRESETS
    from suite.embedded.tasks import FINAL_OPS, HELD_OUT_PROMPTS, LEVELS, flaw_ops

    t, ws = cfg.task, cfg.warm_start
    levels = LEVELS[t.name]
    check(t.difficulty in levels, "task.difficulty",
          f"task={t.name} has difficulties {', '.join(map(str, sorted(levels)))}; got {t.difficulty}")
    level = levels[t.difficulty]
    task = f"task={t.name} difficulty {t.difficulty}"

    held_out = HELD_OUT_PROMPTS.get((t.name, t.difficulty))
    if held_out is not None:
        check(t.n_eval <= held_out, "task.n_eval",
              f"{task} holds out {held_out} distinct prompts: must be in [1, {held_out}], got {t.n_eval} "
              "(or choose a higher task.difficulty)")

    allowed = flaw_ops(t.name)
    check(ws.flaw_op in allowed, "warm_start.flaw_op",
          f"{ws.flaw_op!r} never ends a task={t.name} trace (they end with {' '.join(FINAL_OPS[t.name])}); "
          f"choose one of: {', '.join(allowed)}")

    # Rollout and evaluation decode max_new_tokens after the longest prompt (RolloutEngine.generate).
    preset, seq_len = cfg.model.preset, PRESETS[cfg.model.preset]["max_seq_len"]
    room = seq_len - level.max_prompt_chars
    check(room >= 1, "model.preset",
          f"{preset} has max_seq_len {seq_len}, no room after the {level.max_prompt_chars}-token prompts of {task}")
    check(cfg.rollout.max_new_tokens <= room, "rollout.max_new_tokens",
          f"must be in [1, {room}] with model.preset={preset} (max_seq_len {seq_len}) and {task} "
          f"(prompts up to {level.max_prompt_chars} tokens), got {cfg.rollout.max_new_tokens}")
    d_model = PRESETS[preset]["d_model"]  # the outlier channels are channels of the block norms' outputs
    check(cfg.quant.outlier_channels <= d_model, "quant.outlier_channels",
          f"must be in [1, {d_model}] (model.preset={preset}'s d_model), got {cfg.quant.outlier_channels}")
    check(cfg.rollout.prompts_per_step <= TRAIN_POOL, "rollout.prompts_per_step",
          f"samples each step's prompts without replacement from a pool of {TRAIN_POOL}: must be in "
          f"[1, {TRAIN_POOL}], got {cfg.rollout.prompts_per_step}")

    if ws.steps > 0:
        # Supervised sequences: prompt + trace + <eos> (suite.embedded.warmstart.sft_step_batch).
        need = level.max_prompt_chars + level.max_response_chars + 1
        fit = [p for p, v in PRESETS.items() if v["max_seq_len"] >= need]
        check(need <= seq_len, "model.preset",
              f"{preset} has max_seq_len {seq_len} < the warm start's longest sequence for {task}: prompt "
              f"{level.max_prompt_chars} + trace {level.max_response_chars} + <eos> = {need} tokens; choose one of: "
              f"{', '.join(fit) or '(none)'}, or warm_start.steps=0")
        check(ws.batch_size <= WARM_START_POOL, "warm_start.batch_size",
              f"samples each batch without replacement from a pool of {WARM_START_POOL} traces: must be in "
              f"[1, {WARM_START_POOL}], got {ws.batch_size}")


register_backend("embedded", BackendConfig(name="embedded"), validate_embedded)
