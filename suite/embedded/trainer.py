"""The embedded RL loop: quantized rollout, full-precision training, every metric of docs/metrics.md.

One RL step (QuRL Alg. 1 / decoupled PPO, Hilton et al. 2021):

1. weight sync: re-quantize the rollout copy from the full-precision actor  (timing_s/update_weights)
2. rollout: sample G responses for each prompt with the quantized copy,
   keeping log pi_behav of every sampled token                              (timing_s/gen)
3. reward: exact-answer verifier (+ DAPO overlong shaping); DAPO dynamic sampling
   keeps groups with 0 < #correct < G and generates more to fill the batch
4. log pi_prox with the full-precision old actor                            (timing_s/old_log_prob)
5. advantages: GRPO/DAPO group-normalised outcome rewards, or GAE with a critic (PPO)
6. policy update: mini-batches x epochs of `suite.core.losses.policy_loss`  (timing_s/update_actor)
7. weight-update visibility of the quantizer on the step's update          (quant/*)

All math is `suite.core`; this module only moves tensors between the parts.
"""

from __future__ import annotations

import functools
import json
import os
import random
import time

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from suite import hardware
from suite.cell import open_mlflow_run
from suite.config import AlgoConfig, CorrectionConfig, RolloutConfig, TrainConfig, run_id
from suite.core import advantages as adv_fns
from suite.core.losses import CORRECTIONS, masked_mean, policy_loss, value_loss
from suite.core.metrics import (
    error_token_metrics,
    mismatch_ratio_metrics,
    model_update_visibility,
    policy_ratio_metrics,
    rollout_corr_metrics,
)
from suite.core.outliers import outlier_pairs, outlier_transform
from suite.core.quant import QuantScheme
from suite.embedded import parts
from suite.embedded.actor import trainer_logprobs
from suite.embedded.batch import Batch, concat_batches, select_rows
from suite.embedded.config import TRAIN_POOL
from suite.embedded.model import PRESETS, ModelConfig, Transformer
from suite.embedded.tasks import make_split, make_task, resolve_flaw_op
from suite.embedded.tokenizer import CharTokenizer
from suite.embedded.warmstart import load_or_train
from suite.identity import semantic_config
from suite.tracking import checkpoint as ckpt
from suite.tracking import rundir
from suite.tracking.lock import run_lock
from suite.tracking.loggers import JsonlLogger, MultiLogger, refuse_corrupt_jsonl

EVAL_SEED = 10_007  # held-out prompts are the same for every run seed, so seeds compare on one set
EVAL_BATCH = 128  # held-out prompts decoded at once


def _section(cls, node):
    """A config section as its plain dataclass (interpolations resolved)."""
    return cls(**OmegaConf.to_container(node, resolve=True))


