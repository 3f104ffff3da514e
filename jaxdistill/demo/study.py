"""The miniature study: assets -> grid (jaxdistill.sweep) -> evaluation -> report.

Every arm is one run of the study's grid machinery (jaxdistill.study:
expand, run_sweep, aggregate, write_table, make_figures) with the demo's
evaluation: greedy and sampled accuracy on Countdown-3 (in distribution) and
Countdown-4 (harder), pass@k, forgetting on the addition suite (the student's
second task) and update sparsity against the student it started from.
"""
from __future__ import annotations

import json
import os
import shutil
import time

import jax
import ml_collections

from jaxdistill.demo import build
from jaxdistill.demo import tasks as demo_tasks

ID, HARDER, OOD = ("countdown3",), ("countdown4",), ("addition",)


def records(cfg) -> dict:
  """Training records and test suites (test targets/pairs never trained on)."""
  d, n = cfg.data, int(cfg.data.test_problems)
  cd3 = demo_tasks.countdown_records(3, int(d.countdown_train), d.data_seed)
  add = demo_tasks.addition_records(int(d.addition_train), d.data_seed)
  share = int(len(cd3) * float(cfg.student.countdown_share))
  # The student's mix: a slice of Countdown and all of addition, interleaved
  # by the pipeline's shuffle.
  return {
      "teacher": cd3,
      "student": cd3[:share] + add,
      "suites": {
          "countdown3": demo_tasks.countdown_records(3, n, d.data_seed, "test"),
          "countdown4": demo_tasks.countdown_records(4, n, d.data_seed, "test"),
          "addition": demo_tasks.addition_records(n, d.data_seed, "test")}}


def evaluate(cfg, model_dir: str, tokenizer, suites, *, cache: bool = True
             ) -> tuple[dict, object]:
  """Flat metrics of one HF directory on the suites; returns (metrics, params).

  Countdown suites are scored greedily and with samples (pass@k); the
  addition suite greedily (forgetting is measured on greedy accuracy).
  """
  from jaxdistill import models  # pylint: disable=g-import-not-at-top
  from jaxdistill.evaluation import core  # pylint: disable=g-import-not-at-top
  from jaxdistill.evaluation import report  # pylint: disable=g-import-not-at-top
  mcfg, params = models.load_pretrained(model_dir, dtype="float32")
  path = os.path.join(model_dir, "demo_eval.json")
  key = build.cache_key(cfg.eval.to_dict(), cfg.max_new_tokens, cfg.seed,
                        {k: v[:3] for k, v in suites.items()},
                        {k: len(v) for k, v in suites.items()})
  if cache and os.path.isfile(path):
    with open(path) as f:
      saved = json.load(f)
    if saved.get("key") == key:
      return saved["metrics"], params
  e = cfg.eval
  common = dict(max_new_tokens=int(cfg.max_new_tokens),
                batch_size=int(e.batch_size), seed=int(cfg.seed),
                max_prompt_len=int(cfg.max_prompt_len), prompt_bucket=8,
                progress=False, temperature=float(cfg.grid.temperature))
  flat = core.evaluate_model(
      mcfg, params, tokenizer, {k: suites[k] for k in ID + HARDER},
      num_samples=int(e.num_samples), ks=tuple(e.ks), **common)
  flat.update(core.evaluate_model(
      mcfg, params, tokenizer, {k: suites[k] for k in OOD}, num_samples=0,
      **common))
  flat.update(report.group_means(flat, {"id": ID, "harder": HARDER,
                                        "ood": OOD}))
  if cache:
    with open(path, "w") as f:
      json.dump({"key": key, "metrics": flat}, f, indent=2, sort_keys=True)
  return flat, params


def sparsity(cfg, params0, params1) -> dict:
  """sparsity/* compared in cfg.eval.sparsity_dtype (the study's checkpoints
  are bfloat16; the demo trains in float32), plus the float32 figure."""
  from jaxdistill import metrics  # pylint: disable=g-import-not-at-top
  from jaxdistill.evaluation import report  # pylint: disable=g-import-not-at-top
  atol = float(cfg.eval.sparsity_atol)
  res = metrics.update_sparsity(params0, params1, atol=atol,
                                dtype=cfg.eval.sparsity_dtype)
  out = report.sparsity_metrics(res)
  f32 = metrics.update_sparsity(params0, params1, atol=atol, dtype="float32")
  out["sparsity_f32/whole"] = float(f32["sparsity"])
  out["sparsity_f32/whole_exact"] = float(f32["exact_sparsity"])
  return out


