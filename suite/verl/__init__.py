"""verl backend: the suite's runs on GPU clusters through verl 0.9.1 + vLLM (docs/verl.md).

- translate: run config -> verl ``main_ppo`` Hydra overrides / command
- plugin:    the ``acr`` / ``tbpo`` policy losses registered with verl (entry point ``verl.plugins``)
- hf_uaq:    UAQ on Hugging Face safetensors checkpoints (``suite uaq apply|undo``)
- int8_hook: vLLM worker extension re-quantizing synced weights to W8A8 (INT8) or W4A16
- cpu_workarounds: verl's CPU platform for vLLM's CPU build (loaded only with SUITE_VERL_CPU=1)
- w8a8_checkpoint: a compressed-tensors W8A8 checkpoint quantized by the suite
- runner:    SLURM allocation -> Ray cluster -> main_ppo; summary read back from MLflow

Nothing here imports verl or vLLM at module level.
"""

# The plugin modes' parameters as one JSON value in every Ray worker (translate writes, plugin reads).
LOSS_PARAMS_ENV = "SUITE_LOSS_PARAMS"