class EmbeddedRun:
    """A resumable embedded run living in ``run_dir``.

    The config is read here, once: the step's parts receive its typed sections (``self.algo``,
    ``self.rollout``, ``self.optim``, ``self.correction``) and the builders of
    `suite.embedded.parts` plain values. Only the driver (`run`) keeps the whole config, to log it.
    """

    def __init__(self, cfg: DictConfig, run_dir: str, *, progress: bool = True, on_eval=None):
        self.cfg = cfg
        self.run_dir = run_dir
        self.progress = progress
        # on_eval(step, held-out acc) -> bool, after each RL-step evaluation: True stops the run
        # there, ending as pruned (summary "pruned": true, MLflow tag pruned=true, status KILLED).
        self.on_eval = on_eval
        self.algo = _section(AlgoConfig, cfg.algo)
        self.rollout = _section(RolloutConfig, cfg.rollout)
        self.optim = _section(TrainConfig, cfg.train)
        self.correction = _section(CorrectionConfig, cfg.correction)
        self.seed = cfg.seed
        # Resolved at compose time (suite.config.resolve_hardware); "auto" only if built by hand.
        q = cfg.quant
        self.bf16 = hardware.resolve_autocast(self.optim.autocast) == "bf16"
        self.kernels = hardware.resolve_kernels(q.kernels, q.precision, q.fp8_granularity)
        self.bf16_kernels = hardware.resolve_bf16_kernels(q.bf16_kernels, q.precision)
        hardware.check_executable(q.precision, self.kernels, self.bf16_kernels)  # or refuse, naming the key
        self.kernels_executed = hardware.executed_kernels(self.kernels, q.precision)
        os.makedirs(run_dir, exist_ok=True)
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)

        self.tokenizer = CharTokenizer()
        self.task_name = cfg.task.name
        self.task = make_task(cfg.task.name, cfg.task.difficulty)
        self.train_pool = make_split(self.task, TRAIN_POOL, cfg.seed, "train")
        self.eval_set = make_split(self.task, cfg.task.n_eval, EVAL_SEED, "eval")
        self.eval_samples = cfg.task.eval_samples
        self.eval_rollout_copy = bool(cfg.task.get("eval_rollout_copy", False))
        preset = dict(PRESETS[cfg.model.preset])
        preset["vocab_size"] = self.tokenizer.vocab_size
        self.model_cfg = ModelConfig(**preset)
        # compose refuses this first, from the level's prompt budget (suite.embedded.config); kept for
        # configs built or changed by hand
        prompt_max = max(len(self.tokenizer.encode(e.prompt)) for e in self.train_pool[:2000] + self.eval_set)
        need = prompt_max + self.rollout.max_new_tokens
        if need > self.model_cfg.max_seq_len:
            raise ValueError(
                f"model.preset={cfg.model.preset} has max_seq_len {self.model_cfg.max_seq_len} < longest prompt "
                f"({prompt_max}) + rollout.max_new_tokens ({self.rollout.max_new_tokens})"
            )
        self.scheme = QuantScheme(
            precision=q.precision, fp8_granularity=q.fp8_granularity,
            block_size=q.block_size, group_size=q.group_size, symmetric=q.symmetric, bits=q.weight_bits,
        )
        # lm_head quantized with the block linears; the activation-outlier transform at each use of the
        # weights by the rollout (its sync) and the aligned forward (suite.core.outliers)
        self.quant_lm_head, self.outlier_alpha, self.outlier_channels = q.lm_head, q.outlier_alpha, q.outlier_channels
        self.uaq_s, self.group_lr_s = cfg.uaq.s, cfg.uaq.group_lr_s
        ws = cfg.warm_start
        self.warm_start = dict(  # suite.embedded.warmstart.load_or_train's keyword arguments
            steps=ws.steps, batch_size=ws.batch_size, lr=ws.lr, seed=ws.seed, cache_dir=ws.cache_dir,
            flaw_op=resolve_flaw_op(cfg.task.name, ws.flaw_op), flaw_prob=ws.flaw_prob,
        )
        self.task_difficulty = cfg.task.difficulty

    # ---------------------------------------------------------------- set-up
    def load_warm_start(self, progress: bool | None = None) -> tuple[dict, dict]:
        """(state dict, info) of this run's warm start: from the cache, or trained and cached."""
        return load_or_train(
            self.model_cfg, self.task, self.task_name, self.task_difficulty, self.tokenizer,
            bf16_autocast=self.bf16, progress=self.progress if progress is None else progress, **self.warm_start,
        )

    def build(self) -> None:
        """Warm start (cached), actor, optimizer, engines and RNG streams; `run()` calls it first."""
        state, self.warm_info = self.load_warm_start()
        o = self.optim
        self.actor, self.qnames = parts.policy(self.model_cfg, state, seed=self.seed, uaq_s=self.uaq_s,
                                               lm_head=self.quant_lm_head)
        self.transform = None
        if self.outlier_alpha != 1.0 and self.outlier_channels > 0:
            self.transform = functools.partial(outlier_transform, pairs=outlier_pairs(self.actor),
                                               alpha=self.outlier_alpha, k=self.outlier_channels)
        self.opt = parts.optimizer(self.actor, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay,
                                   group_lr_s=self.group_lr_s)
        self.ref = parts.reference(self.actor, self.model_cfg) if self.algo.kl_coef > 0 else None
        self.critic = self.critic_opt = None
        if self.algo.name == "ppo":
            self.critic, self.critic_opt = parts.critic(self.model_cfg, state, lr=self.algo.critic_lr, betas=o.betas)
        self.engine, self.eval_engine = parts.engines(self.actor, self.scheme, kernels=self.kernels_executed,
                                                      bf16_kernels=self.bf16_kernels, lm_head=self.quant_lm_head,
                                                      outlier_alpha=self.outlier_alpha,
                                                      outlier_channels=self.outlier_channels)
        self.sample_gen, self.shuffle_gen = parts.generators(self.seed)
        self.step = 0
        self.baseline_acc = None

    def _generators(self) -> dict:
        return {"sample": self.sample_gen, "shuffle": self.shuffle_gen}

    def _state(self) -> dict:
        return {
            "step": self.step,
            "actor": self.actor.state_dict(),
            "opt": self.opt.state_dict(),
            "critic": self.critic.state_dict() if self.critic else None,
            "critic_opt": self.critic_opt.state_dict() if self.critic_opt else None,
            "rng": ckpt.rng_state(self._generators()),
            "baseline_acc": self.baseline_acc,
        }

    def _restore(self, state: dict) -> None:
        self.step = state["step"]
        self.actor.load_state_dict(state["actor"])
        self.opt.load_state_dict(state["opt"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_opt.load_state_dict(state["critic_opt"])
        ckpt.set_rng_state(state["rng"], self._generators())
        self.baseline_acc = state["baseline_acc"]

    # ---------------------------------------------------------------- pieces
    def _logprobs(self, model: Transformer, b: Batch, *, with_entropy: bool = False, aligned: bool = False):
        """log pi(token) under the trainer's forward (suite.embedded.actor.trainer_logprobs)."""
        return trainer_logprobs(model, b, self.rollout.temperature, bf16=self.bf16, with_entropy=with_entropy,
                                aligned_scheme=self.scheme if aligned else None, qnames=self.qnames,
                                transform=self.transform)

    def _generate(self, prompts: list, n_round: int) -> Batch:
        G = self.algo.group_size
        ids = [self.tokenizer.encode(ex.prompt) for ex in prompts for _ in range(G)]
        ro = self.engine.generate(
            ids, max_new_tokens=self.rollout.max_new_tokens, temperature=self.rollout.temperature,
            top_p=self.rollout.top_p, stop_id=self.tokenizer.eos_id, pad_id=self.tokenizer.pad_id,
            generator=self.sample_gen,
        )
        resp = ro.tokens[:, ro.response_start :]  # [N, R]
        correct = []
        for i, ex in enumerate(ex for ex in prompts for _ in range(G)):
            text = self.tokenizer.decode(resp[i][ro.response_mask[i]].tolist())
            correct.append(1.0 if self.task.verify(text, ex) else 0.0)
        correct_t = torch.tensor(correct)
        lengths = ro.response_len.long()
        ended = ro.response_mask.any(-1) & (resp.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)
                                            == self.tokenizer.eos_id)
        scores = correct_t.clone()
        if self.algo.overlong_buffer > 0:
            scores = scores + adv_fns.overlong_penalty(
                lengths.float(), max_len=self.rollout.max_new_tokens, cache_len=self.algo.overlong_buffer,
                penalty_factor=self.algo.overlong_penalty,
            )
        return Batch(
            tokens=ro.tokens, attention_mask=ro.attention_mask, start=ro.response_start,
            response_mask=ro.response_mask.float(), behav_logp=ro.behav_logp.float(), scores=scores,
            correct=correct_t, lengths=lengths, truncated=~ended,
        )

    def _rollout(self, metrics: dict) -> Batch:
        """Sample this step's groups; DAPO dynamic sampling fills the batch with informative groups."""
        P, G = self.rollout.prompts_per_step, self.algo.group_size
        kept: list[Batch] = []
        n_kept, n_rounds, n_gen_groups, all_acc = 0, 0, 0, []
        while True:
            rng = random.Random(f"{self.seed}-{self.step}-{n_rounds}")
            b = self._generate(rng.sample(self.train_pool, P), n_rounds)
            n_rounds += 1
            n_gen_groups += P
            all_acc.append(b.correct)
            if not self.algo.dynamic_sampling:
                kept.append(b)
                n_kept = P
                break
            group_ids = torch.arange(P).repeat_interleave(G)  # [N]
            keep = adv_fns.dapo_group_filter(b.correct, group_ids)  # [N] bool, whole groups
            idx = torch.nonzero(keep).squeeze(-1)  # [N_kept]
            if idx.numel():
                kept.append(select_rows(b, idx))
                n_kept += idx.numel() // G
            if n_kept >= P or n_rounds > self.algo.max_resample_rounds:
                break
        metrics["train/num_gen_batches"] = float(n_rounds)  # verl name for DAPO generation rounds
        metrics["train/acc"] = torch.cat(all_acc).mean().item()  # over every generated response
        if not kept:  # every group was all-correct or all-wrong: nothing to learn from this step
            return None
        batch = concat_batches(kept, self.tokenizer.pad_id)
        if self.algo.dynamic_sampling and n_kept > P:
            batch = select_rows(batch, torch.arange(P * G))
        metrics["train/kept_groups"] = float(min(n_kept, P))
        return batch

    def _advantages(self, b: Batch, metrics: dict):
        mask = b.response_mask
        if self.algo.name == "ppo":
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                values = self.critic(b.tokens, b.attention_mask, b.start).float()  # [N, R]
            rewards = torch.zeros_like(mask)  # [N, R]: outcome reward on the last response token
            last = (b.lengths - 1).clamp(min=0)
            rewards[torch.arange(len(last)), last] = b.scores
            advantages, returns = adv_fns.gae_advantages(rewards, values * mask, mask, gamma=self.algo.gamma,
                                                         lam=self.algo.lam)
            metrics["critic/values/mean"] = masked_mean(values, mask).item()
            return advantages, returns, values
        G = self.algo.group_size
        group_ids = torch.arange(len(b.scores)) // G  # [N]; groups are contiguous
        return adv_fns.grpo_advantages(b.scores, group_ids, mask, norm_by_std=self.algo.norm_adv_by_std), None, None

    def _grad_probe(self, b: Batch, advantages, prox_logp, metrics: dict) -> None:
        """The naive and TIS policy gradients on the whole batch at the actor before this step's
        first update (where R = 1, so they differ only by TIS's truncated weight min(r, C) on
        r = pi_prox / pi_behav): their cosine and norm ratio |g_tis| / |g_naive|. One forward, two
        backward passes through `torch.autograd.grad`: no .grad, optimizer or generator is touched.
        Nothing is logged when a gradient is zero (every group's rewards tied)."""
        params = [p for p in self.actor.parameters() if p.requires_grad]
        logp, _ = self._logprobs(self.actor, b, aligned=self.correction.aligned_forward)
        grads = []
        for mode, extra in (("naive", {}), ("tis", {"tis_cap": self.correction.tis_cap})):
            loss, _ = policy_loss(logp, prox_logp, b.behav_logp, advantages, b.response_mask, mode=mode,
                                  clip_low=self.algo.clip_low, clip_high=self.algo.clip_high,
                                  dual_clip=self.algo.dual_clip, agg=self.algo.agg, **extra)
            g = torch.autograd.grad(loss, params, retain_graph=mode == "naive", allow_unused=True)
            grads.append(torch.cat([(x if x is not None else torch.zeros_like(p)).reshape(-1)
                                    for x, p in zip(g, params)]).double())  # float64: a cosine near 1
        naive, tis = grads
        n_naive, n_tis = naive.norm(), tis.norm()
        if n_naive == 0 or n_tis == 0:  # every group tied (all advantages 0): no direction to compare
            return
        metrics["actor/grad_probe_cos"] = (naive @ tis / (n_naive * n_tis)).item()
        metrics["actor/grad_probe_norm_ratio"] = (n_tis / n_naive).item()

    def _update(self, b: Batch, advantages, returns, old_values, prox_logp, ref_logp, metrics: dict) -> None:
        N = b.tokens.shape[0]
        mb = max(1, N // self.optim.minibatches)
        mode = self.correction.mode
        loss_params = {k: getattr(self.correction, k) for k in CORRECTIONS[mode].params}  # e.g. tis_cap for tis / acr
        acc: dict[str, list[float]] = {}
        for _ in range(self.optim.epochs):
            perm = torch.randperm(N, generator=self.shuffle_gen)
            for i in range(0, N, mb):
                idx = perm[i : i + mb]
                sub = select_rows(b, idx)
                mask = sub.response_mask
                logp, ent = self._logprobs(self.actor, sub, with_entropy=True, aligned=self.correction.aligned_forward)
                loss, stats = policy_loss(
                    logp, prox_logp[idx], b.behav_logp[idx], advantages[idx], mask, mode=mode,
                    clip_low=self.algo.clip_low, clip_high=self.algo.clip_high, dual_clip=self.algo.dual_clip,
                    agg=self.algo.agg, **loss_params,
                )
                total = loss
                if self.ref is not None:
                    kl = adv_fns.kl_estimate(logp, ref_logp[idx], self.algo.kl_estimator)  # [mb, R]
                    kl_loss = masked_mean(kl, mask)
                    total = total + self.algo.kl_coef * kl_loss
                    acc.setdefault("actor/kl_loss", []).append(kl_loss.item())
                self.opt.zero_grad(set_to_none=True)
                total.backward()
                gn = torch.nn.utils.clip_grad_norm_(self.actor.parameters(), self.optim.grad_clip)
                self.opt.step()
                acc.setdefault("actor/pg_loss", []).append(loss.item())
                acc.setdefault("actor/grad_norm", []).append(gn.item())
                acc.setdefault("actor/entropy", []).append(masked_mean(ent, mask).item())
                for k, v in policy_ratio_metrics(logp, prox_logp[idx], mask).items():  # R quantiles, per mini-batch
                    acc.setdefault(k, []).append(v)
                for k, v in stats.items():
                    acc.setdefault(k, []).append(float(v))
                if self.critic is not None:
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                        v = self.critic(sub.tokens, sub.attention_mask, sub.start).float()
                    vloss, vstats = value_loss(v, old_values[idx], returns[idx], mask,
                                               clip_range_value=self.algo.value_clip)
                    self.critic_opt.zero_grad(set_to_none=True)
                    vloss.backward()
                    torch.nn.utils.clip_grad_norm_(self.critic.parameters(), self.optim.grad_clip)
                    self.critic_opt.step()
                    acc.setdefault("critic/vf_loss", []).append(vloss.item())
                    for k, val in vstats.items():
                        acc.setdefault(k, []).append(float(val))
        for k, vals in acc.items():
            metrics[k] = sum(vals) / len(vals)
        metrics["actor/lr"] = self.optim.lr

    def _held_out_acc(self, samples: int, temperature: float, top_p: float, seed: int, engine=None) -> float:
        """Mean verifier score over ``samples`` responses per held-out prompt, generated by ``engine``
        (default: the full-precision eval engine), synced by the caller."""
        engine = self.eval_engine if engine is None else engine
        examples = [ex for ex in self.eval_set for _ in range(samples)]
        correct = 0
        gen = torch.Generator().manual_seed(seed)  # the same draws at every evaluation
        for i in range(0, len(examples), EVAL_BATCH):
            chunk = examples[i : i + EVAL_BATCH]
            ro = engine.generate(
                [self.tokenizer.encode(e.prompt) for e in chunk], max_new_tokens=self.rollout.max_new_tokens,
                temperature=temperature, top_p=top_p, stop_id=self.tokenizer.eos_id,
                pad_id=self.tokenizer.pad_id, generator=gen,
            )
            resp = ro.tokens[:, ro.response_start :]
            for j, ex in enumerate(chunk):
                correct += self.task.verify(self.tokenizer.decode(resp[j][ro.response_mask[j]].tolist()), ex)
        return correct / len(examples)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Held-out accuracy of the full-precision actor (greedy by default)."""
        self.eval_engine.sync(self.actor)
        return self._held_out_acc(1, self.rollout.eval_temperature, 1.0, EVAL_SEED)

    @torch.no_grad()
    def evaluate_rollout_copy(self) -> dict[str, float]:
        """Held-out accuracy of the quantized rollout copy (the rollout engine re-synced from the
        actor: its quantizer, lm_head and outlier transform), greedy like `evaluate`, on the same
        prompts. Empty unless ``task.eval_rollout_copy``. The next step re-syncs the same weights,
        and decoding draws from its own generator, so the training trajectory is unchanged."""
        if not self.eval_rollout_copy:
            return {}
        self.engine.sync(self.actor)
        acc = self._held_out_acc(1, self.rollout.eval_temperature, 1.0, EVAL_SEED, engine=self.engine)
        return {f"val-aux/{self.task_name}/rollout_acc/mean@1": acc}

    @torch.no_grad()
    def evaluate_sampled(self) -> dict[str, float]:
        """avg@k of the full-precision actor: k = ``task.eval_samples`` samples per held-out prompt at
        the rollout's temperature and top_p, mean verifier score (QuRL's AIME avg@32; verl's mean@k).
        Empty when k = 0."""
        k = self.eval_samples
        if k == 0:
            return {}
        self.eval_engine.sync(self.actor)
        acc = self._held_out_acc(k, self.rollout.temperature, self.rollout.top_p, EVAL_SEED + 1)
        return {f"val-core/{self.task_name}/acc/mean@{k}": acc}

    def train_step(self) -> dict:
        """One RL step; returns its metrics."""
        m: dict[str, float] = {}
        t_step = time.perf_counter()
        m["timing_s/update_weights"] = self.engine.sync(self.actor)

        t = time.perf_counter()
        b = self._rollout(m)
        m["timing_s/gen"] = time.perf_counter() - t
        if b is None:
            m["timing_s/step"] = time.perf_counter() - t_step
            return m
        mask = b.response_mask
        n_gen_tokens = mask.sum().item()
        m["perf/gen_tokens_per_s"] = n_gen_tokens / max(m["timing_s/gen"], 1e-9)
        m["critic/score/mean"] = b.scores.mean().item()
        m["critic/score/max"] = b.scores.max().item()
        m["critic/score/min"] = b.scores.min().item()
        m["response_length/mean"] = b.lengths.float().mean().item()
        m["response_length/max"] = b.lengths.float().max().item()
        m["response_length/clip_ratio"] = b.truncated.float().mean().item()
        m.update(error_token_metrics(b.tokens[:, b.start :], mask, b.truncated))  # QaRL error tokens

        t = time.perf_counter()
        with torch.no_grad():
            prox_logp, _ = self._logprobs(self.actor, b, aligned=self.correction.aligned_forward)  # [N, R]
        m["timing_s/old_log_prob"] = time.perf_counter() - t
        m.update(rollout_corr_metrics(prox_logp, b.behav_logp, mask))
        m.update(mismatch_ratio_metrics(prox_logp, b.behav_logp, mask))
        ref_logp = None
        if self.ref is not None:
            t = time.perf_counter()
            with torch.no_grad():
                ref_logp, _ = self._logprobs(self.ref, b)
            m["timing_s/ref"] = time.perf_counter() - t

        t = time.perf_counter()
        advantages, returns, values = self._advantages(b, m)
        m["critic/advantages/mean"] = masked_mean(advantages, mask).item()
        m["timing_s/adv"] = time.perf_counter() - t

        before = {n: p.detach().clone() for n, p in self.actor.named_parameters() if n in self.qnames}
        every = self.optim.grad_probe_every
        if every and self.step % every == 0:
            t = time.perf_counter()
            self._grad_probe(b, advantages, prox_logp, m)
            m["timing_s/grad_probe"] = time.perf_counter() - t
        t = time.perf_counter()
        self._update(b, advantages, returns, values, prox_logp, ref_logp, m)
        m["timing_s/update_actor"] = time.perf_counter() - t
        after = {n: p.detach() for n, p in self.actor.named_parameters() if n in self.qnames}
        if self.transform is not None:  # the weights the rollout quantizes are the transformed ones
            before, after = self.transform(before), self.transform(after)
        m.update(model_update_visibility(before, after, self.scheme))

        m["timing_s/train"] = (m["timing_s/old_log_prob"] + m.get("timing_s/ref", 0.0) + m["timing_s/adv"]
                               + m["timing_s/update_actor"])
        m["timing_s/step"] = time.perf_counter() - t_step
        # verl: perf/throughput = all tokens (prompt + response) processed per second of step time.
        m["perf/throughput"] = b.attention_mask.sum().item() / m["timing_s/step"]
        m["perf/total_num_tokens"] = b.attention_mask.sum().item()
        return m

    # ---------------------------------------------------------------- driver
    def run(self) -> dict:
        """Run (or resume, or return the summary of) the run in ``run_dir``, holding its
        writer lock throughout: a second process on the same run dir raises `RunLockedError`."""
        with run_lock(self.run_dir):
            return self._run()

    def _run(self) -> dict:
        cfg = self.cfg
        summary_path = rundir.path(self.run_dir, rundir.SUMMARY_FILE)
        if os.path.exists(summary_path):
            with open(summary_path) as fh:
                summary = json.load(fh)
            summary["already_finished"] = True
            return summary
        drop_corrupt = cfg.tracking.drop_corrupt_metrics
        # refused before the warm start: metrics that cannot be read are never deleted unasked
        refuse_corrupt_jsonl(rundir.path(self.run_dir, rundir.METRICS_FILE), drop_corrupt)
        self.build()
        resumed = ckpt.load_latest_checkpoint(self.run_dir)
        jsonl = JsonlLogger(self.run_dir)
        if resumed is not None:
            self._restore(resumed[1])
        # Steps after the checkpoint are recomputed, never duplicated; with no checkpoint yet (a
        # kill before or during the first one) that is every step, the baseline evaluation included.
        jsonl.truncate_after(self.step if resumed is not None else -1, drop_corrupt=drop_corrupt)
        mlflow_logger = open_mlflow_run(cfg, self.run_dir, tags={
            "kernels_executed": self.kernels_executed, "cpu_flags": hardware.cpu_features().label(),
            # a cache written before the flags were recorded says "unknown"
            "warm_start_cpu_flags": str(self.warm_info.get("cpu_flags", "unknown"))})
        logger = MultiLogger([jsonl, mlflow_logger])
        if self.step == 0:
            logger.log_params(semantic_config(cfg))  # the run id's keys, not where output goes
            cfg_path = rundir.path(self.run_dir, rundir.CONFIG_FILE)
            OmegaConf.save(cfg, cfg_path, resolve=True)
            logger.log_artifact(cfg_path)
            t = time.perf_counter()
            self.baseline_acc = self.evaluate()
            sampled = {**self.evaluate_sampled(), **self.evaluate_rollout_copy()}
            logger.log_metrics(
                {f"val-core/{cfg.task.name}/acc/mean@1": self.baseline_acc, **sampled,
                 "timing_s/testing": time.perf_counter() - t,
                 **{f"warm_start/{k}": float(v) for k, v in self.warm_info.items() if isinstance(v, (int, float))}},
                step=0,
            )
        start_wall = time.perf_counter()
        bar = tqdm(total=cfg.steps, initial=self.step, desc=os.path.basename(self.run_dir), disable=not self.progress,
                   mininterval=1.0, dynamic_ncols=True)
        last_acc = self.baseline_acc
        pruned = False
        try:
            while self.step < cfg.steps and not pruned:
                self.step += 1
                m = self.train_step()
                if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
                    t = time.perf_counter()
                    last_acc = self.evaluate()
                    m[f"val-core/{cfg.task.name}/acc/mean@1"] = last_acc
                    m.update(self.evaluate_sampled())
                    m.update(self.evaluate_rollout_copy())
                    m["timing_s/testing"] = time.perf_counter() - t
                    pruned = self.on_eval is not None and bool(self.on_eval(self.step, last_acc))
                logger.log_metrics(m, step=self.step)
                bar.update(1)
                bar.set_postfix(acc=f"{m.get('train/acc', float('nan')):.2f}", val=f"{last_acc:.2f}",
                                kl=f"{m.get('rollout_corr/kl', float('nan')):.1e}", refresh=False)
                if cfg.tracking.console_every and self.step % cfg.tracking.console_every == 0 and not self.progress:
                    print(f"step {self.step}/{cfg.steps} train/acc={m.get('train/acc', float('nan')):.3f} "
                          f"val={last_acc:.3f} rollout_corr/kl={m.get('rollout_corr/kl', float('nan')):.2e}",
                          flush=True)
                if self.step % cfg.ckpt_every == 0 or self.step == cfg.steps or pruned:
                    ckpt.save_checkpoint(self.run_dir, self.step, self._state())
                    logger.flush()  # commit: MLflow receives exactly the checkpointed steps
        finally:
            bar.close()
        summary = {
            "run_id": run_id(cfg),
            "run_dir": self.run_dir,
            "steps": cfg.steps,
            "baseline_acc": self.baseline_acc,
            "final_acc": last_acc,
            "delta_acc": last_acc - self.baseline_acc,
            "wall_s_this_session": time.perf_counter() - start_wall,
            "mlflow_run_id": mlflow_logger.run_id,
            "tracking_uri": cfg.tracking.tracking_uri,
            "pruned": pruned,  # stopped early by on_eval; summary.json then keeps a re-run from resuming it
        }
        logger.log_artifact(rundir.path(self.run_dir, rundir.METRICS_FILE))
        if pruned:
            logger.set_tags({"pruned": "true", "pruned_step": str(self.step)})
        logger.close("KILLED" if pruned else "FINISHED")
        tmp = summary_path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(summary, fh, indent=2)
        os.replace(tmp, summary_path)
        return summary