def grid_config(cfg, *, teacher_dir, student_dir, tok_dir, records_file):
  """A jaxdistill.study grid: KL x rollout policy x learning rate."""
  g = cfg.grid
  base = build.base_train_config(cfg, tok_dir=tok_dir, records=records_file,
                                 seed=cfg.seed)
  base.student.update(path=student_dir, init=None)
  base.teacher.update(path=teacher_dir, init=None)
  base.data.batch_size = int(g.batch_size)
  base.total_steps = int(g.steps)
  base.ckpt_every = int(g.steps)
  base.log_every = 1
  base.track_sparsity = False  # measured by the evaluation, in bfloat16 too
  base.rollout.update(temperature=float(g.temperature), lam=0.5)
  base.optim.update(warmup_steps=0, clip_norm=1.0)
  grid = ml_collections.ConfigDict()
  grid.base = base
  grid.base_spec = "configs/distill.py"
  # Preset names are the rollout policy; 'mixture' carries its lambda.
  grid.presets = {"policy": {
      name: {"rollout": {"policy": name, "lam": float(lam)}}
      for name, lam in g.policy}}
  grid.axes = (("kl", "loss.kind", tuple(g.kl)),
               ("policy", None, tuple(grid.presets.policy.keys())),
               ("lr", "optim.lr", tuple(float(x) for x in g.lrs)))
  grid.seeds = (int(cfg.seed),)
  grid.eval = None
  return grid


def run(cfg, workdir: str) -> dict:
  """The whole miniature study; returns {'rows', 'teacher', 'student', ...}."""
  from jaxdistill import sweep  # pylint: disable=g-import-not-at-top
  t0 = time.time()
  workdir = os.path.abspath(os.path.expanduser(workdir))
  os.makedirs(workdir, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", os.path.join(workdir, "jax_cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  devices = jax.devices()[:1]
  recs = records(cfg)
  suites = recs["suites"]

  # (1) Tokenizer, (2) teacher, (3) student: cached by their settings.
  # Countdown-4 training problems too, so harder prompts tokenize alike.
  texts = demo_tasks.corpus(recs["teacher"] + recs["student"] +
                            demo_tasks.countdown_records(4, 200, cfg.data.data_seed))
  tok_dir = os.path.join(workdir, "models",
                         "tokenizer-" + build.cache_key(texts, cfg.vocab_size))
  tok = build.build_tokenizer(tok_dir, texts, int(cfg.vocab_size))
  models_root = os.path.join(workdir, "models")
  teacher_dir = build.train_model(
      "teacher", cfg, models_root, arch=dict(cfg.teacher.arch), tokenizer=tok,
      tok_dir=tok_dir, records=recs["teacher"], steps=int(cfg.teacher.steps),
      lr=float(cfg.teacher.lr), seed=int(cfg.seed), devices=devices)
  student_dir = build.train_model(
      "student", cfg, models_root, arch=dict(cfg.student.arch), tokenizer=tok,
      tok_dir=tok_dir, records=recs["student"], steps=int(cfg.student.steps),
      lr=float(cfg.student.lr), seed=int(cfg.seed), devices=devices)
  t_models = time.time() - t0
  build.log(f"teacher and student ready ({t_models:.0f} s); evaluating them")
  teacher_eval, _ = evaluate(cfg, teacher_dir, tok, suites)
  student_eval, params0 = evaluate(cfg, student_dir, tok, suites)

  # (4) The grid, every arm with the real loop; (5) evaluated per arm.
  grid = grid_config(cfg, teacher_dir=teacher_dir, student_dir=student_dir,
                     tok_dir=tok_dir, records_file=build.write_records(
                         recs["teacher"], models_root, "teacher"))  # reused
  grid_dir = os.path.join(workdir, "grid")
  shutil.rmtree(grid_dir, ignore_errors=True)  # the grid always reruns

  def evaluate_fn(grid_, run_, run_dir):
    del grid_, run_
    from jaxdistill.evaluation import report  # pylint: disable=g-import-not-at-top
    flat, params = evaluate(cfg, os.path.join(run_dir, "hf_student"), tok,
                            suites, cache=False)
    flat.update({f"baseline/{k}": v for k, v in student_eval.items()})
    flat.update(report.forgetting_metrics(flat, student_eval, OOD))
    flat.update(sparsity(cfg, params0, params))
    return flat

  t1 = time.time()
  sweep.run_sweep(grid, grid_dir, evaluate_fn=evaluate_fn, devices=devices,
                  summarize=False)
  t_grid = time.time() - t1
  rows = sweep.aggregate(grid_dir)
  return {"rows": rows, "teacher": teacher_eval, "student": student_eval,
          "grid_dir": grid_dir, "workdir": workdir, "teacher_dir": teacher_dir,
          "student_dir": student_dir, "tokenizer_dir": tok_dir,
          "seconds": {"models": t_models, "grid": t_grid,
                      "total": time.time() - t0}}
