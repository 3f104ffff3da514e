r"""The study's distillation step on this machine's accelerator, against its limits.

  python -m jaxdistill.bench.accelerator                # Llama-3.2-1B <- Llama-3.1-8B
  python -m jaxdistill.bench.accelerator --pair qwen    # Qwen2.5-1.5B <- Qwen2.5-7B
  python -m jaxdistill.bench.accelerator --batch 8 --prompt_len 512 --new_tokens 128
  python -m jaxdistill.bench.accelerator --quick        # tiny random Llamas (a CPU check)

No weights are downloaded: the pair's real shapes (models presets) with
random weights, synthetic prompts of --prompt_len real tokens, and the run
configs/distill.py describes (the paper's Table 3: batch 32, prompts up to
2,048 tokens, 512 new, 4 micro-batches, the fused forward KL, student
bfloat16 over float32 weights, teacher bfloat16, remat 'auto'); EOS is off,
so every row decodes --new_tokens tokens. --quick is configs/distill.py:
runlocal (its tiny float32 models) at batch 4, prompt 16, 8 new tokens.

For each rollout policy (student, teacher), on --devices devices (default
one), with the training loop's own pieces (train/batches.SequenceMaker, then
step.train_step jitted as train/loop.py jits it), after two warm-up steps,
rounds of one whole step (rollout, then update), one rollout of a single new
token, and a sample of the matmul rate (presets.matmul_rate, the student's
compute dtype; sampled beside the steps, as bench.train does). Medians of:

  rollout   new tokens/s (batch x new tokens counted in the rollout's loss
            mask); the decode step, (rollout - 1-token rollout) / (new - 1),
            against its HBM limit: the bytes one step reads on a device (the
            policy model's weights as the decode layout holds them, and its
            whole KV cache: train/programs.rollout_program's limit_bytes /
            new tokens) / the device's HBM bandwidth;
  update    its time and MFU: model FLOPs (models.flops.train_step_flops) /
            time / (devices x peak bf16 FLOP/s);
  step      rollout + update, as train/loop.py runs them.

Peak FLOP/s and HBM bandwidth are the data sheet's of the device
(compile_only.local_target: TPUs and NVIDIA H100 / H200 / A100); elsewhere
(CPU) the measured matmul rate and copy bandwidth (presets.copy_bandwidth)
stand in, and the JSON says so. Beside each figure, with a known device, the
compile-only bound and limit of the same program (compile_only.compile_program
on train/programs.py's Programs of this run; null on CPU), and the peak
device memory (memory_stats' peak_bytes_in_use; null on CPU).

The peer: the same step in PyTorch on the same device, run first in a child
process (so that JAX's allocator has not taken the GPU): TRL's GKDTrainer
when TRL imports (lmbda=1.0 for student rollouts; lmbda=0.0 with seq_kd=True
for teacher rollouts; beta=0.0, forward KL, as bench.gkd), else the same
step in plain PyTorch + transformers; `peer.impl` says which, and why. Both
with the run's micro-batches, student weights float32 under bf16 autocast and
the teacher in bf16 (float32 for the tiny models), sdpa attention.

Headline: the student-policy step's time / its compile-only bound (goal <=
2x); without a bound (CPU), the peer's step time / ours. One JSON object on
stdout; progress on stderr.
"""
from __future__ import annotations

import argparse
import functools
from importlib import metadata
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from jaxdistill import compile_only
from jaxdistill import config_lib
from jaxdistill import losses
from jaxdistill import models
from jaxdistill import sharding
from jaxdistill.bench import presets
from jaxdistill.bench import suite
from jaxdistill.models import flops
from jaxdistill.train import batches as train_batches
from jaxdistill.train import loop
from jaxdistill.train import setup as train_setup
from jaxdistill.train import step as step_lib

# --pair: (student preset, teacher preset, the real vocabulary both share).
# None: configs/distill.py:runlocal's tiny models.
PAIRS = {
    "llama": ("llama-3.2-1b", "llama-3.1-8b", 128256),  # the paper's main pair
    "qwen": ("qwen2.5-1.5b", "qwen2.5-7b", 151665),     # its replication
    "tiny": (None, None, None),
}
# --quick: (batch, prompt_len, new_tokens, steps).
QUICK = (4, 16, 8, 2)
WARMUP = 2  # the second step recompiles for the donated state's layout
POLICIES = ("student", "teacher")
STEP_GOAL = 2.0   # step time <= this x its compile-only bound
PEER_GOAL = 2.0   # without a bound: peer step time >= this x ours
LR = 1e-5


