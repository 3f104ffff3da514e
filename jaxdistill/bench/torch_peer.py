r"""bench.accelerator's peer: its distillation step in PyTorch, on the same device.

  python -m jaxdistill.bench.torch_peer SPEC.json   # bench.accelerator runs it

SPEC (bench.accelerator.peer_spec): the student and teacher as Hugging Face
config dicts, their dtypes, the batch, prompt and new-token counts, the
micro-batches, temperatures, clipping and learning rate, the rollout
policies, the steps to time and `impl` ('auto', 'trl' or 'torch').

Both models are built with random weights (transformers' own init, torch
seeds 0 and 1) on the GPU if torch sees one, else on the CPU, with sdpa
attention; the student in its parameter dtype under autocast to the compute
dtype where they differ (bfloat16 over float32 weights, as the JAX run), the
teacher in its own. EOS is off. Then, per policy:

  trl    TRL's GKDTrainer (trl.experimental.gkd), as bench.gkd drives it:
         lmbda=1.0 (the student samples every step) or lmbda=0.0 with
         seq_kd=True (the teacher samples), beta=0.0 (TRL's forward KL,
         KL(teacher || student)), the sampling model's temperature (TRL has
         one for both), per-device batch = batch / micro-batches, gradient
         accumulation = micro-batches, max_grad_norm, constant LR, AdamW; a
         step timed from on_step_begin to on_step_end;
  torch  the same in plain PyTorch + transformers: per micro-batch,
         `generate` (sampling at the model's temperature, no top-k / top-p,
         exactly new_tokens), the teacher's logits of the response positions
         (logits_to_keep), the student's, the forward KL over the vocabulary
         at both temperatures, backward; then clip_grad_norm_ and AdamW.

'auto' takes TRL where it imports, else plain PyTorch, and says why. On a
CPU each policy is timed at torch's default thread count and at one thread,
and the faster counts (on a busy host the default is often several times
slower, as bench.rollout found). Prints one JSON object: {impl, why, device,
versions, policies: {policy: {step_s, step_times_s, ...} or {error}}}, or
{impl: None, reason} when torch is missing.
"""
from __future__ import annotations

import contextlib
import json
import statistics
import sys
import tempfile
import time


def _log(*a):
  print(*a, file=sys.stderr, flush=True)


