"""UAQ for Hugging Face checkpoints: rewrite safetensors shards with the invariant scaling.

    suite uaq apply --s 1.5 IN_DIR OUT_DIR     # norm gains x s; q/k/v and gate/up weights / s
    suite uaq undo  --s 1.5 IN_DIR OUT_DIR     # the inverse, e.g. to export a trained model

The scaling is suite.core.uaq's (``apply_uaq`` / ``undo_uaq`` with its ``llama`` / ``qwen2``
module mappings), run on a module tree built from the checkpoint's tensor names, so there is
no second implementation. Architectures whose mapping is not known are refused. The tool never
writes into its input: OUT_DIR must differ from IN_DIR and be absent or empty; it is written
under a temporary name and renamed when complete. After ``apply`` the first
``verify_layers`` blocks of both checkpoints are run on a few tokens (float32, CPU) and the
logits compared; ``uaq.json`` in OUT_DIR records what was done: op, s, architecture, mapping,
the source directory and the SHA-256 of its shards and of the shards written. ``undo`` reads it
back and refuses a checkpoint it does not describe (no record, another s, another mapping),
and writes ``uaq_undone.json`` (no ``uaq.json``: the result is an ordinary checkpoint again).

Memory: all tensors are loaded on CPU at once (a 7B bf16 model needs ~15 GB).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from suite.core.uaq import apply_uaq, undo_uaq

# Hugging Face architecture -> suite.core.uaq mapping name
ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
MARKER = "uaq.json"
UNDONE = "uaq_undone.json"  # what undo wrote; a checkpoint with it is an ordinary one again


class UAQError(ValueError):
    """A checkpoint the UAQ tool refuses to transform; the message says why."""


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UAQError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UAQError(f"{path}: must be a JSON object, got {type(data).__name__}")
    return data


def architecture_mapping(model_dir: Path) -> tuple[str, str]:
    """(architecture, suite.core.uaq mapping name) from ``config.json``; refuses unknown ones."""
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise UAQError(f"{model_dir}: no config.json (not a Hugging Face model directory)")
    archs = _read_json(cfg_path).get("architectures") or []
    if len(archs) != 1 or archs[0] not in ARCHITECTURES:
        raise UAQError(
            f"{cfg_path}: architectures={archs}; the UAQ module mapping is known only for "
            f"{', '.join(sorted(ARCHITECTURES))}"
        )
    return archs[0], ARCHITECTURES[archs[0]]


INDEX = "model.safetensors.index.json"  # Hugging Face's map of a sharded checkpoint: tensor name -> shard


def _shards(model_dir: Path) -> list[Path]:
    """The checkpoint's shards; a sharded one must have every shard its index names (checked
    before any tensor is read, so nothing is rescaled from part of a model)."""
    shards = sorted(model_dir.glob("*.safetensors"))
    index = model_dir / INDEX
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise UAQError(f"{index}: has no weight_map (tensor name -> shard file)")
        named = sorted(set(map(str, weight_map.values())))
        missing = [n for n in named if not (model_dir / n).is_file()]
        if missing:
            more = ", ..." if len(missing) > 3 else ""
            raise UAQError(f"{model_dir}: {len(missing)} of the {len(named)} shards {INDEX} names are missing "
                           f"({', '.join(missing[:3])}{more}); copy the whole checkpoint")
    if not shards:
        raise UAQError(f"{model_dir}: no *.safetensors shards (convert .bin checkpoints to safetensors first)")
    return shards


def _check_index(model_dir: Path, tensors: dict) -> None:
    """Every tensor the index names was in its shard (a shard rewritten short is refused too)."""
    index = model_dir / INDEX
    if not index.is_file():
        return
    absent = sorted(set(_read_json(index)["weight_map"]) - set(tensors))
    if absent:
        raise UAQError(f"{model_dir}: {len(absent)} tensors {INDEX} names are in no shard ({', '.join(absent[:3])}"
                       f"{', ...' if len(absent) > 3 else ''}); copy the whole checkpoint")


def _module_tree(tensors: dict[str, torch.Tensor]) -> nn.Module:
    """nn.Module hierarchy whose parameters *are* the checkpoint tensors (shared storage)."""
    root = nn.Module()
    for name, t in tensors.items():
        *path, leaf = name.split(".")
        mod = root
        for part in path:
            child = mod._modules.get(part)
            if child is None:
                child = nn.Module()
                mod.add_module(part, child)
            mod = child
        mod.register_parameter(leaf, nn.Parameter(t, requires_grad=False))
    return root


def _check_out(in_dir: Path, out_dir: Path) -> None:
    if out_dir.resolve() == in_dir.resolve():
        raise UAQError(f"OUT_DIR {out_dir} is IN_DIR: the UAQ tool never overwrites its input")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise UAQError(f"OUT_DIR {out_dir} exists and is not empty; choose a new directory")
    if in_dir.resolve() in out_dir.resolve().parents:
        raise UAQError(f"OUT_DIR {out_dir} lies inside IN_DIR {in_dir}")
    from suite.tracking.fscheck import writable_problem

    if (problem := writable_problem(out_dir, "OUT_DIR", is_dir=True)) is not None:
        raise UAQError(problem)


def transform(in_dir: str | os.PathLike, out_dir: str | os.PathLike, s: float, *, undo: bool = False,
              verify_layers: int = 2, verify_tokens: int = 8, log=print) -> dict:
    """Write the UAQ-transformed (or, with ``undo``, restored) copy of ``in_dir`` to ``out_dir``.

    Returns a report: architecture, mapping, scaled tensor count, and after ``apply`` the
    invariance check (``max_rel_logit_diff`` over ``verify_layers`` blocks).
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    in_dir, out_dir = Path(in_dir), Path(out_dir)
    if not in_dir.is_dir():
        raise UAQError(f"IN_DIR {in_dir} is not a directory")
    _check_out(in_dir, out_dir)
    arch, mapping = architecture_mapping(in_dir)
    marker = in_dir / MARKER
    prior = _read_json(marker) if marker.is_file() else None
    if prior is not None and not isinstance(prior.get("s"), (int, float)):
        raise UAQError(f"{marker}: has no numeric 's' (the scale apply used); not a record `suite uaq apply` wrote")
    if undo and prior is None:
        # undo divides norms by s and multiplies the linears they feed: on weights never
        # transformed that is not a restore but a new (non-invariant) model
        raise UAQError(f"{in_dir} has no {MARKER}: it was not written by `suite uaq apply`, so there is nothing "
                       f"to undo")
    if not undo and prior is not None:
        raise UAQError(f"{in_dir} is already UAQ-transformed (s={prior['s']}, {MARKER}); undo it first")
    if undo and prior is not None and float(prior["s"]) != float(s):
        raise UAQError(f"{in_dir} was transformed with s={prior['s']} ({MARKER}), not s={s}")
    if undo and prior is not None:
        _check_record(marker, prior, arch, mapping)

    shards = _shards(in_dir)
    tensors: dict[str, torch.Tensor] = {}
    owner: dict[str, Path] = {}
    metadata: dict[Path, dict] = {}
    for shard in shards:
        try:
            with safe_open(str(shard), framework="pt") as f:
                metadata[shard] = f.metadata() or {"format": "pt"}
                for key in f.keys():
                    tensors[key] = f.get_tensor(key)
                    owner[key] = shard
        except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types (truncated, bad header)
            raise UAQError(f"{shard}: not a readable safetensors file ({type(exc).__name__}: {exc})") from None
    _check_index(in_dir, tensors)
    tree = _module_tree(tensors)
    pairs = (undo_uaq if undo else apply_uaq)(tree, s, mapping)  # validates before changing anything
    n_scaled = sum(1 + len(lins) for _, lins in pairs)
    log(f"uaq {'undo' if undo else 'apply'} s={s:g} ({arch}, mapping {mapping}): {len(pairs)} norms, "
        f"{n_scaled} tensors rescaled")

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        for item in in_dir.iterdir():
            if item.suffix == ".safetensors" or item.name in (MARKER, UNDONE):
                continue
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
        for shard in shards:
            part = {k: tensors[k].contiguous() for k in tensors if owner[k] == shard}
            save_file(part, str(tmp / shard.name), metadata=metadata[shard])
        report = {"op": "undo" if undo else "apply", "s": float(s), "architecture": arch, "mapping": mapping,
                  "source": str(in_dir.resolve()), "tensors_rescaled": n_scaled,
                  "source_sha256": shards_digest(shards),
                  "shards_sha256": shards_digest(sorted(tmp.glob("*.safetensors")))}
        if undo:
            if prior.get("shards_sha256") not in (None, report["source_sha256"]):
                log(f"uaq undo: the shards changed since apply wrote them (e.g. trained); undoing s={s:g}")
            (tmp / UNDONE).write_text(json.dumps({**report, "applied": prior}, indent=2) + "\n")
        else:
            report.update(verify_invariance(in_dir, tmp, layers=verify_layers, n_tokens=verify_tokens))
            log(f"uaq verify: max relative logit difference {report['max_rel_logit_diff']:.2e} "
                f"over {report['verify_layers']} blocks, {verify_tokens} tokens (tolerance {report['tolerance']:.1e})")
            (tmp / MARKER).write_text(json.dumps(report, indent=2) + "\n")
        if out_dir.exists():
            out_dir.rmdir()  # empty (checked above)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report