def _log(*a):
  print(*a, file=sys.stderr, flush=True)


def run_config(pair: str, batch: int, prompt_len: int, new_tokens: int,
               grad_accum: int | None = None):
  """configs/distill.py (its runlocal for the tiny pair) with the pair's
  models as random weights, these shapes, and EOS off."""
  student, teacher, vocab = PAIRS[pair]
  config = config_lib.load_config(
      "configs/distill.py" + (":runlocal" if student is None else ""))
  if student is not None:
    config.student.preset, config.teacher.preset = student, teacher
  else:
    vocab = int(config.student.init["vocab_size"])
  for name in ("student", "teacher"):  # every row runs to new_tokens
    config[name].overrides = {"eos_token_id": ()}
  config.loss.vocab_size = vocab
  config.data.update(batch_size=batch, max_prompt_len=prompt_len)
  config.rollout.max_new_tokens = new_tokens
  if grad_accum is not None:
    config.optim.grad_accum = grad_accum
  config.track_sparsity = False  # the run's initial weights are not kept
  config.progress = False
  return config


def _with_policy(config, policy: str, new_tokens: int | None = None):
  c = config.copy_and_resolve_references()
  c.rollout.policy = policy
  if new_tokens is not None:
    c.rollout.max_new_tokens = new_tokens
  return c


def _median(xs):
  return float(statistics.median(xs))


def _first_line(e: BaseException) -> str:
  lines = [l for l in str(e).splitlines() if l.strip()]
  return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


class Run:
  """The models, train state and jitted update of one run on `mesh`."""

  def __init__(self, config, mesh):
    self.config, self.mesh = config, mesh
    self.rules = sharding.rules_from_config(config)
    config_lib.validate(config)
    config_lib.validate_run(config, mesh, self.rules)
    self.scfg, self.tcfg, _ = loop.model_configs(config)
    self.vocab = train_setup.shared_vocab(config, self.scfg, self.tcfg, None)
    config_lib.check_fits(config, {"student": self.scfg, "teacher": self.tcfg},
                          self.vocab)
    s_key, t_key = train_setup.init_keys(config.seed)
    self.teacher = train_setup.load_params(self.tcfg, config.teacher, mesh,
                                           self.rules, t_key, "teacher")
    params = train_setup.load_params(self.scfg, config.student, mesh,
                                     self.rules, s_key)
    self.optimizer, self.schedule = step_lib.make_optimizer(
        config.optim, config.total_steps,
        loop.trained_dtype(config, self.scfg))
    self.state_shard = step_lib.state_shardings(
        self.scfg, self.optimizer, params, mesh, self.rules)
    # Donated: the state's params are these buffers (no second copy in the
    # peak memory).
    self.state = jax.jit(lambda p: step_lib.new_state(self.optimizer, p),
                         out_shardings=step_lib.saved(self.state_shard),
                         donate_argnums=0)(params)
    b, p = int(config.data.batch_size), int(config.data.max_prompt_len)
    rs = np.random.default_rng(0)
    self.host = {"prompt": rs.integers(3, self.vocab, (b, p)).astype(np.int32),
                 "prompt_mask": np.ones((b, p), np.int32)}

  def policy(self, policy: str):
    """(step(rng) -> (rollout s, update s, batch, metrics), one-token
    rollout(rng) -> s) of a rollout policy."""
    c = _with_policy(self.config, policy)
    make = train_batches.SequenceMaker(c, self.scfg, self.tcfg, self.mesh,
                                       self.rules, vocab_size=self.vocab)
    make1 = train_batches.SequenceMaker(
        _with_policy(self.config, policy, 1), self.scfg, self.tcfg, self.mesh,
        self.rules, vocab_size=self.vocab)
    loss_fn = step_lib.make_loss_fn(c, self.scfg, self.tcfg, self.vocab,
                                    shard=sharding.Activations(self.mesh,
                                                               self.rules))
    update = step_lib.jit_update(functools.partial(
        step_lib.train_step, optimizer=self.optimizer, schedule=self.schedule,
        loss_fn=loss_fn, grad_accum=int(c.optim.grad_accum)), self.state_shard)
    reduction = c.loss.reduction

    def step(rng):
      # As train/loop.py's step_fn: the rollout ends reading its metrics
      # back, the update reading its loss.
      t0 = time.perf_counter()
      batch, ro = make(self.host, step_lib.policy_params(self.state),
                       self.teacher, rng)
      t1 = time.perf_counter()
      batch["weights"] = losses.reduction_weights(batch["loss_mask"], reduction)
      self.state, metrics = update(self.state, self.teacher, batch)
      metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
      t2 = time.perf_counter()
      return t1 - t0, t2 - t1, batch, {**metrics, **ro}

    def one_token(rng):
      t0 = time.perf_counter()
      make1(self.host, step_lib.policy_params(self.state), self.teacher, rng)
      return time.perf_counter() - t0
    return step, one_token

  def programs(self, policy: str) -> dict:
    """{name: compile_only.Program} of the run with `policy` (rollout, update)."""
    c = _with_policy(self.config, policy)
    return {p.name: p for p in loop.run_programs(
        c, self.scfg, self.tcfg, self.vocab, self.mesh, self.rules, False)}


