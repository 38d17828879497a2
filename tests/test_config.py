"""The typed config: group options, overrides, validation errors, run ids."""

import pytest
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from suite.config import ALGOS, CORRECTIONS, PRECISIONS, ConfigError, axes, compose_config, run_id


def test_defaults_are_the_papers_default_experiment():
    cfg = compose_config([])
    assert (cfg.quant.precision, cfg.correction.mode, cfg.uaq.s, cfg.algo.name) == ("int8", "acr", 1.5, "grpo")
    assert cfg.model.preset == "tiny" and cfg.warm_start.steps == 600 and cfg.warm_start.flaw_op == "auto"
    assert cfg.rollout.prompts_per_step * cfg.algo.group_size == 64
    assert cfg.rollout.max_new_tokens == 32 and cfg.steps == 150


def test_group_options_override_dataclass_defaults():
    cfg = compose_config(["algo=dapo"])
    # DAPO clip-higher / dynamic sampling / overlong shaping (arXiv 2503.14476).
    assert cfg.algo.name == "dapo" and cfg.algo.clip_high == 0.28 and cfg.algo.clip_low == 0.2
    assert cfg.algo.dynamic_sampling and cfg.algo.overlong_buffer > 0 and cfg.algo.agg == "token-mean"
    assert compose_config(["algo=ppo"]).algo.name == "ppo"
    cfg = compose_config(["quant=fp8", "quant.fp8_granularity=block", "correction=tis", "correction.tis_cap=8"])
    assert (cfg.quant.precision, cfg.quant.fp8_granularity, cfg.correction.mode, cfg.correction.tis_cap) == (
        "fp8", "block", "tis", 8.0)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize("algo", ALGOS)
def test_every_cell_of_the_matrix_composes_or_is_rejected_by_rule(precision, correction, algo):
    overrides = [f"quant={precision}", f"correction={correction}", f"algo={algo}"]
    if correction == "tbpo" and algo == "ppo":
        with pytest.raises(ConfigError, match="correction.mode"):
            compose_config(overrides)
        return
    cfg = compose_config(overrides)
    assert axes(cfg)["precision"] == precision and axes(cfg)["correction"] == correction and axes(cfg)["algo"] == algo


def test_unknown_group_option_lists_the_options():
    # the suite's line (the closest option, then every option) over Hydra's own error, kept as the cause
    with pytest.raises(ConfigError, match=r"^quant=int9: no such option; did you mean int8\?") as err:
        compose_config(["quant=int9"])
    for option in PRECISIONS:
        assert option in str(err.value).splitlines()[0]
    assert isinstance(err.value.__cause__, HydraException)


def test_unknown_key_is_rejected_at_compose_time():
    with pytest.raises(ConfigError, match=r"^uaq.ss: no such key; did you mean uaq.s\?") as err:
        compose_config(["uaq.ss=1.5"])
    # one line: Hydra's `+key` advice would offer what the suite then refuses
    assert "\n" not in str(err.value) and "+uaq.ss" not in str(err.value) and "append" not in str(err.value)
    with pytest.raises(ConfigError, match=r"^uaq.scale: no such key; `suite run --cfg job` prints every key"):
        compose_config(["uaq.scale=1.5"])  # nothing close enough: no guess


def test_type_error_names_the_key():
    with pytest.raises(HydraException) as err:
        compose_config(["train.lr=fast"])
    cause = err.value.__cause__
    assert isinstance(cause, OmegaConfBaseException) and "train.lr" in str(cause)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["algo.agg=mean"], "algo.agg"),
        (["uaq.s=0"], "uaq.s"),
        (["uaq.s=-1.5"], "uaq.s"),
        (["uaq.s=inf"], "uaq.s"),
        (["uaq.group_lr_s=0"], "uaq.group_lr_s"),
        (["uaq.group_lr_s=nan"], "uaq.group_lr_s"),
        (["uaq.s=1.5", "uaq.group_lr_s=1.5"], "uaq.group_lr_s"),
        (["quant.kernels=fast"], "quant.kernels"),
        (["quant.bf16_kernels=fast"], "quant.bf16_kernels"),
        (["quant.fp8_granularity=row"], "quant.fp8_granularity"),
        (["algo.group_size=1"], "algo.group_size"),
        (["train.minibatches=3"], "train.minibatches"),
        (["correction=tbpo", "algo=ppo"], "correction.mode"),
        (["quant=fp32", "correction.aligned_forward=true"], "correction.aligned_forward"),
        (["algo=ppo", "algo.dynamic_sampling=true"], "algo.dynamic_sampling"),
        (["algo.overlong_buffer=32"], "algo.overlong_buffer"),
        (["rollout.temperature=0"], "rollout.temperature"),
        (["task.difficulty=9"], "task.difficulty"),
        (["algo.clip_low=1.0"], "algo.clip_low"),
        (["task.eval_samples=-1"], "task.eval_samples"),
        (["task.eval_samples=1"], "task.eval_samples"),
    ],
)
def test_bad_values_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        compose_config(overrides)
    assert str(err.value).startswith(key)


