"""Training: `python -m jaxdistill.train` (one distillation run).

  loop.py           the run: config -> mesh -> models -> data -> jit(update) ->
                    loop (rollout, update, log, checkpoint) -> HF export; its CLI
  setup.py          the models a config names: ModelConfigs, params on the mesh,
                    the shared vocabulary (also used by rl, analysis, the sweep)
  step.py           the jit-compiled update: distillation loss, optimizer,
                    gradient accumulation
  batches.py        the run's batches and the rollouts that turn them into
                    training sequences (SequenceMaker)
  seen.py           the token ids the student processed (update sparsity's
                    seen / never-seen embedding rows), kept and exported
  log.py            metrics.jsonl, TensorBoard, progress bar
  checkpoint.py     Orbax checkpoints of the train state, the workdir lock
  teacher_cache.py  `python -m jaxdistill.train.teacher_cache`: teacher top-k
                    written once, read instead of a teacher forward
  shared_rollouts.py  --shared_rollouts: teacher-policy rollouts decoded once,
                    kept by step and read by the runs of the same key
"""
