"""lm-evaluation-harness on the project's JAX models (forgetting, App. D.1).

  python -m jaxdistill.evaluate.harness --model jaxdistill \
      --model_args pretrained=DIR_OR_HUB_NAME,dtype=bfloat16,max_gen_toks=1024 \
      --batch_size 16 --tasks truthfulqa_mc1 --limit 200 --apply_chat_template

  # the paper's seven forgetting benchmarks (App. D.1.2; OOD_TASKS), then
  # their scores and unweighted mean (ood/mean) from lm-eval's results file:
  HF_ALLOW_CODE_EVAL=1 python -m jaxdistill.evaluate.harness --model jaxdistill \
      --model_args pretrained=DIR --batch_size 16 --ood \
      --confirm_run_unsafe_code --output_path /runs/x/lmeval
  python -m jaxdistill.evaluate.harness ood-score /runs/x/lmeval/*/results_*.json

The command line is lm-eval's own (`lm_eval` / `lm-eval run`): this module
registers the model class `jaxdistill` with lm-eval's registry, then hands the
arguments to lm-eval's CLI. lm-eval's stock `lm_eval` command cannot find an
external model by name, hence the wrapper. Install with
`pip install 'jaxdistill[lmeval]'`; the path needs no torch (lm-eval's core has
none; only its `hf` model, used as the reference in the tests, does).

`JaxLM` is an lm_eval.api.model.TemplateLM, so context/continuation
tokenisation (trailing spaces of the context moved to the continuation, the
prefix token for an empty context) is lm-eval's own code, as for its `hf`
model. What we add:

  loglikelihood          each (context, continuation) pair as one right-padded
                         row, (ctx + cont)[-(max_length + 1):][:-1], as HFLM
                         builds it; log-softmax over the checkpoint's whole
                         logit width (HF's); is_greedy = every continuation
                         token is the argmax.
  loglikelihood_rolling  lm-eval's rolling windows (get_rolling_token_windows
                         with context_len 1, make_disjoint_window), each scored
                         as above, summed per document.
  generate_until         rollout.generate (greedy at temperature 0, else
                         sampled with the request's temperature / top_p /
                         top_k); rows end at EOS or after max_gen_toks; the
                         text is cut at the first `until` string (lm-eval's
                         postprocessing). Tokens are drawn over the
                         tokenizer's vocabulary only (len(tokenizer)), as the
                         project's evaluation does: a checkpoint's padding
                         rows are never emitted.

Batches: rows are sorted by length, widths rounded to powers of two and the
batch always filled to `batch_size` (dummy rows), so a task compiles once per
width bucket. The forward is models.apply(return_hidden=True) under jit, with
the output head applied in sequence chunks so that [B, T, V] float32 logits are
never materialised whole.

Choices the paper leaves open: sampling RNG is `seed` (model arg, default 0)
folded with the request's index, so a request's draw does not depend on its
batch; `device` from lm-eval's command line is ignored (JAX places arrays on
its default device); one host process, no mesh.
"""
from __future__ import annotations

from collections.abc import Sequence
import difflib
import functools
import json
import logging
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

_NO_LMEVAL = ("jaxdistill.evaluate.harness needs lm-evaluation-harness: "
              "pip install 'jaxdistill[lmeval]'")
try:
  import lm_eval
  from lm_eval import utils as lm_utils
  from lm_eval.api import model as lm_model
  from lm_eval.api import registry as lm_registry
  from lm_eval.models import utils as lm_model_utils
except ImportError as e:
  if __name__ == "__main__":
    sys.exit(f"error: {_NO_LMEVAL}")
  raise ImportError(_NO_LMEVAL) from e

from jaxdistill import models
from jaxdistill import rollout as rollout_lib
from jaxdistill.data import tokenizer as tok_lib
from jaxdistill.evaluate import suites as suites_lib
from jaxdistill.models import checkpoint
from jaxdistill.models import hub

NAME = "jaxdistill"
_HEAD_CHUNK = 256  # sequence positions per output-head matmul
_DEFAULT_MAX_LENGTH = 2048  # HFLM's fallback when nothing names a length


