"""The miniature study: assets -> grid (jaxdistill.sweep) -> evaluation -> report.

Every arm is one run of the study's grid machinery (jaxdistill.sweep:
expand, run_sweep, aggregate) with the demo's evaluation: greedy and sampled
accuracy and pass@k on 4-number arithmetic (in distribution), greedy accuracy
on 6-number arithmetic (harder), forgetting on the addition suite (the
student's second task) and update sparsity against the student it started
from. With several workers (jaxdistill.demo.workers) the arms train side by
side, one process per CPU core.

Everything is cached by the settings that made it: the tokenizer, the teacher
and the student under <workdir>/models/, the grid's arms under
<workdir>/grid-<key>/ (a finished arm is skipped, an interrupted one resumes),
so a rerun of the same settings trains nothing and other settings never
overwrite these.
"""
from __future__ import annotations

import contextlib
import json
import os
import time

import jax
import ml_collections
import numpy as np

from jaxdistill import models
from jaxdistill import sparsity as sparsity_lib
from jaxdistill.demo import build
from jaxdistill.demo import checks
from jaxdistill.demo import tasks as demo_tasks
from jaxdistill.demo import workers as workers_lib
from jaxdistill.evaluate import core
from jaxdistill.evaluate import report
from jaxdistill.sweep import grid as grid_lib
from jaxdistill.sweep import rlvr
from jaxdistill.sweep import runner
from jaxdistill.sweep import table
from jaxdistill.train import log as train_log
from jaxdistill.train import preempt
from jaxdistill.train import seen as seen_lib

ID = (f"arith{demo_tasks.ID_NUMBERS}",)
HARDER = (f"arith{demo_tasks.HARDER_NUMBERS}",)
OOD = ("addition",)


def records(cfg) -> dict:
  """Training records and test suites (no test problem is ever trained on)."""
  d, seed = cfg.data, int(cfg.data.data_seed)
  n_id, n_hard = demo_tasks.ID_NUMBERS, demo_tasks.HARDER_NUMBERS
  # The teacher knows chains of 3 to 6 numbers; the student the shortest (a
  # share of the 3-number ones), some in-distribution ones and the addition
  # facts, mixed by the pipeline's shuffle: it can do the steps but has
  # rarely written a chain as long as the in-distribution one. Distillation
  # runs on the in-distribution training prompts.
  lengths = range(3, n_hard + 1)
  teacher = {n: demo_tasks.arith_records(n, int(d.arith_train), seed)
             for n in lengths}
  share = {n: float(cfg.student.arith_share) for n in lengths if n < n_id}
  share[n_id] = float(cfg.student.get("id_share", 0.0))
  add = demo_tasks.addition_records(int(d.addition_train), seed)
  return {
      "teacher": [r for n in lengths for r in teacher[n]],
      "student": [r for n, f in share.items()
                  for r in teacher[n][:int(len(teacher[n]) * f)]] + add,
      "distill": demo_tasks.arith_records(n_id, int(d.distill_prompts), seed + 1),
      "suites": {
          ID[0]: demo_tasks.arith_records(n_id, int(d.id_test), seed, "test"),
          HARDER[0]: demo_tasks.arith_records(n_hard, int(d.harder_test), seed,
                                              "test"),
          OOD[0]: demo_tasks.addition_records(int(d.addition_test), seed,
                                              "test")}}


def evaluate(cfg, model_dir: str, tokenizer, suites, *, seed: int | None = None,
             cache: bool = True) -> tuple[dict, object]:
  """Flat metrics of one HF directory on the suites; returns (metrics, params).

  The in-distribution suite is scored greedily and with samples (pass@k:
  the study's coverage); the harder and the addition suites greedily (the
  report reads their greedy accuracy; forgetting is measured on it).
  """
  seed = int(cfg.seed if seed is None else seed)
  mcfg, params = models.load_pretrained(model_dir, dtype="float32")
  path = os.path.join(model_dir, "demo_eval.json")
  key = build.cache_key(cfg.eval.to_dict(), cfg.max_new_tokens, seed,
                        {k: v[:3] for k, v in suites.items()},
                        {k: len(v) for k, v in suites.items()})
  if cache and os.path.isfile(path):
    with open(path) as f:
      saved = json.load(f)
    if saved.get("key") == key:
      return saved["metrics"], params
  e = cfg.eval
  common = dict(max_new_tokens=int(cfg.max_new_tokens),
                batch_size=int(e.batch_size), seed=seed,
                max_prompt_len=int(cfg.max_prompt_len), prompt_bucket=8,
                progress=False,
                temperature=float(cfg.grid.student_temperature))
  flat = core.evaluate_model(
      mcfg, params, tokenizer, {k: suites[k] for k in ID},
      num_samples=int(e.num_samples), ks=tuple(e.ks), **common)
  flat.update(core.evaluate_model(
      mcfg, params, tokenizer, {k: suites[k] for k in HARDER + OOD},
      num_samples=0, **common))
  flat.update(report.group_means(flat, {"id": ID, "harder": HARDER,
                                        "ood": OOD}))
  if cache:
    with open(path, "w") as f:
      json.dump({"key": key, "metrics": flat}, f, indent=2, sort_keys=True)
  return flat, params


