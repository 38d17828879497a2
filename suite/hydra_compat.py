"""Where the suite meets Hydra's conventions without being a Hydra app: the config groups and
their options (`suite run -h`), Hydra's own config (`suite run --cfg hydra`), and why a `hydra.*`
override is refused rather than ignored. Public Hydra API only (`initialize`, `compose`, the
global config loader)."""

from __future__ import annotations

from omegaconf import OmegaConf


def hydra_refusal(key: str) -> str:
    """Why a `hydra.*` (or `hydra/...`) override is refused, and what does its job here: the suite
    composes its config with Hydra but runs no Hydra app, so Hydra's runner settings would be ignored."""
    if key.startswith(("hydra.run.dir", "hydra.sweep.dir")):
        hint = "out_dir=DIR puts the run in DIR/<run_id>"
    elif key.startswith("hydra.job.chdir"):
        hint = "the suite never changes the working directory; out_dir=DIR says where runs go"
    elif key.startswith(("hydra/launcher", "hydra/sweeper", "hydra.launcher", "hydra.sweeper")):
        hint = "several runs are a sweep file run by `suite sweep FILE` (launcher=local|slurm)"
    else:
        hint = "suite runs no Hydra app; its config is every key `suite run --cfg job` prints"
    return f"Hydra's runner keys (hydra.*) are not used by suite: {hint}"


def hydra_config_yaml(overrides: list[str]) -> str:
    """Hydra's own config for these overrides (`--cfg hydra`), as Hydra prints it: unresolved,
    under `hydra:`. `hydra.runtime.choices` is the option chosen in each config group."""
    from hydra import compose, initialize
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize(version_base="1.3", config_path=None, job_name="suite"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    GlobalHydra.instance().clear()
    return ("# suite composes its config with Hydra but runs no Hydra app: these settings are Hydra's\n"
            "# defaults and the chosen options (runtime.choices); hydra.* overrides are refused.\n"
            + OmegaConf.to_yaml({"hydra": OmegaConf.to_container(cfg.hydra, resolve=False)}))


def _store_shape(node: dict) -> tuple:
    """The names in Hydra's ConfigStore, nested as stored, but for Hydra's own group (which
    `initialize` fills in): what `config_groups` depends on."""
    return tuple((k, _store_shape(v) if isinstance(v, dict) else None)
                 for k, v in sorted(node.items()) if k != "hydra")


_GROUPS: dict[tuple, dict[str, tuple[str, ...]]] = {}  # ConfigStore shape -> its groups and options


def config_groups() -> dict[str, list[str]]:
    """Each config group and its options, from Hydra's config loader (public `initialize`).

    Hydra is asked once per ConfigStore content: its loader is slow to list the groups
    (docs/bench.md, "Measurements behind the code"), and every sweep composer asks again."""
    from hydra import initialize
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra

    shape = _store_shape(ConfigStore.instance().repo)
    if shape not in _GROUPS:
        GlobalHydra.instance().clear()
        with initialize(version_base="1.3", config_path=None, job_name="suite"):
            loader = GlobalHydra.instance().config_loader()
            _GROUPS[shape] = {g: tuple(loader.get_group_options(g))
                              for g in sorted(loader.list_groups("")) if g != "hydra"}
        GlobalHydra.instance().clear()
    return {g: list(options) for g, options in _GROUPS[shape].items()}