def shards_digest(shards: list[Path]) -> str:
    """SHA-256 over the shards' names and bytes, in name order: which weights a record is about."""
    import hashlib

    h = hashlib.sha256()
    for shard in sorted(shards, key=lambda p: p.name):
        h.update(shard.name.encode() + b"\0")
        with open(shard, "rb") as fh:
            while chunk := fh.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()


def _check_record(marker: Path, prior: dict, arch: str, mapping: str) -> None:
    """An undo is the inverse of the apply the record describes, or it is refused."""
    if prior.get("op", "apply") != "apply":
        raise UAQError(f"{marker}: op={prior.get('op')!r}: not a record `suite uaq apply` wrote (op must be 'apply')")
    if prior.get("mapping", mapping) != mapping:
        raise UAQError(f"{marker}: recorded mapping {prior['mapping']!r}, but config.json says {arch} "
                       f"(mapping {mapping!r}): undo would rescale other tensors than apply did")


def _truncated_model(model_dir: Path, layers: int):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    config.num_hidden_layers = min(layers, config.num_hidden_layers)
    if hasattr(config, "layer_types") and config.layer_types is not None:
        config.layer_types = config.layer_types[: config.num_hidden_layers]
    return AutoModelForCausalLM.from_pretrained(model_dir, config=config, torch_dtype=torch.float32).eval()