def sparsity(cfg, params0, params1, seen=None) -> dict:
  """sparsity/*: the paper's S_tau at cfg.eval.sparsity_taus on the weights
  as exported, whole model and per layer kind (with `seen`, the arm's mask
  of processed token ids, the embedding rows of seen and never-seen tokens
  apart), and the former |delta| <= cfg.eval.sparsity_atol figures in
  bfloat16 and float32."""
  res = sparsity_lib.update_sparsity(
      params0, params1, taus=tuple(cfg.eval.sparsity_taus),
      atol=float(cfg.eval.sparsity_atol), seen=seen)
  return sparsity_lib.metrics_from_result(res)


def grid_config(cfg, *, teacher_dir, student_dir, tok_dir, records_file):
  """A jaxdistill.sweep grid: KL x rollout policy x learning rate x seed."""
  g = cfg.grid
  base = build.base_train_config(cfg, tok_dir=tok_dir, records=records_file,
                                 seed=cfg.seed)
  base.student.update(path=student_dir, init=None)
  base.teacher.update(path=teacher_dir, init=None)
  base.data.batch_size = int(g.batch_size)
  base.total_steps = int(g.steps)
  base.ckpt_every = int(g.steps)
  base.log_every = 1
  base.track_sparsity = False  # measured by the evaluation (study.sparsity)
  base.student.temperature = float(g.student_temperature)
  base.teacher.temperature = float(g.teacher_temperature)
  base.rollout.update(lam=0.0)
  base.optim.update(warmup_steps=0, clip_norm=1.0)
  grid = ml_collections.ConfigDict()
  grid.base = base
  grid.base_spec = "configs/distill.py"
  # Preset names are the rollout policy; a spectrum point's carries its
  # lambda (the paper's: -1 the teacher, +1 the student).
  grid.presets = {"policy": {
      name: {"rollout": {"policy": {-1.0: "teacher", 1.0: "student"}.get(
          float(lam), "spectrum"), "lam": float(lam)}}
      for name, lam in g.policy}}
  grid.axes = (("kl", "loss.kind", tuple(g.kl)),
               ("policy", None, tuple(grid.presets.policy.keys())),
               ("lr", "optim.lr", tuple(float(x) for x in g.lrs)))
  # Weight precision: one, set in the base; several, an axis of its own.
  precisions = tuple(g.get("precisions", ("float32",)))
  if len(precisions) > 1:
    grid.axes += (("precision", "student.param_dtype", precisions),)
  else:
    base.student.param_dtype = precisions[0]
  grid.seeds = tuple(int(cfg.seed) + i for i in range(int(cfg.seeds)))
  grid.eval = None
  if cfg.rlvr.enabled:  # the study's RLVR stage (jaxdistill.sweep.rlvr)
    grid.rlvr = dict(
        base=build.grpo_config(cfg, tok_dir=tok_dir, records=records_file),
        base_spec="configs/grpo_countdown.py", updates={},
        select=dict(metric="accuracy", per=tuple(cfg.rlvr.per)))
  return grid


def _arm_line(i, n, name, flat, student_eval, seconds):
  def pct(d, k):
    v = d.get(f"{k}/greedy_acc")
    return "-" if v is None else f"{100 * v:.1f} %"
  return (f"arm {i}/{n} {name}: {ID[0]} {pct(flat, ID[0])} (student before "
          f"{pct(student_eval, ID[0])}), {HARDER[0]} {pct(flat, HARDER[0])}, "
          f"addition {pct(flat, OOD[0])} (before {pct(student_eval, OOD[0])}); "
          f"{seconds:.0f} s")


def _rlvr_line(name, stage_dir, flat):
  r = rlvr.rewards_of(train_log.read_metrics(stage_dir))
  k = rlvr.reward_window(len(r))
  return (f"RLVR {name}: reward {np.mean(r[:k]):.2f} (first {k} iterations) "
          f"-> {np.mean(r[-k:]):.2f} (last {k}); {ID[0]} "
          f"{100 * flat[f'{ID[0]}/greedy_acc']:.1f} %, {HARDER[0]} "
          f"{100 * flat[f'{HARDER[0]}/greedy_acc']:.1f} %")