def _first_line(e: BaseException) -> str:
  lines = [l for l in str(e).splitlines() if l.strip()]
  return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def run_peer(spec: dict) -> dict:
  """The peer's step times per policy (the child's work): TRL's GKDTrainer
  if it imports (and spec['impl'] allows), else plain PyTorch."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    return {"impl": None, "reason": f"torch / transformers not importable: {e}"}
  impl, why = spec["impl"], None
  if impl in ("auto", "trl"):
    try:
      import trl  # pylint: disable=g-import-not-at-top
      from trl.experimental import gkd  # pylint: disable=g-import-not-at-top,unused-import
      impl = "trl"
    except ImportError as e:
      if impl == "trl":
        return {"impl": None, "reason": f"--peer trl: TRL not importable: {e}"}
      impl, why = "torch", f"TRL not importable ({e})"
  device = "cuda" if torch.cuda.is_available() else "cpu"
  out = {"impl": ("trl GKDTrainer" if impl == "trl" else
                  "plain PyTorch + transformers"), "why": why,
         "device": (torch.cuda.get_device_name() if device == "cuda"
                    else "cpu"),
         "torch": torch.__version__, "transformers": transformers.__version__,
         "trl": trl.__version__ if impl == "trl" else None,
         "compute_dtype": spec["compute_dtype"], "policies": {}}
  # On a CPU, torch's default threads and one thread (on a busy host the
  # default is often several times slower, as bench.rollout found): the
  # faster counts.
  threads = ([torch.get_num_threads()] + [1] * (torch.get_num_threads() > 1)
             if device == "cpu" else [None])
  fn = _trl_times if impl == "trl" else _torch_times
  for policy in spec["policies"]:
    res = {}
    for n in threads:
      _log(f"peer ({out['impl']}), {policy} policy, threads {n} ...")
      if n is not None:
        torch.set_num_threads(n)
      try:
        times = fn(spec, policy, device)
        res[n] = {"step_s": statistics.median(times), "step_times_s": times,
                  "torch_threads": n}
      except Exception as e:  # pylint: disable=broad-except
        # Out of memory, say: the other policy may still run.
        res[n] = {"error": _first_line(e), "torch_threads": n}
      if device == "cuda":
        torch.cuda.empty_cache()
    ok = [r for r in res.values() if "step_s" in r]
    out["policies"][policy] = (min(ok, key=lambda r: r["step_s"]) if ok
                               else next(iter(res.values())))
    if len(res) > 1:
      out["policies"][policy]["by_threads"] = {
          str(n): r.get("step_s", r.get("error")) for n, r in res.items()}
  if device == "cuda":
    out["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated())
  return out


def _torch_model(hf: dict, dtype: str, device: str, seed: int):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  fields = {k: v for k, v in hf.items()
            if k not in ("architectures", "torch_dtype", "model_type")}
  c = transformers.AutoConfig.for_model(hf["model_type"], **fields)
  c._attn_implementation = "sdpa"  # pylint: disable=protected-access
  torch.manual_seed(seed)
  with torch.device(device):
    m = transformers.AutoModelForCausalLM.from_config(
        c, dtype=getattr(torch, dtype))
  m.generation_config.eos_token_id = None
  m.generation_config.pad_token_id = 0
  return m


def _models(spec, device):
  s = _torch_model(spec["student"], spec["student_param_dtype"], device, 0)
  t = _torch_model(spec["teacher"], spec["teacher_param_dtype"], device, 1)
  t.eval().requires_grad_(False)
  return s, t


def _prompts(spec):
  import torch  # pylint: disable=g-import-not-at-top
  g = torch.Generator().manual_seed(0)
  return torch.randint(3, spec["vocab"], (spec["batch"], spec["prompt_len"]),
                       generator=g)


def _torch_times(spec, policy, device):
  """Seconds per step of the plain-PyTorch step: per micro-batch, the
  policy samples new_tokens (temperature, no top-k / top-p, no EOS), the
  teacher scores, the student's forward KL over the response positions
  (logits of those positions only), backward; then clipping and AdamW."""
  import torch  # pylint: disable=g-import-not-at-top
  s, t = _models(spec, device)
  opt = torch.optim.AdamW(s.parameters(), lr=spec["lr"], betas=(0.9, 0.999),
                          eps=1e-8, weight_decay=0.0)
  a, n = spec["grad_accum"], spec["new_tokens"]
  rows = spec["batch"] // a
  ts, tt = spec["temperatures"]
  gen, temp = (s, ts) if policy == "student" else (t, tt)
  prompts = _prompts(spec).to(device)
  compute = getattr(torch, spec["compute_dtype"])
  mixed = spec["compute_dtype"] != spec["student_param_dtype"]

  def amp():
    return (torch.autocast(device_type=device, dtype=compute) if mixed
            else contextlib.nullcontext())

  def step():
    for i in range(a):
      ids = prompts[i * rows:(i + 1) * rows]
      with torch.no_grad(), amp():
        seq = gen.generate(ids, attention_mask=torch.ones_like(ids),
                           do_sample=True, temperature=temp, top_k=0,
                           top_p=1.0, max_new_tokens=n, min_new_tokens=n)
        tl = t(seq, logits_to_keep=n + 1).logits[:, :-1]
      with amp():
        sl = s(seq, logits_to_keep=n + 1).logits[:, :-1]
      logp = torch.log_softmax(tl.float() / tt, -1)
      logq = torch.log_softmax(sl.float() / ts, -1)
      loss = (logp.exp() * (logp - logq)).sum(-1).mean() / a
      loss.backward()
    torch.nn.utils.clip_grad_norm_(s.parameters(), spec["clip_norm"])
    opt.step()
    opt.zero_grad(set_to_none=True)
    if device == "cuda":
      torch.cuda.synchronize()

  times = []
  for i in range(spec["warmup"] + spec["steps"]):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
    _log(f"peer {policy} step {i}: {times[-1]:.3f}s")
  return times[spec["warmup"]:]


def trl_pieces(vocab: int, p: int, n: int, label: str, sync=None):
  """What a GKDTrainer race needs beside the models: a word-level tokenizer
  over the ids (TRL wants a processing class with a pad token; no text is
  tokenized), a collate of prompts of `p` ids followed by `n` placeholder
  response ids (labels on the response only, as after generation), and a
  callback appending each step's seconds to `times` (`sync()` first: a
  GPU's queue)."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  tok = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tokenizers.Tokenizer(tokenizers.models.WordLevel(
          {f"t{i}": i for i in range(vocab)}, unk_token="t1")),
      pad_token="t0", unk_token="t1")

  def collate(rows):
    ids = torch.tensor([r["prompt"] for r in rows], dtype=torch.long)
    full = torch.cat([ids, torch.full((len(rows), n), 3, dtype=torch.long)], 1)
    labels = full.clone()
    labels[:, :p] = -100  # N response positions count, as after generation
    return {"input_ids": full, "attention_mask": torch.ones_like(full),
            "labels": labels, "prompts": ids,
            "prompt_attention_mask": torch.ones_like(ids)}

  times = []

  class Timer(transformers.TrainerCallback):

    def on_step_begin(self, args, state, control, **kw):
      self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
      if sync is not None:
        sync()
      times.append(time.perf_counter() - self.t0)
      _log(f"{label} step {len(times) - 1}: {times[-1]:.3f}s")

  return tok, collate, times, Timer()