@torch.no_grad()
def verify_invariance(orig_dir: Path, new_dir: Path, *, layers: int = 2, n_tokens: int = 8, seed: int = 0) -> dict:
    """Run the first ``layers`` blocks of both checkpoints (float32) on ``n_tokens`` random tokens.

    Raises UAQError when the logits differ by more than ``tolerance`` relative to their largest
    magnitude: 1e-5 for float32 checkpoints, 4 ulp of the stored dtype otherwise (a bf16
    checkpoint rounds each rescaled entry once).
    """
    import transformers

    transformers.logging.set_verbosity_error()
    a = _truncated_model(orig_dir, layers)
    b = _truncated_model(new_dir, layers)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, a.config.vocab_size, (1, n_tokens), generator=g)
    la, lb = a(tokens).logits, b(tokens).logits  # [1, n_tokens, V]
    rel = float((la - lb).abs().max() / la.abs().max().clamp(min=1e-30))
    stored = getattr(a.config, "torch_dtype", None) or torch.float32
    stored = getattr(torch, stored) if isinstance(stored, str) else stored
    tol = 1e-5 if stored == torch.float32 else 4 * torch.finfo(stored).eps
    if not rel <= tol:
        raise UAQError(f"UAQ invariance check failed: max relative logit difference {rel:.3e} > {tol:.1e}")
    return {"max_rel_logit_diff": rel, "tolerance": tol, "verify_layers": a.config.num_hidden_layers}


__all__ = ["ARCHITECTURES", "UAQError", "architecture_mapping", "transform", "verify_invariance"]