def test_choice_error_lists_allowed_values():
    with pytest.raises(ConfigError) as err:
        compose_config(["algo.agg=mean"])
    assert "token-mean, seq-mean-token-mean, seq-mean-token-sum" in str(err.value)


def test_run_id_is_deterministic_and_semantic():
    base = run_id(compose_config([]))
    assert base == run_id(compose_config([]))
    assert base.startswith("grpo-int8-acr-s1.5-arith-seed0-")
    # Where results go does not change what is computed.
    assert base == run_id(compose_config(["out_dir=/elsewhere", "tracking.experiment=x", "threads=2"]))
    others = {run_id(compose_config(o)) for o in (["seed=1"], ["uaq.s=1.25"], ["train.lr=1e-3"], ["quant=fp8"])}
    assert base not in others and len(others) == 4


# --- what the task allows (backend=embedded: suite.embedded.config) -------------------------------


@pytest.mark.parametrize(
    "good, bad, key, allowed",
    [
        # arith difficulty 2 prompts are at most 12 tokens; the tiny preset holds 256
        (["rollout.max_new_tokens=244"], ["rollout.max_new_tokens=245"], "rollout.max_new_tokens", "[1, 244]"),
        (["task=word", "task.difficulty=3", "rollout.max_new_tokens=144"],
         ["task=word", "task.difficulty=3", "rollout.max_new_tokens=145"], "rollout.max_new_tokens", "[1, 144]"),
        (["task=word", "task.difficulty=3"], ["task=word", "task.difficulty=4"], "task.difficulty", "1, 2, 3"),
        (["task.difficulty=1", "task.n_eval=75"], ["task.difficulty=1", "task.n_eval=76"], "task.n_eval", "[1, 75]"),
        (["task.n_eval=2917"], ["task.n_eval=2918"], "task.n_eval", "[1, 2917]"),
        (["task=word", "warm_start.flaw_op=/"], ["warm_start.flaw_op=/"], "warm_start.flaw_op", "auto, none, +, -, *"),
        (["warm_start.batch_size=20000"], ["warm_start.batch_size=20001"], "warm_start.batch_size", "[1, 20000]"),
        # no warm start: its batch size is unused
        (["warm_start.steps=0", "warm_start.batch_size=20001"], ["warm_start.batch_size=20001"],
         "warm_start.batch_size", "[1, 20000]"),
        (["rollout.prompts_per_step=20000"], ["rollout.prompts_per_step=20001"], "rollout.prompts_per_step",
         "[1, 20000]"),
    ],
)
def test_task_bounds_accept_their_edge_and_refuse_one_past_it(good, bad, key, allowed):
    compose_config(good)
    with pytest.raises(ConfigError) as err:
        compose_config(bad)
    assert str(err.value).startswith(f"{key}:") and allowed in str(err.value), err.value