def _trl_times(spec, policy, device):
  """Seconds per step of TRL's GKDTrainer (on_step_begin -> on_step_end),
  as bench.gkd drives it: lmbda 1.0 (student rollouts) or lmbda 0.0 with
  seq_kd (teacher rollouts), beta 0.0 (forward KL), the policy model's
  sampling temperature, the run's micro-batches."""
  import datasets  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from trl.experimental.gkd import GKDConfig  # pylint: disable=g-import-not-at-top
  from trl.experimental.gkd import GKDTrainer  # pylint: disable=g-import-not-at-top
  s, t = _models(spec, device)
  a, n, p = spec["grad_accum"], spec["new_tokens"], spec["prompt_len"]
  total = spec["warmup"] + spec["steps"]
  tok, collate, times, timer = trl_pieces(
      spec["vocab"], p, n, f"peer {policy}",
      sync=torch.cuda.synchronize if device == "cuda" else None)

  mixed = spec["compute_dtype"] != spec["student_param_dtype"]
  with tempfile.TemporaryDirectory() as out:
    args = GKDConfig(
        output_dir=out, lmbda=1.0 if policy == "student" else 0.0,
        seq_kd=policy == "teacher", beta=0.0,
        temperature=spec["temperatures"][0 if policy == "student" else 1],
        max_new_tokens=n, per_device_train_batch_size=spec["batch"] // a,
        gradient_accumulation_steps=a, max_steps=total,
        learning_rate=spec["lr"], lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999,
        adam_epsilon=1e-8, max_grad_norm=spec["clip_norm"],
        use_cpu=device == "cpu", bf16=mixed and spec["compute_dtype"] == "bfloat16",
        fp16=False, report_to=[], save_strategy="no", logging_steps=10**6,
        dataloader_num_workers=0, disable_dropout=True, seed=0,
        disable_tqdm=True, max_length=None)
    prompts = _prompts(spec).tolist()
    data = datasets.Dataset.from_dict({"prompt": prompts * total})
    trainer = GKDTrainer(model=s, teacher_model=t, args=args,
                         train_dataset=data, data_collator=collate,
                         processing_class=tok, callbacks=[timer])
    trainer.generation_config.eos_token_id = None
    with contextlib.redirect_stdout(sys.stderr):  # Trainer prints a summary
      trainer.train()
  return times[spec["warmup"]:]


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if len(argv) != 1:
    raise SystemExit("usage: python -m jaxdistill.bench.torch_peer SPEC.json")
  with open(argv[0]) as f:
    out = run_peer(json.load(f))
  print(json.dumps(out))
  return out


if __name__ == "__main__":
  main()