@functools.partial(jax.jit, static_argnums=0)
def _score(cfg, params, tokens, mask, targets, target_mask):
  """Per row: sum of log p(target) over target_mask, and whether all are argmax.

  tokens, mask, targets, target_mask: [B, T]; T a multiple of the chunk (or
  smaller than it).
  """
  hidden = models.apply(cfg, params, tokens, mask, return_hidden=True)  # [B, T, D]
  head = models.output_head(cfg, params).astype(cfg.dtype)  # [D, V]
  b, t, d = hidden.shape
  c = min(_HEAD_CHUNK, t)

  def chunk(args):
    h, y = args  # [B, C, D], [B, C]
    logits = jnp.dot(h.reshape(b * c, d), head,
                     preferred_element_type=jnp.float32).reshape(b, c, -1)
    lp = (jnp.take_along_axis(logits, y[..., None], -1)[..., 0]
          - jax.nn.logsumexp(logits, axis=-1))
    return lp, jnp.argmax(logits, axis=-1) == y

  split = lambda x: jnp.moveaxis(x.reshape(b, t // c, c, *x.shape[2:]), 1, 0)
  lp, hit = jax.lax.map(chunk, (split(hidden), split(targets)))  # [T/C, B, C]
  lp = jnp.moveaxis(lp, 0, 1).reshape(b, t)
  hit = jnp.moveaxis(hit, 0, 1).reshape(b, t)
  m = target_mask > 0
  return jnp.sum(jnp.where(m, lp, 0.0), axis=1), jnp.all(hit | ~m, axis=1)


def _width(n: int, cap: int) -> int:
  """Power-of-two width >= n, at most max(cap, n)."""
  return max(n, min(rollout_lib.bucket_length(n), cap))


def _positive_int(name, value):
  try:
    v = int(value)
  except (TypeError, ValueError):
    v = 0
  if v < 1 or str(value).strip() != str(v):
    raise ValueError(f"{name}: expected a positive integer, got {value!r}")
  return v


class JaxLM(lm_model.TemplateLM):
  """An lm-eval model on a Hugging Face checkpoint loaded as JAX params.

  Model args (`--model_args k=v,...`): pretrained (checkpoint directory or hub
  name `org/name[@revision]`), dtype ('float32' / 'bfloat16'; default the
  checkpoint's), max_length (default: the config's max_position_embeddings,
  as HFLM), max_gen_toks (default 256, as HFLM), add_bos_token and
  prefix_token_id (as HFLM's), seed. batch_size comes from lm-eval's
  --batch_size (a number; 'auto' is refused).
  """

  def __init__(self, pretrained: str, dtype: str | None = None,
               batch_size: int | str = 1, max_length: int | None = None,
               max_gen_toks: int = 256, add_bos_token: bool | None = None,
               prefix_token_id: int | None = None, seed: int = 0,
               device: str | None = None, max_batch_size: int | None = None,
               **kwargs):
    super().__init__()
    del max_batch_size  # only meaningful with batch_size 'auto'
    if kwargs:
      raise ValueError(f"{NAME}: unknown model args {sorted(kwargs)}")
    if device not in (None, "", "cpu", "cuda", "tpu"):
      logging.info("%s: device=%s ignored; JAX uses %s", NAME, device,
                   jax.default_backend())
    if str(batch_size).startswith("auto"):
      raise ValueError(f"{NAME}: batch_size 'auto' is not supported; give a "
                       "number (--batch_size 16)")
    self._batch_size = _positive_int("batch_size", batch_size)
    self._max_gen_toks = _positive_int("max_gen_toks", max_gen_toks)
    self.seed = int(seed)
    self.pretrained = str(pretrained)
    path = self.pretrained
    if hub.is_hub_id(path) and not os.path.isdir(path):
      path = hub.resolve(path)[0]
    self.cfg, self.params = models.load_pretrained(path, dtype)
    # lm-eval applies a chat template only when asked (--apply_chat_template):
    # a base model's tokenizer, which has none, is scored as HFLM scores it.
    self.tokenizer = tok_lib.load_tokenizer(str(path), need_chat_template=False)
    self.vocab = len(self.tokenizer)
    if self.vocab > self.cfg.vocab_size:
      raise ValueError(f"{pretrained}: tokenizer has {self.vocab} tokens, more "
                       f"than the model's vocabulary ({self.cfg.vocab_size})")
    self._max_length = (_positive_int("max_length", max_length)
                        if max_length is not None else
                        int(self.cfg.max_position_embeddings or
                            _DEFAULT_MAX_LENGTH))
    self.add_bos_token = (None if add_bos_token is None
                          else str(add_bos_token).lower() in ("true", "1"))
    self.custom_prefix_token_id = (None if prefix_token_id is None
                                   else int(prefix_token_id))
    # As HF's generate: the ids of generation_config.json end a row too.
    self.eos = rollout_lib.eos_ids(self.cfg, tokenizer=self.tokenizer,
                                   extra=checkpoint.generation_eos_ids(path))
    self.pad_id = int(self.tokenizer.pad_token_id if
                      self.tokenizer.pad_token_id is not None else self.eos[0])
    self._rank, self._world_size = 0, 1

  # -- what lm-eval reads ------------------------------------------------------

  @property
  def eot_token_id(self) -> int:
    return self.tokenizer.eos_token_id

  @property
  def prefix_token_id(self) -> int:
    if self.custom_prefix_token_id is not None:
      return self.custom_prefix_token_id
    if self.tokenizer.bos_token_id is not None:
      return self.tokenizer.bos_token_id
    return self.tokenizer.eos_token_id

  @property
  def max_length(self) -> int:
    return self._max_length

  @property
  def max_gen_toks(self) -> int:
    return self._max_gen_toks

  @property
  def batch_size(self) -> int:
    return self._batch_size

  @property
  def device(self) -> str:
    return jax.default_backend()

  @property
  def tokenizer_name(self) -> str:
    return self.tokenizer.name_or_path.replace("/", "__")

  def apply_chat_template(self, chat_history, add_generation_prompt=True) -> str:
    if not getattr(self.tokenizer, "chat_template", None):
      raise ValueError(f"--apply_chat_template: {self.pretrained}'s tokenizer "
                       "has no chat template (a base model?); run without it")
    return self.tokenizer.apply_chat_template(
        chat_history, tokenize=False,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=not add_generation_prompt)

  def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                 left_truncate_len: int | None = None, **kwargs) -> list[int]:
    """As HFLM: the tokenizer's own special tokens unless told otherwise, and
    none when the text already starts with the prefix (BOS) token."""
    kw = {}
    if add_special_tokens is not None:
      kw["add_special_tokens"] = add_special_tokens
    elif self.add_bos_token is not None:
      kw["add_special_tokens"] = self.add_bos_token
    if add_special_tokens is None and lm_model_utils.has_bos_prefix(
        string, self.tokenizer.decode(self.prefix_token_id)):
      kw["add_special_tokens"] = False
    ids = self.tokenizer.encode(string, **kw)
    return ids[-left_truncate_len:] if left_truncate_len else ids

  # -- scoring -----------------------------------------------------------------

  def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False,
                            **kwargs) -> list[tuple[float, bool]]:
    """requests: (cache_key, context_ids, continuation_ids) triples."""
    rows = []
    for _, ctx, cont in requests:
      if not ctx or not cont:
        raise ValueError("loglikelihood: empty context or continuation tokens")
      if len(cont) > self.max_length:
        raise ValueError(f"loglikelihood: continuation of {len(cont)} tokens "
                         f"exceeds max_length {self.max_length}")
      whole = (list(ctx) + list(cont))[-(self.max_length + 1):]
      rows.append((whole[:-1], whole[1:], len(cont)))
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
    out = [None] * len(rows)
    bs = self.batch_size
    for start in range(0, len(order), bs):
      idx = order[start:start + bs]
      t = _width(len(rows[idx[0]][0]), self.max_length)
      if t > _HEAD_CHUNK:
        t = -(-t // _HEAD_CHUNK) * _HEAD_CHUNK
      tokens = np.full((bs, t), self.pad_id, np.int32)
      mask = np.zeros((bs, t), np.int32)
      targets = np.zeros((bs, t), np.int32)
      tmask = np.zeros((bs, t), np.int32)
      mask[len(idx):, 0] = 1  # dummy rows: one token, nothing scored
      for r, i in enumerate(idx):
        inp, tgt, n = rows[i]
        tokens[r, :len(inp)] = inp
        mask[r, :len(inp)] = 1
        targets[r, :len(tgt)] = tgt
        tmask[r, len(tgt) - n:len(tgt)] = 1
      lp, greedy = _score(self.cfg, self.params, tokens, mask, targets, tmask)
      lp, greedy = np.asarray(lp), np.asarray(greedy)
      for r, i in enumerate(idx):
        out[i] = (float(lp[r]), bool(greedy[r]))
    for (key, _, _), ans in zip(requests, out):
      if key is not None:
        self.cache_hook.add_partial("loglikelihood", key, ans)
    return out

  def loglikelihood_rolling(self, requests, disable_tqdm: bool = False
                            ) -> list[float]:
    windows, owner = [], []
    for i, (text,) in enumerate(req.args for req in requests):
      for w in lm_utils.get_rolling_token_windows(
          token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
          max_seq_len=self.max_length, context_len=1):
        ctx, cont = lm_utils.make_disjoint_window(w)
        windows.append((None, ctx, cont))
        owner.append(i)
    scores = self._loglikelihood_tokens(windows, disable_tqdm=True)
    totals = [0.0] * len(requests)
    for i, (lp, _) in zip(owner, scores):
      totals[i] += lp
    for req, total in zip(requests, totals):
      self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
    return totals

  # -- generation --------------------------------------------------------------

  def _encode_prompt(self, text: str, max_ctx_len: int) -> list[int]:
    """As HFLM's tok_batch_encode for one row (left-truncated)."""
    kw = {}
    if lm_model_utils.has_bos_prefix(text, self.tokenizer.bos_token):
      kw["add_special_tokens"] = False
    elif self.add_bos_token is not None:
      kw["add_special_tokens"] = self.add_bos_token
    ids = self.tokenizer(text, **kw)["input_ids"]
    return ids[-max_ctx_len:]

  def _sampling(self, kwargs: dict) -> dict:
    """The rollout.generate settings one group of requests asks for."""
    kwargs = dict(kwargs)
    kwargs.pop("max_length", None)
    do_sample = kwargs.pop("do_sample", False)
    temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
    top_p = kwargs.pop("top_p", None)
    top_k = kwargs.pop("top_k", None)
    if kwargs:
      logging.warning("%s: generation kwargs ignored: %s", NAME, sorted(kwargs))
    if not do_sample or temperature == 0.0:
      return {"temperature": 0.0, "top_p": None, "top_k": None}
    return {"temperature": temperature,
            "top_p": None if top_p is None else float(top_p),
            "top_k": None if top_k in (None, 0) else int(top_k)}

  def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
    eos_text = self.tokenizer.decode(self.eot_token_id, skip_special_tokens=False)
    groups = {}
    for i, req in enumerate(requests):
      context, gen_kwargs = req.args
      if not isinstance(gen_kwargs, dict):
        raise ValueError(f"generate_until: gen_kwargs must be a dict, got "
                         f"{type(gen_kwargs).__name__}")
      groups.setdefault(repr(sorted(gen_kwargs.items())), []).append(i)
    out = [None] * len(requests)
    for idx in groups.values():
      context0, gen_kwargs = requests[idx[0]].args
      kwargs = lm_model_utils.normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
      until = lm_model_utils.handle_stop_sequences(kwargs.pop("until", None),
                                                   eos=eos_text)
      max_new = int(kwargs.pop("max_gen_toks"))
      max_ctx = self.max_length - max_new
      if max_ctx <= 0:
        raise ValueError(f"generate_until: max_gen_toks {max_new} leaves no "
                         f"room for a prompt within max_length {self.max_length}")
      sampling = self._sampling(kwargs)
      prompts = {i: self._encode_prompt(requests[i].args[0], max_ctx)
                 for i in idx}
      idx = sorted(idx, key=lambda i: -len(prompts[i]))
      for start in range(0, len(idx), self.batch_size):
        chunk = idx[start:start + self.batch_size]
        ids = [prompts[i] for i in chunk]
        ids += [ids[0]] * (self.batch_size - len(ids))  # fixed batch shape
        toks, mask = rollout_lib.pad_prompts(ids, pad_token_id=self.pad_id,
                                             bucket="pow2")
        rows = np.array(chunk + [-1] * (self.batch_size - len(chunk)))
        r = rollout_lib.generate(
            (self.cfg, self.params), None, toks, mask,
            rng=jax.random.key(self.seed), policy="student",
            max_new_tokens=max_new, eos_token_ids=self.eos,
            pad_token_id=self.pad_id, return_logprobs=False,
            row_ids=np.where(rows < 0, len(requests), rows).astype(np.int32),
            vocab_size=self.vocab, **sampling)
        texts = rollout_lib.decode_responses(r, self.tokenizer,
                                             skip_special_tokens=True)
        for i, text in zip(chunk, texts):
          out[i] = lm_model_utils.postprocess_generated_text(
              text, until, think_end_token=None)
          self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
    return out

  def get_model_info(self) -> dict:
    return {"model_num_parameters": models.num_params(self.params, self.cfg),
            "model_dtype": self.cfg.dtype, "model_revision": "",
            "model_sha": ""}


# The paper's forgetting suite (App. D.1.2): lm-eval task -> (the key of its
# score in lm-eval's results JSON, factor to a fraction in [0, 1]). With
# --limit 200 lm-eval caps each task, and each of MMLU-Pro's 14 subjects, at
# 200 examples: 2,800 MMLU-Pro, 200 each of TruthfulQA-MC1, IFEval, BBQ and
# ToxiGen, all 164 HumanEval-Instruct and all 171 EQ-Bench (3,935 in all).
# The paper names the benchmarks, not lm-eval's task names or versions; these
# are lm-eval 0.4.13's. EQ-Bench's score is in percent: "normalised" read as
# divided by 100. HumanEval executes the generated code: lm-eval refuses it
# unless the user passes --confirm_run_unsafe_code (and HF_ALLOW_CODE_EVAL=1
# for the `evaluate` code_eval metric); nothing here turns that on.
OOD_TASKS = {
    "mmlu_pro": ("exact_match,custom-extract", 1.0),
    "truthfulqa_mc1": ("acc,none", 1.0),
    "ifeval": ("prompt_level_strict_acc,none", 1.0),
    "humaneval_instruct": ("pass@1,create_test", 1.0),
    "eq_bench": ("eqbench,none", 0.01),
    "bbq": ("acc,none", 1.0),
    "toxigen": ("acc,none", 1.0),
}
OOD_LIMIT = 200


def ood_args() -> list[str]:
  """lm-eval arguments that run the paper's seven benchmarks."""
  return ["--tasks", ",".join(OOD_TASKS), "--limit", str(OOD_LIMIT)]


def ood_scores(results: dict) -> dict[str, float]:
  """Per-task scores (fractions) and their unweighted mean, `ood/mean`, from
  an lm-eval results JSON (its top level or its "results" entry)."""
  scores = _task_scores(results.get("results", results), OOD_TASKS,
                        "run all seven tasks: ood_args()")
  return {**{f"ood/{t}": v for t, v in scores.items() if t != "score"},
          "ood/mean": scores["score"]}


def _task_scores(results: dict, keys: dict, hint: str) -> dict[str, float]:
  """{'score': the unweighted mean, task: score} from lm-eval's per-task
  results; keys: {task: (results key, factor to a fraction)}."""
  out = {}
  for task, (key, factor) in keys.items():
    value = results.get(task, {}).get(key)
    if value is None:
      raise ValueError(f"no {key!r} for task {task!r} in lm-eval's results "
                       f"(it has {sorted(results.get(task, {}))}; {hint})")
    out[task] = float(value) * factor
  return {"score": sum(out.values()) / len(out), **out}


def score_key(task: str, metrics: dict | None = None) -> tuple[str, float]:
  """(results key, factor to a fraction) of `task`'s score: `metrics[task]`
  ('key' or 'key*factor') when given, else OOD_TASKS's entry."""
  given = (metrics or {}).get(task)
  if given:
    key, _, factor = str(given).partition("*")
    return key, float(factor or 1.0)
  if task not in OOD_TASKS:
    raise ValueError(f"no score key for lm-eval task {task!r}: name it in the "
                     "suite's metrics, e.g. metrics={'" + task +
                     "': 'acc,none'} (OOD_TASKS has the paper's seven)")
  return OOD_TASKS[task]


_MANAGERS = {}  # include_path -> lm-eval's TaskManager


def task_manager(include_path: str | None = None):
  """lm-eval's TaskManager for `include_path`, built once per process
  (indexing every task YAML takes seconds)."""
  from lm_eval import tasks as lm_tasks  # pylint: disable=g-import-not-at-top
  key = include_path or None
  if key not in _MANAGERS:
    _MANAGERS[key] = lm_tasks.TaskManager(include_path=key)
  return _MANAGERS[key]


def check_tasks(name: str, spec) -> None:
  """ValueError naming config.suites.NAME.tasks when lm-eval knows no task,
  group or tag of that name (with its include_path): said before any
  checkpoint loads, not after the other suites have run."""
  include = spec.get("include_path") or None
  known = task_manager(include).all_tasks
  for t in suites_lib.task_names(spec):
    if t not in known:
      close = difflib.get_close_matches(t, known, n=3)
      raise ValueError(
          f"config.suites.{name}.tasks: lm-eval {lm_eval.__version__} has no task "
          f"{t!r}" + (f" (close: {', '.join(close)})" if close else "")
          + (f", nor has include_path {include}" if include else ""))


def evaluate_suite(pretrained: str, spec, *, dtype: str | None = None,
                   seed: int = 0, system: str | None = None) -> tuple[dict, dict]:
  """An evaluation suite of kind 'harness' (configs/eval.py's `lmeval`): its
  lm-eval tasks on the checkpoint directory `pretrained` through JaxLM,
  in-process (lm-eval's simple_evaluate; its datasets download on first use).

  spec: tasks ('+'-joined lm-eval task names), limit (per task, and per
  subtask of a group such as MMLU-Pro; None: all), limits ({task: limit},
  overriding limit), batch_size, max_gen_toks, max_length, apply_chat_template,
  confirm_run_unsafe_code (lm-eval's switch for tasks that execute generated
  code), include_path (a directory of task YAMLs), metrics ({task: 'key' or
  'key*factor'}, for tasks outside OOD_TASKS).
  Returns ({'score': unweighted mean, task: score, ...} as fractions,
  {task: lm-eval's metrics of the task}). Tasks with one limit run in one
  simple_evaluate call; the model is loaded once.
  """
  from lm_eval import evaluator  # pylint: disable=g-import-not-at-top
  tasks = suites_lib.task_names(spec)
  metrics = dict(spec.get("metrics") or {})
  keys = {t: score_key(t, metrics) for t in tasks}  # before any loading
  limits = dict(spec.get("limits") or {})
  args = dict(pretrained=pretrained, batch_size=int(spec.get("batch_size") or 1),
              seed=int(seed))
  for k in ("dtype", "max_gen_toks", "max_length"):
    v = dtype if k == "dtype" else spec.get(k)
    if v is not None:
      args[k] = v
  lm = JaxLM(**args)
  manager = task_manager(spec.get("include_path") or None)
  by_limit = {}
  for t in tasks:
    by_limit.setdefault(limits.get(t, spec.get("limit")), []).append(t)
  raw = {}
  for limit, group in by_limit.items():
    out = evaluator.simple_evaluate(
        model=lm, tasks=group, limit=limit, task_manager=manager,
        apply_chat_template=bool(spec.get("apply_chat_template")),
        system_instruction=system, log_samples=False, bootstrap_iters=0,
        random_seed=int(seed), numpy_random_seed=int(seed),
        fewshot_random_seed=int(seed),
        confirm_run_unsafe_code=bool(spec.get("confirm_run_unsafe_code")))
    raw.update((t, out["results"][t]) for t in group)
  return _task_scores(raw, keys, "name the key in the suite's metrics"), raw


def register() -> None:
  """Registers JaxLM as lm-eval's model `jaxdistill` (once per process)."""
  if NAME not in lm_registry.model_registry.keys():
    lm_registry.register_model(NAME)(JaxLM)


register()


def main(argv: Sequence[str] | None = None) -> None:
  """lm-eval's command line, with `--model jaxdistill` available.

  Two additions: `--ood` stands for the paper's seven tasks and limit
  (ood_args), and `ood-score RESULTS.json` prints ood_scores as JSON.
  """
  from lm_eval import __main__ as lm_main  # pylint: disable=g-import-not-at-top
  argv = list(sys.argv[1:] if argv is None else argv)
  if argv[:1] == ["ood-score"]:
    if len(argv) != 2:
      sys.exit("usage: python -m jaxdistill.evaluate.harness ood-score "
               "RESULTS.json")
    try:
      with open(argv[1], encoding="utf-8") as f:
        print(json.dumps(ood_scores(json.load(f)), indent=2))
    except (OSError, ValueError) as e:
      sys.exit(f"error: {e}")
    return
  if "--ood" in argv:
    argv.remove("--ood")
    argv += ood_args()
  sys.argv = [sys.argv[0]] + argv
  lm_main.cli_evaluate()


if __name__ == "__main__":
  main()