def _sample(fn):
  """fn() or None: a limit sampled beside the steps must not cost the
  benchmark its figures (a device nearly full, say)."""
  try:
    return float(fn())
  except Exception as e:  # pylint: disable=broad-except
    _log(f"sample failed: {_first_line(e)}")
    return None


def measure(run: Run, policy: str, steps: int, samples: dict) -> dict:
  """Medians of the rollout, update and step times of `policy`, the tokens
  its rollout decoded, and its last metrics; appends the matmul rate (and,
  in `samples`' 'copy', the copy bandwidth) sampled each round."""
  step, one_token = run.policy(policy)
  key = jax.random.key(int(run.config.seed))
  one_key = jax.random.fold_in(key, 1 << 20)
  _log(f"{policy} policy: compiling, {WARMUP} warm-up steps ...")
  for i in range(WARMUP):
    step(jax.random.fold_in(key, i))
  one_token(one_key)
  ro_t, up_t, one_t = [], [], []
  dtype = run.scfg.dtype
  for i in range(WARMUP, WARMUP + steps):
    ro, up, batch, metrics = step(jax.random.fold_in(key, i))
    ro_t.append(ro)
    up_t.append(up)
    one_t.append(one_token(jax.random.fold_in(one_key, i)))
    samples["matmul"].append(_sample(lambda: presets.matmul_rate(dtype)))
    if "copy" in samples:
      samples["copy"].append(_sample(presets.copy_bandwidth))
    _log(f"{policy} round {i - WARMUP}: rollout {ro:.3f}s update {up:.3f}s "
         f"1-token rollout {one_t[-1]:.3f}s loss {metrics['train/loss']:.4f}")
  tokens = int(np.asarray(jax.device_get(batch["loss_mask"])).sum())
  return {"rollout_s": ro_t, "update_s": up_t, "one_token_s": one_t,
          "step_s": [a + b for a, b in zip(ro_t, up_t)], "new_tokens": tokens,
          "rollout_len": metrics["rollout/len"],
          "loss": metrics["train/loss"]}


def decode_limit(run: Run, program, policy: str, bandwidth: float) -> dict:
  """Bytes one decode step of `policy` reads on a device (the compile-only
  rollout program's limit_bytes per new token: weights as its decode layout
  holds them, and the KV cache) and the time they take at `bandwidth`."""
  n = int(run.config.rollout.max_new_tokens)
  cfg = run.scfg if policy == "student" else run.tcfg
  rows = int(run.config.data.batch_size) / run.mesh.devices.size
  kv = flops.kv_cache_bytes(cfg, rows, int(run.config.data.max_prompt_len) + n - 1)
  per_step = program.limit_bytes / n
  return {"bytes": per_step, "weight_bytes": per_step - kv,
          "kv_cache_bytes": kv, "bandwidth": bandwidth,
          "s": per_step / bandwidth if bandwidth else None}


def _bound(row) -> dict | None:
  """The figures of a compile-only row (None: no bound for this device)."""
  if row is None:
    return None
  keep = ("step_time_bound_s", "limit_s", "bound_by", "mfu_ceiling",
          "total_bytes", "hbm_bytes", "fits", "compile_s", "error")
  return {k: row.get(k) for k in keep}