def run(cfg, workdir: str, *, workers: int = 1, argv: list[str] | None = None,
        worker_runs: list[int] | None = None, worker_model: str | None = None,
        worker_report: str | None = None) -> dict | None:
  """The whole miniature study; returns {'rows', 'teacher', 'student', ...}.

  With `workers` > 1, the grid's unfinished arms are trained by that many
  processes (jaxdistill.demo.workers) running `python -m jaxdistill.demo
  *argv`, argv being this run's own arguments. A worker is this function
  with `worker_runs`: it trains and evaluates those arms (indices into the
  grid's runs), writes what it spent to `worker_report` and returns None;
  or with `worker_model` ('student'): it trains that model and returns None.
  When both models are to be trained, the student trains in a worker beside
  the teacher.
  """
  t0 = time.time()
  # Everything the config alone decides is checked before anything is
  # written: the settings, then the data they generate.
  checks.check_config(cfg)
  recs = records(cfg)
  suites = recs["suites"]
  workdir = os.path.abspath(os.path.expanduser(workdir))
  os.makedirs(workdir, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", os.path.join(workdir, "jax_cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  devices = jax.devices()[:1]

  # (1) Tokenizer, (2) teacher, (3) student: cached by their settings. The
  # tokenizer sees every training text (the student's are a subset of the
  # teacher's and the addition facts), so the student's share never changes it.
  texts = demo_tasks.corpus(recs["teacher"] + [
      r for r in recs["student"] if "question" in r])
  models_root = os.path.join(workdir, "models")
  tok_dir = os.path.join(models_root,
                         "tokenizer-" + build.cache_key(texts, cfg.vocab_size))
  tok = build.build_tokenizer(tok_dir, texts, int(cfg.vocab_size))
  jobs = {name: dict(arch=dict(cfg[name].arch), tokenizer=tok, tok_dir=tok_dir,
                    records=recs[name], steps=int(cfg[name].steps),
                    lr=float(cfg[name].lr), warmup=float(cfg[name].warmup),
                    seed=int(cfg.seed)) for name in ("teacher", "student")}
  if worker_model is not None:  # a worker of workers.student_beside
    with preempt.stop_at_once(f"its checkpoints are kept in {models_root}"):
      build.train_model(worker_model, cfg, models_root, devices=devices,
                        **jobs[worker_model])
    return None
  # Both to train, and a core to spare: the student beside the teacher.
  beside = (workers > 1 and argv and len(workers_lib.available_cores()) > 1
            and not any(build.is_built(n, cfg, models_root, **jobs[n])
                        for n in jobs))
  with (workers_lib.student_beside(argv, log=build.log) if beside
        else contextlib.nullcontext()):
    teacher_dir = build.train_model("teacher", cfg, models_root,
                                    devices=devices, **jobs["teacher"])
  student_dir = build.train_model("student", cfg, models_root,
                                  devices=devices, **jobs["student"])
  t_models = time.time() - t0
  build.log(f"teacher and student ready ({t_models:.0f} s); evaluating them")
  t1 = time.time()
  teacher_eval, _ = evaluate(cfg, teacher_dir, tok, suites)
  student_eval, params0 = evaluate(cfg, student_dir, tok, suites)
  t_eval = time.time() - t1

  # (4) The grid, every arm with the real loop; (5) evaluated per arm.
  grid = grid_config(cfg, teacher_dir=teacher_dir, student_dir=student_dir,
                     tok_dir=tok_dir, records_file=build.write_records(
                         recs["distill"], models_root, "distill"))
  # The arms' directory is named by everything that makes them (not the RLVR
  # stage, which lives inside each arm's), so a rerun reuses finished arms
  # and other settings never touch them; not by where the workdir is (the
  # models' and data's directories are named by their content), so a copied
  # workdir reuses them too.
  made_by = grid.to_dict()
  made_by.pop("rlvr", None)
  grid_dir = os.path.join(workdir, "grid-" + build.cache_key(
      made_by, cfg.eval.to_dict(), {k: len(v) for k, v in suites.items()},
      root=workdir))
  # What the key hashes, for a reader wondering why a grid was not reused.
  os.makedirs(grid_dir, exist_ok=True)
  runner.write_json_atomic(os.path.join(grid_dir, "made_by.json"), build._relative(
      [made_by, cfg.eval.to_dict(), {k: len(v) for k, v in suites.items()}],
      os.path.abspath(workdir) + os.sep))
  runs = grid_lib.expand(grid)
  # arms_eval: seconds of evaluation, over the workers each divided by how
  # many ran side by side (its share of the grid's wall time).
  spent = {"arms": 0, "arms_eval": 0.0, "rlvr": 0, "rlvr_eval": 0.0,
           "workers": 1}
  t2 = time.time()
  clock = {"arm": t2, "rlvr": 0.0}  # when the next arm / the RLVR stage began

  def evaluate_dir(kind, run_, run_dir):
    """The demo's evaluation of <run_dir>/hf_student against the student
    before distillation (forgetting, sparsity), for an arm or its RLVR stage
    (kind 'arms' or 'rlvr': what it counts and times)."""
    t = time.time()
    hf_dir = os.path.join(run_dir, "hf_student")
    flat, params = evaluate(cfg, hf_dir, tok, suites,
                            seed=int(run_.config.seed), cache=False)
    flat.update({f"baseline/{k}": v for k, v in student_eval.items()})
    flat.update(report.forgetting_metrics(flat, student_eval, OOD))
    # A bfloat16 arm starts from the student rounded to bfloat16 (its
    # weights as loaded): its sparsity counts moves from there.
    dtype = run_.config.student.param_dtype
    start = params0 if dtype == "float32" else jax.tree.map(
        lambda x: x.astype(dtype).astype(x.dtype), params0)
    flat.update(sparsity(cfg, start, params, seen_lib.read_seen(hf_dir)))
    spent[f"{kind}_eval"] += time.time() - t
    spent[kind] += 1
    return flat

  def evaluate_fn(grid_, run_, run_dir):
    del grid_
    flat = evaluate_dir("arms", run_, run_dir)
    i = [r.name for r in runs].index(run_.name) + 1
    build.log(_arm_line(i, len(runs), run_.name, flat, student_eval,
                        time.time() - clock["arm"]))
    clock["arm"] = time.time()  # the next arm starts now (finished ones are
    return flat                 # skipped without calling this)

  def rlvr_evaluate_fn(grid_, run_, stage_dir):
    del grid_
    clock["rlvr"] = clock["rlvr"] or clock["arm"]  # began after the last arm
    flat = evaluate_dir("rlvr", run_, stage_dir)
    build.log(_rlvr_line(run_.name, stage_dir, flat))
    return flat

  if worker_runs is not None:  # a worker of workers.run_arms
    with preempt.stop_at_once(f"finished arms are kept in {grid_dir}"):
      for i in worker_runs:
        run_dir = os.path.join(grid_dir, runs[i].dirname)
        if not runner.is_finished(run_dir):
          runner.run_one(grid, runs[i], run_dir, evaluate_fn=evaluate_fn,
                         devices=devices)
    runner.write_json_atomic(worker_report, {k: spent[k] for k in (
        "arms", "arms_eval")})
    return None

  def train_runs(todo):
    """The unfinished arms, by `workers` processes (the sweep's hook)."""
    names = [r.name for r in runs]
    got = workers_lib.run_arms(argv, [names.index(r.name) for r in todo],
                               workers, log=build.log)
    spent["arms"] += got["arms"]
    spent["arms_eval"] += got["arms_eval"] / got["workers"]
    spent["workers"] = got["workers"]
    clock["arm"] = time.time()  # the RLVR stage, if any, starts now

  done = sum(os.path.isfile(os.path.join(grid_dir, r.dirname, "results.json"))
             for r in runs)
  build.log(f"grid: {len(runs)} arms, {done} already finished, in {grid_dir}")
  runner.run_sweep(grid, grid_dir, evaluate_fn=evaluate_fn, devices=devices,
                   summarize=False, rlvr_evaluate_fn=rlvr_evaluate_fn,
                   paths_root=workdir,
                   train_runs=train_runs if workers > 1 and argv else None)
  t_end = time.time()
  t_grid = (clock["rlvr"] or t_end) - t2
  rows = table.aggregate(grid_dir)
  return {"rows": rows, "teacher": teacher_eval, "student": student_eval,
          "grid_dir": grid_dir, "workdir": workdir, "teacher_dir": teacher_dir,
          "student_dir": student_dir, "tokenizer_dir": tok_dir,
          "n_test": {k: len(v) for k, v in suites.items()},
          "arms_run": spent["arms"], "rlvr_run": spent["rlvr"],
          "rlvr": bool(cfg.rlvr.enabled),
          "seconds": {"models": t_models, "grid": t_grid,
                      "grid_training": t_grid - spent["arms_eval"],
                      "evaluation": t_eval + spent["arms_eval"],
                      "rlvr": (t_end - clock["rlvr"]) if clock["rlvr"] else 0.0,
                      "rlvr_evaluation": spent["rlvr_eval"],
                      "grid_workers": spent["workers"],
                      "total": time.time() - t0}}
