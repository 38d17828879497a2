"""Supervised warm start: a short SFT on task traces so RL starts from a policy with
non-trivial accuracy, as the papers start RL from a pretrained (instruct or base) model.

The result is cached on disk under a key made of everything it depends on (model shape,
task, difficulty, tokenizer vocabulary, SFT hyper-parameters, warm-start seed, and this
module's format version), so a sweep pays for it once per distinct setting. Concurrent runs
that need the same warm start wait on a file lock instead of training it twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import random
import time

import torch
from tqdm import tqdm

from suite.core.losses import masked_mean
from suite.embedded.batch import pack
from suite.embedded.config import WARM_START_POOL
from suite.embedded.model import ModelConfig, Transformer, response_logprobs
from suite.embedded.tasks import flawed_response, make_split
from suite.embedded.tokenizer import CharTokenizer
from suite.hardware import cpu_features
from suite.tracking.atomic import atomic_write

FORMAT_VERSION = 1  # bump when the SFT recipe changes, so stale caches are not reused


def cache_key(model_cfg: ModelConfig, task_name: str, difficulty: int, tokenizer: CharTokenizer, **sft) -> str:
    blob = json.dumps(
        {
            "v": FORMAT_VERSION,
            "model": dataclasses.asdict(model_cfg),
            "task": task_name,
            "difficulty": difficulty,
            "vocab": tokenizer.vocab_size,
            "vocab_hash": hashlib.sha256("".join(tokenizer.itos).encode()).hexdigest()[:12],
            **sft,
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@contextlib.contextmanager
def _file_lock(path: str):
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def sft_step_batch(examples, tokenizer: CharTokenizer):
    prompts = [tokenizer.encode(ex.prompt) for ex in examples]
    responses = [tokenizer.encode(ex.response) + [tokenizer.eos_id] for ex in examples]
    return pack(prompts, responses, tokenizer.pad_id)


def train_warm_start(
    model_cfg: ModelConfig,
    task,
    tokenizer: CharTokenizer,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    bf16_autocast: bool,
    flaw_op: str = "",
    flaw_prob: float = 0.0,
    progress: bool = True,
) -> tuple[dict, dict]:
    """Train a fresh model on task traces (teacher forcing, loss on response tokens + eos).

    With ``flaw_op``, each trace whose last step applies ``flaw_op`` is replaced, with
    probability ``flaw_prob``, by the flawed teacher's (``tasks.flawed_response``): the policy
    starts RL with a systematic blind spot that the exact-answer reward can correct."""
    torch.manual_seed(seed)
    model = Transformer(model_cfg)
    if steps == 0:
        return model.state_dict(), {"sft_steps": 0}
    pool = make_split(task, WARM_START_POOL, seed, "train")
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.0)
    warmup = max(1, steps // 20)

    def lr_at(i: int) -> float:  # linear warm-up, cosine decay to 10%
        if i < warmup:
            return lr * (i + 1) / warmup
        t = (i - warmup) / max(1, steps - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    start = time.perf_counter()
    bar = tqdm(range(steps), desc="warm start (SFT)", disable=not progress, leave=False, mininterval=1.0)
    loss_val = float("nan")
    for i in bar:
        batch = rng.sample(pool, batch_size)
        if flaw_op:
            batch = [dataclasses.replace(ex, response=flawed_response(ex.response, flaw_op))
                     if rng.random() < flaw_prob else ex for ex in batch]
        tokens, mask, p_len = sft_step_batch(batch, tokenizer)
        for group in opt.param_groups:
            group["lr"] = lr_at(i)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16_autocast):
            logp, _ = response_logprobs(model, tokens, mask, p_len, 1.0)  # [B, R]
        loss = -masked_mean(logp.float(), mask[:, p_len:].float())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_val = loss.item()
        if i % 20 == 0:
            bar.set_postfix(loss=f"{loss_val:.3f}")
        if not progress and (i + 1) % 100 == 0:  # no bar (not a terminal): periodic lines instead
            print(f"warm start {i + 1}/{steps} loss={loss_val:.3f}", flush=True)
    # Where it was trained: float32 GEMMs sum in a different order on AVX2 and AVX-512, so a
    # cache shared by two node types holds the first writer's weights (suite.hardware).
    info = {"sft_steps": steps, "sft_final_loss": loss_val, "sft_seconds": time.perf_counter() - start,
            "cpu_flags": cpu_features().label()}
    return model.state_dict(), info


def load_or_train(
    model_cfg: ModelConfig,
    task,
    task_name: str,
    difficulty: int,
    tokenizer: CharTokenizer,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    bf16_autocast: bool,
    cache_dir: str,
    flaw_op: str = "",
    flaw_prob: float = 0.0,
    progress: bool = True,
) -> tuple[dict, dict]:
    """The warm-start weights for this setting: from the cache, or trained and cached."""
    sft = {"steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed, "bf16": bf16_autocast}
    if flaw_op and flaw_prob > 0:  # keys of flaw-free warm starts stay as they were
        sft.update(flaw_op=flaw_op, flaw_prob=flaw_prob)
    key = cache_key(model_cfg, task_name, difficulty, tokenizer, **sft)
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, f"{key}.pt")
    with _file_lock(path + ".lock"):
        if os.path.exists(path):
            blob = torch.load(path, map_location="cpu", weights_only=True)
            return blob["state_dict"], {**blob["info"], "cache_hit": True, "cache_path": path}
        state, info = train_warm_start(
            model_cfg, task, tokenizer, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
            bf16_autocast=bf16_autocast, flaw_op=flaw_op, flaw_prob=flaw_prob, progress=progress,
        )
        atomic_write(path, lambda f: torch.save({"state_dict": state, "info": info}, f))
    return state, {**info, "cache_hit": False, "cache_path": path}