def _ratio(a, b):
  return a / b if a is not None and b else None


def policy_report(run, policy, m, programs, rows, peak, bandwidth) -> dict:
  """The JSON section of one policy: measurements `m` against the limits."""
  n_dev = run.mesh.devices.size
  n = int(run.config.rollout.max_new_tokens)
  ro, up, one, st = (_median(m[k]) for k in
                     ("rollout_s", "update_s", "one_token_s", "step_s"))
  decode_s = (ro - one) / (n - 1) if n > 1 else None
  limit = decode_limit(run, programs["rollout"], policy, bandwidth)
  model_flops = programs["update"].model_flops
  b_ro, b_up = _bound(rows.get("rollout")), _bound(rows.get("update"))
  bound_ro, bound_up = (b and b["step_time_bound_s"] for b in (b_ro, b_up))
  limit_ro, limit_up = (b and b["limit_s"] for b in (b_ro, b_up))
  step_bound = bound_ro + bound_up if bound_ro and bound_up else None
  step_limit = limit_ro + limit_up if limit_ro and limit_up else None
  return {
      "rollout": {
          "s": ro, "times_s": m["rollout_s"], "new_tokens": m["new_tokens"],
          "new_tokens_per_s": m["new_tokens"] / ro,
          "one_token_rollout_s": one, "decode_step_s": decode_s,
          "decode_step_hbm_limit": limit,
          "decode_step_over_limit": _ratio(decode_s, limit["s"]),
          "compile_only": b_ro,
          "over_bound": _ratio(ro, bound_ro)},
      "update": {
          "s": up, "times_s": m["update_s"], "model_flops": model_flops,
          "mfu": _ratio(model_flops / up, n_dev * peak) if peak else None,
          "compile_only": b_up,
          "over_bound": _ratio(up, bound_up)},
      "step": {"s": st, "times_s": m["step_s"], "bound_s": step_bound,
               "limit_s": step_limit, "over_bound": _ratio(st, step_bound),
               "over_limit": _ratio(st, step_limit)},
      "rollout_len": m["rollout_len"], "loss": m["loss"]}


def peak_memory(devices) -> dict | None:
  """The most any device held at once (memory_stats' peak_bytes_in_use),
  with its limit; None where the runtime does not say (CPU)."""
  peaks, limits = [], []
  for d in devices:
    try:
      stats = d.memory_stats()
    except Exception:  # pylint: disable=broad-except
      stats = None
    if not stats or "peak_bytes_in_use" not in stats:
      return None
    peaks.append(int(stats["peak_bytes_in_use"]))
    limits.append(stats.get("bytes_limit"))
  i = int(np.argmax(peaks))
  return {"peak_bytes_in_use": peaks[i], "bytes_limit": limits[i]}