@pytest.mark.parametrize("name, difficulty", [("arith", d) for d in (1, 2, 3, 4)] + [("word", d) for d in (1, 2, 3)])
@pytest.mark.slow
def test_what_compose_accepts_the_run_sets_up(name, difficulty, tmp_path):
    """At the edge compose allows (the longest new-token budget, the largest held-out set), the
    embedded run's own late checks pass: the compose bounds are never looser than theirs."""
    from suite.embedded.config import validate_embedded
    from suite.embedded.tasks import HELD_OUT_PROMPTS, LEVELS
    from suite.embedded.trainer import EmbeddedRun

    room = 256 - LEVELS[name][difficulty].max_prompt_chars  # the tiny preset's max_seq_len is 256
    n_eval = HELD_OUT_PROMPTS.get((name, difficulty), 256)
    cfg = compose_config([f"task={name}", f"task.difficulty={difficulty}", f"task.n_eval={n_eval}",
                          f"rollout.max_new_tokens={room}", f"warm_start.cache_dir={tmp_path}"])
    run = EmbeddedRun(cfg, str(tmp_path / "run"), progress=False)  # raises where the run could not start
    assert len(run.eval_set) == n_eval and max(len(e.prompt) for e in run.train_pool) <= 256 - room
    cfg.rollout.max_new_tokens = room + 1
    with pytest.raises(ConfigError, match="rollout.max_new_tokens"):
        validate_embedded(cfg)


def test_warm_start_sequences_must_fit_the_preset(monkeypatch):
    """The warm start trains on prompt + trace + <eos>: a preset shorter than that is refused,
    naming the presets that fit (no real preset is that short, so one is shortened here)."""
    from suite.embedded.model import PRESETS

    monkeypatch.setitem(PRESETS["tiny"], "max_seq_len", 150)
    word3 = ["task=word", "task.difficulty=3", "rollout.max_new_tokens=8"]
    with pytest.raises(ConfigError) as err:
        compose_config(word3)  # 112 + 48 + 1 = 161 tokens
    msg = str(err.value)
    assert msg.startswith("model.preset:") and "161 tokens" in msg and "small, base, large, wide" in msg, msg
    assert "warm_start.steps=0" in msg
    compose_config([*word3, "warm_start.steps=0"])
    monkeypatch.setitem(PRESETS["tiny"], "max_seq_len", 100)  # not even the prompt fits
    with pytest.raises(ConfigError, match=r"^model.preset: tiny has max_seq_len 100, no room"):
        compose_config([*word3, "warm_start.steps=0"])


def test_task_checks_are_the_embedded_backends():
    """verl's prompts come from its parquet files and its model from model_path: the embedded
    task's bounds do not apply (a long response budget is verl's usual setting)."""
    verl = ["backend=verl", "backend.model_path=/m", "backend.train_files=/t", "backend.val_files=/v"]
    cfg = compose_config([*verl, "rollout.max_new_tokens=4096", "task.difficulty=1"])
    assert cfg.rollout.max_new_tokens == 4096
    with pytest.raises(ConfigError, match="rollout.max_new_tokens"):
        compose_config(["rollout.max_new_tokens=4096"])


# ------------------------------------------------------------------ dose axes (issue: phenomena as a dose-response map)


@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8])
def test_every_weight_only_dose_composes_and_names_its_width(bits):
    from suite.config import compose_config, run_id

    cfg = compose_config(["quant=wa16", f"quant.weight_bits={bits}", "quant.group_size=32", "quant.lm_head=true"])
    assert run_id(cfg).startswith(f"grpo-w{bits}a16-")


def test_new_keys_leave_existing_run_ids_alone():
    """Keys added for the dose map (the dose axes, the rollout copy's score, the gradient probe) are
    left out of the hash and the params at their defaults (suite.identity.OMITTED_AT_DEFAULT), so
    every config composed before them keeps its id; set, each makes another run."""
    from suite.config import compose_config, run_id
    from suite.identity import OMITTED_AT_DEFAULT, semantic_config

    from omegaconf import OmegaConf

    cfg = compose_config([])
    verl = compose_config(["backend=verl", "backend.model_path=/m", "backend.train_files=/t", "backend.val_files=/v"])
    for c in (cfg, verl):
        sem = semantic_config(c)
        present = [k for k in OMITTED_AT_DEFAULT if OmegaConf.select(c, k) is not None]
        assert len(present) == (len(OMITTED_AT_DEFAULT) if c is verl else
                                sum(not k.startswith("backend.") for k in OMITTED_AT_DEFAULT))
        for key in present:
            section, leaf = key.split(".", 1)
            assert leaf not in sem[section], key
        # a config without the keys at all (as composed before they existed) has the same id
        old = OmegaConf.create(OmegaConf.to_container(c))
        for key in present:
            section, leaf = key.split(".", 1)
            del old[section][leaf]
        assert run_id(old) == run_id(c)
    other = compose_config(["backend=verl", "backend.model_path=/m", "backend.train_files=/t", "backend.val_files=/v",
                            "backend.val_n=32"])
    assert semantic_config(other)["backend"]["val_n"] == 32 and run_id(other) != run_id(verl)
    dosed = compose_config(["quant.outlier_alpha=16"])
    assert semantic_config(dosed)["quant"]["outlier_alpha"] == 16.0 and run_id(dosed) != run_id(cfg)
    for override, section, leaf in (("task.eval_rollout_copy=true", "task", "eval_rollout_copy"),
                                    ("train.grad_probe_every=10", "train", "grad_probe_every")):
        other = compose_config([override])
        assert leaf in semantic_config(other)[section] and run_id(other) != run_id(cfg), override


