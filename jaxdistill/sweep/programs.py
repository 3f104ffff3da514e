"""`python -m jaxdistill.sweep --config GRID --compile_only=SLICE`: every
program every arm of a grid would run, compiled for a TPU slice on this
host (compile_only.py), without weights, data or a TPU.

Arms that differ only in values a program does not depend on (the learning
rate, the seed, the data a task reads, ...) share their programs: one
compilation per distinct program, named after the first arm that needs it,
with the number of arms it covers. An arm's programs are its training run's
(train/programs.py), its evaluation's (evaluate/programs.py, the arm's
student with grid.eval's config) and its RLVR stage's (rl/programs.py, the
arm's student as the policy).
"""
from __future__ import annotations

import dataclasses
import json
import sys

from jaxdistill import compile_only
from jaxdistill import config_lib
from jaxdistill import rollout as rollout_lib
from jaxdistill import sharding
from jaxdistill.evaluate import programs as eval_programs
from jaxdistill.evaluate import run as evaluate_run
from jaxdistill.rl import train as rl_train
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.sweep import rlvr as rlvr_lib
from jaxdistill.train import loop as train_loop
from jaxdistill.train import setup as train_setup

# Fields whose values a run's programs do not depend on (constants folded
# into them, or not on the device at all): arms that differ only here share
# programs.
VALUE_FIELDS = ("seed", "total_steps", "log_every", "eval_every", "ckpt_every",
                "keep_ckpts", "keep_final_only", "progress", "export_hf",
                "export_every", "wandb", "optim.lr",
                "optim.warmup_steps", "optim.final_lr_frac", "optim.schedule",
                "optim.weight_decay", "optim.b1", "optim.b2", "optim.eps",
                "rollout.lam", "student.temperature", "teacher.temperature", "loss.beta", "data.task",
                "data.n_numbers", "data.num_problems", "data.data_seed",
                "data.split", "data.data_dir", "data.manual_dir",
                "data.source", "data.records_file", "data.system",
                "tokenizer", "tokenizer_build")


def signature(config, *model_cfgs) -> str:
  """What a config's programs depend on: the config without VALUE_FIELDS
  and the model paths, plus the models' configs."""
  d = json.loads(config_lib.to_json(config))
  for f in VALUE_FIELDS:
    node = d
    *parents, leaf = f.split(".")
    for p in parents:
      node = node.get(p, {})
    if isinstance(node, dict):
      node.pop(leaf, None)
  ro = config.get("rollout")
  if isinstance(d.get("rollout"), dict) and ro is not None and "policy" in ro:
    # rollout.lam is a value, except at the spectrum's endpoints (lam -1 /
    # +1), which run the pure policy's one-model program (sampling_policy).
    d["rollout"]["sampled_as"] = rollout_lib.sampling_policy(ro)[0]
  for m in ("student", "teacher"):
    if isinstance(d.get(m), dict):
      for k in ("path", "preset", "init", "overrides"):
        d[m].pop(k, None)
  return json.dumps([d, [repr(c) for c in model_cfgs]], sort_keys=True)


def _label(name: str, n: int) -> str:
  return name if n == 1 else f"{name} (+{n - 1} arms)"


def as_policy(stage, run_config):
  """The RLVR stage's config with the arm's student (its shapes: the
  arm's export does not exist yet) as the policy."""
  stage.student.path = run_config.student.get("path")
  stage.student.preset = run_config.student.get("preset")
  stage.student.init = run_config.student.get("init")
  if run_config.get("tokenizer") and "tokenizer" in stage:
    stage.tokenizer = run_config.tokenizer
  return stage


def grid_programs(grid, target, only=None, log=None):
  """(programs, {program name: [arm names]}) of a grid's arms. `log`
  (default: stderr, so that --json's stdout stays one JSON object) hears how
  many distinct programs the arms need."""
  log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
  runs = grid_lib.expand(grid, only)
  if not runs:
    raise ValueError(f"--only {only!r}: no run of the grid matches")
  groups = {}  # (kind, signature) -> (programs builder, [arm names])

  def add(kind, sig, run_name, build):
    key = (kind, sig)
    if key not in groups:
      groups[key] = [build, []]
    groups[key][1].append(run_name)

  rules_of = sharding.rules_from_config
  for run in runs:
    c = run.config
    config_lib.validate(c)
    config_lib.validate_run(c)
    scfg, tcfg, cached = train_loop.model_configs(c)
    mesh = train_loop.config_mesh(c, target.devices)
    config_lib.validate_run(c, mesh, rules_of(c))

    def train(c=c, scfg=scfg, tcfg=tcfg, cached=cached, mesh=mesh):
      vocab = train_setup.compile_vocab(c, scfg, tcfg)
      return train_loop.run_programs(c, scfg, tcfg, vocab, mesh, rules_of(c),
                                     cached)
    add("train", signature(c, scfg, tcfg), run.name, train)

    spec = grid_lib.eval_spec(grid, run)
    if spec is not None:
      ec = config_lib.load_config(spec)
      grid_lib.merge(ec, grid.eval.get("updates") or {}, "grid.eval.updates")
      evaluate_run.check_config(ec, runnable=False)
      e_cfg = scfg
      if ec.get("dtype"):  # the evaluation loads the weights in it
        e_cfg = dataclasses.replace(scfg, dtype=ec.dtype, param_dtype=ec.dtype)

      def evaluate(ec=ec, e_cfg=e_cfg, c=c, scfg=scfg):
        mesh = eval_programs.mesh_of(ec, target.devices)
        vocab = train_setup.compile_vocab(c, scfg, scfg)
        return eval_programs.eval_programs(ec, e_cfg, vocab, mesh, rules_of(ec))
      add("eval", signature(ec, e_cfg), run.name, evaluate)

    if rlvr_lib.declared(grid):
      stage = as_policy(rlvr_lib.stage_config(grid, run, "<arm>"), c)

      def rlvr(stage=stage):
        return rl_train.programs_for(stage, target.devices)
      add("rlvr", signature(stage, scfg), run.name, rlvr)

  programs, arms = [], {}
  for (kind, _), (build, names) in groups.items():
    for p in build():
      p.name = f"{kind} {p.name}: {_label(names[0], len(names))}"
      programs.append(p)
      arms[p.name] = names
  log(f"{len(runs)} arms, {len(programs)} distinct programs")
  return programs, arms


def compile_for(grid, slice_name: str, only=None) -> dict:
  """--compile_only on a sweep: the report of every distinct program of the
  grid's arms, with `arms`: which arms each program serves."""
  target = compile_only.target(slice_name)
  with sharding.compiling_for(target.chip.platform):
    programs, arms = grid_programs(grid, target, only)
    report = compile_only.compile_programs(programs, target)
  report["arms"] = arms
  return report


def advice(grid, row) -> str:
  del grid
  name = row["name"]
  if name.startswith("train update"):
    return ("try the arms' config.student.remat='full', a larger "
            "optim.grad_accum, a smaller loss.chunk_size, or a slice with more "
            "chips")
  if name.startswith("rlvr update"):
    return "try a larger grpo.num_minibatches or optim.grad_accum, or more chips"
  return ("try a smaller batch or fewer new tokens for this program, or a slice "
          "with more chips")