def device_info(devices) -> dict:
  versions = {}
  for name in ("jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "libtpu"):
    try:
      versions[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      pass
  d = devices[0]
  # On a GPU: its own GpuTargetConfig against the one --compile_only uses.
  return {"platform": d.platform, "device_kind": d.device_kind,
          "devices": len(devices), "jax": jax.__version__, **versions,
          "target_config": compile_only.card_check(devices)}


# The peer: the same step in PyTorch (bench/torch_peer.py), in a child process.

def peer_spec(run_cfg, scfg, tcfg, vocab, policies, steps, impl) -> dict:
  """What the child needs to build the same step: the models as Hugging
  Face configs, dtypes, shapes, temperatures, optimizer settings."""
  return {"student": models.config_to_hf(scfg),
          "teacher": models.config_to_hf(tcfg),
          "student_param_dtype": scfg.param_dtype,
          "teacher_param_dtype": tcfg.param_dtype, "compute_dtype": scfg.dtype,
          "vocab": int(vocab), "batch": int(run_cfg.data.batch_size),
          "prompt_len": int(run_cfg.data.max_prompt_len),
          "new_tokens": int(run_cfg.rollout.max_new_tokens),
          "grad_accum": int(run_cfg.optim.grad_accum),
          "temperatures": list(config_lib.temperatures(run_cfg)),
          "clip_norm": float(run_cfg.optim.clip_norm), "lr": LR,
          "policies": list(policies), "steps": int(steps), "warmup": 1,
          "impl": impl}


def peer(spec: dict, timeout: float) -> dict:
  """bench.torch_peer's figures for `spec`, from a child process that JAX
  does not put on the accelerator (JAX_PLATFORMS=cpu), run before this
  process's JAX takes it."""
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "spec.json")
    with open(path, "w") as f:
      json.dump(spec, f)
    cmd = [sys.executable, "-m", "jaxdistill.bench.torch_peer", path]
    try:
      r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True,
                         timeout=timeout, check=False,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"))
    except subprocess.TimeoutExpired:
      return {"impl": None, "reason": f"timed out after {timeout:.0f} s"}
  out = suite.last_json(r.stdout)
  if r.returncode or out is None:
    return {"impl": None, "reason": f"the peer's process exited with "
            f"{r.returncode} (its stderr is above)"}
  return out


def headline(report: dict, policy: str) -> dict:
  """The `policy` step over its compile-only bound; without a bound, the
  peer's step time over ours; without a peer, the update's MFU."""
  st = report["policies"][policy]["step"]
  where = report["device"]["device_kind"]
  if st["over_bound"] is not None:
    v = st["over_bound"]
    return {"name": f"{policy}-policy distillation step / its compile-only "
                    f"bound ({where})",
            "value": round(v, 3), "unit": "x bound", "goal": f"<= {STEP_GOAL}",
            "meets_goal": bool(v <= STEP_GOAL)}
  theirs = st["peer_s"]
  if theirs:
    v = theirs / st["s"]
    return {"name": f"{policy}-policy distillation step, {report['peer']['impl']}"
                    f" / jaxdistill ({where}, same run; no compile-only bound "
                    "for this device)",
            "value": round(v, 3), "unit": "x", "goal": f">= {PEER_GOAL}",
            "meets_goal": bool(v >= PEER_GOAL)}
  v = report["policies"][policy]["update"]["mfu"]
  return {"name": f"{policy}-policy update MFU ({where}; no bound, no peer)",
          "value": None if v is None else round(v, 3), "unit": "fraction",
          "goal": ">= 0.45", "meets_goal": bool(v is not None and v >= 0.45)}


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--pair", choices=sorted(PAIRS), default="llama")
  ap.add_argument("--quick", action="store_true",
                  help="the tiny pair at batch 4, prompt 16, 8 new tokens")
  ap.add_argument("--batch", type=int, default=None, help="default 32")
  ap.add_argument("--prompt_len", type=int, default=None, help="default 2048")
  ap.add_argument("--new_tokens", type=int, default=None, help="default 512")
  ap.add_argument("--steps", type=int, default=None,
                  help="timed steps per policy (default 3)")
  ap.add_argument("--grad_accum", type=int, default=None,
                  help="micro-batches per update (default the config's: 4)")
  ap.add_argument("--devices", type=int, default=1,
                  help="how many of jax.devices() the run is laid over")
  ap.add_argument("--policies", default="student,teacher")
  ap.add_argument("--peer", choices=("auto", "trl", "torch", "none"),
                  default="auto")
  ap.add_argument("--peer_timeout", type=float, default=3600)
  ap.add_argument("--no_bound", action="store_true",
                  help="skip the compile-only bounds (compiling each program "
                  "once more)")
  args = ap.parse_args(argv)
  # JAX's allocator takes this share of a GPU, as for the commands (cli.py),
  # unless the user set it; before JAX's backend starts.
  os.environ.setdefault(sharding.MEM_FRACTION_ENV, str(sharding.GPU_MEM_FRACTION))
  pair = "tiny" if args.quick else args.pair
  defaults = QUICK if args.quick else (32, 2048, 512, 3)
  b, p, n, steps = (d if v is None else v for v, d in zip(
      (args.batch, args.prompt_len, args.new_tokens, args.steps), defaults))
  policies = [x for x in args.policies.split(",") if x]
  if not policies or set(policies) - set(POLICIES):
    raise ValueError(f"--policies: a comma-separated subset of {POLICIES}, "
                     f"got {args.policies!r}")
  config = run_config(pair, b, p, n, args.grad_accum)
  # Nothing so far has started JAX's backend: the peer runs first, with the
  # whole device.
  scfg, tcfg, _ = loop.model_configs(config)
  if args.peer == "none":
    peer_out = {"impl": None, "reason": "--peer none"}
  else:
    _log("peer step (child process) ...")
    peer_out = peer(peer_spec(config, scfg, tcfg, config.loss.vocab_size,
                              policies, steps, args.peer), args.peer_timeout)

  devices = jax.devices()[:args.devices]
  if len(devices) < args.devices:
    raise ValueError(f"--devices {args.devices}: this process sees "
                     f"{len(jax.devices())}")
  target = compile_only.local_target(devices)
  mesh = loop.config_mesh(config, devices)
  run = Run(config, mesh)
  _log(f"{pair}: student {run.scfg.num_hidden_layers} layers x "
       f"{run.scfg.hidden_size}, teacher {run.tcfg.num_hidden_layers} x "
       f"{run.tcfg.hidden_size}; batch {b}, prompt {p}, {n} new tokens; "
       f"{len(devices)} x {devices[0].device_kind}; target "
       f"{target.name if target else None}")
  samples = {"matmul": []}
  if target is None:
    samples["copy"] = []
  measured, bounds, programs = {}, {}, {}
  with tempfile.TemporaryDirectory() as cache:
    if target is not None:
      compile_only.ensure_persistent_cache()  # the run's calls find them
    for policy in policies:
      programs[policy] = run.programs(policy)
      bounds[policy] = {}
      if target is not None and not args.no_bound:
        for name, prog in programs[policy].items():
          _log(f"{policy} policy: compile-only bound of {name} ...")
          try:  # identical programs (the update) compile once (`cache`)
            bounds[policy][name] = compile_only.compile_program(
                prog, target, cache_dir=cache)
          except Exception as e:  # pylint: disable=broad-except
            # The bound is beside the figures; it must not cost them.
            _log(f"  failed: {_first_line(e)}")
            bounds[policy][name] = {"error": _first_line(e)}
      measured[policy] = measure(run, policy, steps, samples)

  matmul = [x for x in samples["matmul"] if x]
  copy = [x for x in samples.get("copy", []) if x]
  if target is not None:
    peak, bw = target.peak_flops, target.hbm_bandwidth
    limits = {"peak_flops_per_device": peak, "hbm_bandwidth_per_device": bw,
              "source": f"data sheet ({target.name}, compile_only's table)"}
  else:
    peak = _median(matmul) if matmul else None
    bw = _median(copy) if copy else None
    limits = {"peak_flops_per_device": peak, "hbm_bandwidth_per_device": bw,
              "source": f"measured in this run, no data sheet for "
                        f"{devices[0].device_kind}: the median "
                        f"{run.scfg.dtype} jnp.matmul rate "
                        "(presets.matmul_rate) as peak FLOP/s and the copy "
                        "bandwidth (presets.copy_bandwidth) as HBM bandwidth"}
  limits.update(matmul_flops_per_s_samples=samples["matmul"],
                copy_bandwidth_samples=samples.get("copy"))
  report = {
      "device": {**device_info(devices),
                 "target": target.name if target else None},
      "config": {
          "pair": pair, "student": PAIRS[pair][0] or "runlocal tiny",
          "teacher": PAIRS[pair][1] or "runlocal tiny",
          "vocab": run.vocab, "batch": b, "prompt_len": p, "new_tokens": n,
          "steps": steps, "warmup_steps": WARMUP,
          "grad_accum": int(config.optim.grad_accum),
          "loss": config.loss.kind, "fused_loss": bool(config.loss.fused),
          "reduction": config.loss.reduction,
          "student_dtype": [run.scfg.dtype, run.scfg.param_dtype],
          "teacher_dtype": [run.tcfg.dtype, run.tcfg.param_dtype],
          "remat": run.scfg.remat,
          "temperatures": list(config_lib.temperatures(config))},
      "limits": limits,
      "policies": {
          policy: policy_report(run, policy, measured[policy],
                                programs[policy], bounds[policy], peak, bw)
          for policy in policies},
      "peak_memory": peak_memory(devices),
      "peer": peer_out,
  }
  for policy in policies:
    theirs = peer_out.get("policies", {}).get(policy, {}).get("step_s")
    mine = report["policies"][policy]["step"]
    mine["peer_s"] = theirs
    mine["peer_over_jaxdistill"] = _ratio(theirs, mine["s"])
  first = "student" if "student" in policies else policies[0]
  report = {"headline": headline(report, first), **report}
  print(json.dumps(report))
  return report


if __name__ == "__main__":
  main()