def test_bad_width_and_group_size_name_the_allowed_values():
    from suite.config import ConfigError, compose_config

    with pytest.raises(ConfigError, match=r"quant\.weight_bits=5.*2, 3, 4, 6, 8"):
        compose_config(["quant=wa16", "quant.weight_bits=5"])
    with pytest.raises(ConfigError, match=r"quant\.group_size=48.*8, 16, 32, 64, 128, 256"):
        compose_config(["quant=wa16", "quant.group_size=48"])


def test_a_verl_runs_relative_paths_that_exist_become_absolute(tmp_path, monkeypatch):
    """verl starts in the run's directory, so a relative path (as `suite export --out export/seed0`
    prints them) is made absolute against the working directory at compose; what does not exist
    here (a path on the compute nodes only, a hub id) and absolute paths stay as written."""
    (tmp_path / "export" / "model").mkdir(parents=True)
    for name in ("a.parquet", "b.parquet", "reward.py"):
        (tmp_path / "export" / name).write_text("x")
    monkeypatch.chdir(tmp_path)
    cfg = compose_config(["backend=verl", "backend.device=cpu", "quant=bf16", "backend.model_path=export/model",
                          "backend.train_files='export/a.parquet,/data/train.parquet,export/b.parquet'",
                          "backend.val_files=Qwen/Qwen2.5-7B", "backend.reward_fn_path=./export/reward.py"])
    b = cfg.backend
    assert b.model_path == str(tmp_path / "export" / "model")
    assert b.train_files == f"{tmp_path}/export/a.parquet,/data/train.parquet,{tmp_path}/export/b.parquet"
    assert b.val_files == "Qwen/Qwen2.5-7B"
    assert b.reward_fn_path == str(tmp_path / "export" / "reward.py")
    same = compose_config(["backend=verl", "backend.device=cpu", "quant=bf16",
                           f"backend.model_path={tmp_path}/export/model",
                           f"backend.train_files='{tmp_path}/export/a.parquet,/data/train.parquet,"
                           f"{tmp_path}/export/b.parquet'", "backend.val_files=Qwen/Qwen2.5-7B",
                           f"backend.reward_fn_path={tmp_path}/export/reward.py"])
    assert run_id(same) == run_id(cfg)  # one run, however its paths were written


def test_verl_names_every_missing_path_and_the_install_in_one_message():
    """backend=verl without its paths: one line with all of them (not one per attempt), what provides each under
    a recipe, and what the environment lacks to run verl (here: an interpreter that is not there)."""
    with pytest.raises(ConfigError) as err:
        compose_config(["recipe=qurl-gsm8k", "backend.python=/nonexistent/bin/python"])
    msg = str(err.value)
    assert msg.startswith("backend.model_path, backend.train_files, backend.val_files: required with backend=verl")
    assert "model_path: recipe=qurl-gsm8k trains Qwen/Qwen2.5-0.5B-Instruct" in msg
    assert "train_files: `suite data prepare gsm8k --src FILE --out DIR`" in msg
    assert msg.endswith("; and backend.python=/nonexistent/bin/python: no such interpreter here (it runs verl's "
                        "trainer)") and "\n" not in msg
    with pytest.raises(ConfigError) as err:
        compose_config(["backend=verl", "backend.model_path=/m", "backend.python=/nonexistent/bin/python"])
    assert str(err.value).startswith("backend.train_files, backend.val_files: required")
