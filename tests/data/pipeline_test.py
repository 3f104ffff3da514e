"""Prompt / sequence batches: deterministic, random-access, correctly laid out."""
import ml_collections
import numpy as np
import pytest

from jaxdistill import tasks
from jaxdistill.data import pipeline
from jaxdistill.tasks import countdown

P = 160


def records():
  cd = [p.to_record() for p in countdown.generate_problems(3, 18, seed=2)]
  cd += [p.to_record() for p in countdown.generate_problems(5, 4, seed=2)]
  mc = [{"question": f"Question {i}: which?", "options": ["x", "y", "z"],
         "answer": "ABC"[i % 3]} for i in range(6)]
  long = [{"question": "very long " * 200, "options": ["a", "b"], "answer": "A"}]
  return cd + mc + long  # 28 usable + 1 too long.


def expected_prompt_ids(tok, rec):
  text = tok.apply_chat_template([{"role": "user", "content": tasks.prompt_text(rec)}],
                                 tokenize=False, add_generation_prompt=True)
  return tok.encode(text, add_special_tokens=False)


def test_prompt_batches_deterministic_random_access_and_epochs(tiny_tokenizer):
  recs = records()
  make = lambda seed: pipeline.make_prompt_batches(
      recs, tiny_tokenizer, batch_size=4, max_prompt_len=P, seed=seed)
  a, b, c = make(0), make(0), make(1)
  assert a.num_dropped == 1 and a.steps_per_epoch == 7
  # Random access in any order equals a fresh pipeline's batch.
  for step in (9, 0, 6, 7, 3):
    x, y = a[step], b[step]
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=f"{k} at step {step}")
  # One epoch = each kept record exactly once; the next epoch is reshuffled.
  epoch0 = np.concatenate([a[s]["index"] for s in range(7)])
  epoch1 = np.concatenate([a[s]["index"] for s in range(7, 14)])
  assert sorted(epoch0) == sorted(epoch1) == list(range(28))
  assert not np.array_equal(epoch0, epoch1)
  other = np.concatenate([c[s]["index"] for s in range(7)])
  assert not np.array_equal(epoch0, other)


def test_prompt_batch_contents(tiny_tokenizer):
  recs = records()
  batches = pipeline.make_prompt_batches(recs, tiny_tokenizer, batch_size=4,
                                         max_prompt_len=P, seed=0)
  pad = tiny_tokenizer.pad_token_id
  for step in range(7):
    x = batches[step]
    assert x["prompt"].shape == (4, P) and x["prompt"].dtype == np.int32
    for row, i in enumerate(x["index"]):
      rec = recs[i]
      ids = expected_prompt_ids(tiny_tokenizer, rec)
      n = len(ids)
      np.testing.assert_array_equal(x["prompt"][row, P - n:], ids)   # Left-padded.
      assert (x["prompt"][row, :P - n] == pad).all()
      np.testing.assert_array_equal(x["prompt_mask"][row],
                                    [0] * (P - n) + [1] * n)
      if "numbers" in rec:
        assert x["task"][row] == tasks.COUNTDOWN and x["target"][row] == rec["target"]
        nums = list(rec["numbers"]) + [-1] * (6 - len(rec["numbers"]))
        np.testing.assert_array_equal(x["numbers"][row], nums)
        assert x["gold"][row] == -1
      else:
        assert x["task"][row] == tasks.MCQ
        assert "ABC"[x["gold"][row]] == rec["answer"]
        assert x["num_options"][row] == len(rec["options"])
        assert x["target"][row] == -1 and (x["numbers"][row] == -1).all()
    assert (x["valid"] == 1).all()


def test_length_filter_matches_independent_count(tiny_tokenizer):
  recs = records()
  lengths = [len(expected_prompt_ids(tiny_tokenizer, r)) for r in recs]
  limit = sorted(lengths)[len(lengths) // 2]
  batches = pipeline.make_prompt_batches(recs, tiny_tokenizer, batch_size=2,
                                         max_prompt_len=limit, seed=0)
  assert batches.num_dropped == sum(n > limit for n in lengths)
  with pytest.raises(ValueError, match=(
      rf"max_prompt_len=3: all {len(recs)} prompts are longer \(the shortest "
      rf"has {min(lengths)} tokens\)")):
    pipeline.make_prompt_batches(recs, tiny_tokenizer, batch_size=2,
                                 max_prompt_len=3, seed=0)


def test_finite_ordered_pass_pads_last_batch(tiny_tokenizer):
  recs = records()
  batches = pipeline.make_prompt_batches(recs, tiny_tokenizer, batch_size=5,
                                         max_prompt_len=P, seed=0, shuffle=False,
                                         num_epochs=1)
  assert len(batches) == 6  # 28 examples -> 5 full batches + 3 real rows.
  idx = np.concatenate([batches[s]["index"] for s in range(6)])
  valid = np.concatenate([batches[s]["valid"] for s in range(6)])
  np.testing.assert_array_equal(idx[valid == 1], np.arange(28))
  assert valid.sum() == 28 and (valid[-2:] == 0).all()
  with pytest.raises(IndexError):
    batches[6]


def test_process_shards_split_the_global_batch(tiny_tokenizer):
  recs = records()
  kw = dict(batch_size=4, max_prompt_len=P, seed=3)
  full = pipeline.make_prompt_batches(recs, tiny_tokenizer, **kw)
  parts = [pipeline.make_prompt_batches(recs, tiny_tokenizer, process_index=i,
                                        process_count=2, **kw) for i in range(2)]
  for step in (0, 5, 11):
    for k, v in full[step].items():
      np.testing.assert_array_equal(
          v, np.concatenate([p[step][k] for p in parts]), err_msg=k)


def test_sequence_batches_layout(tiny_tokenizer):
  recs = records()[:22]  # Countdown only: responses are solver solutions.
  r_len = 120
  seq = pipeline.make_sequence_batches(recs, tiny_tokenizer, batch_size=3,
                                       max_prompt_len=P, max_response_len=r_len,
                                       seed=4)
  again = pipeline.make_sequence_batches(recs, tiny_tokenizer, batch_size=3,
                                         max_prompt_len=P, max_response_len=r_len,
                                         seed=4)
  eos = tiny_tokenizer.eos_token_id
  for step in (4, 0, 8):
    x = seq[step]
    for k in x:
      np.testing.assert_array_equal(x[k], again[step][k])
    assert x["tokens"].shape == (3, P + r_len)
    for row, i in enumerate(x["index"]):
      rec = recs[i]
      prompt = expected_prompt_ids(tiny_tokenizer, rec)
      resp = tiny_tokenizer.encode(countdown.reference_completion(
          rec["numbers"], rec["target"], rec["solution"]), add_special_tokens=False)
      resp = resp + [eos]
      np.testing.assert_array_equal(x["tokens"][row, P - len(prompt):P], prompt)
      np.testing.assert_array_equal(x["tokens"][row, P:P + len(resp)], resp)
      want_attn = np.zeros(P + r_len, np.int32)
      want_attn[P - len(prompt):P + len(resp)] = 1
      np.testing.assert_array_equal(x["attention_mask"][row], want_attn)
      want_resp = np.zeros(P + r_len, np.int32)
      want_resp[P:P + len(resp)] = 1
      np.testing.assert_array_equal(x["response_mask"][row], want_resp)
      # The fixed responses verify with reward 1.
      text = tiny_tokenizer.decode(x["tokens"][row][x["response_mask"][row] == 1],
                                   skip_special_tokens=True)
      assert countdown.reward(text, rec["numbers"], rec["target"]) == 1.0
  # Responses longer than the limit are dropped, not truncated.
  short = pipeline.make_sequence_batches(recs, tiny_tokenizer, batch_size=2,
                                         max_prompt_len=P, max_response_len=10, seed=0,
                                         response_fn=lambda r: "<answer>1</answer>"
                                         if r["target"] % 2 else "x " * 40)
  assert short.num_dropped == sum(r["target"] % 2 == 0 for r in recs)


def test_bucket_pads_to_the_batch_longest_rounded_up(tiny_tokenizer):
  recs = records()[:22]
  eos = tiny_tokenizer.eos_token_id
  resp_ids = lambda r: tiny_tokenizer.encode(countdown.reference_completion(
      r["numbers"], r["target"], r["solution"]), add_special_tokens=False) + [eos]
  seq = pipeline.make_sequence_batches(recs, tiny_tokenizer, batch_size=3,
                                       max_prompt_len=P, max_response_len=120,
                                       seed=4, bucket=16)
  prompts = pipeline.make_prompt_batches(recs, tiny_tokenizer, batch_size=3,
                                         max_prompt_len=P, seed=4, bucket=16)
  widths = set()
  for step in range(6):
    x, y = seq[step], prompts[step]
    p_len = [len(expected_prompt_ids(tiny_tokenizer, recs[i])) for i in x["index"]]
    r_len = [len(resp_ids(recs[i])) for i in x["index"]]
    p = 16 * -(-max(p_len) // 16)
    r = 16 * -(-max(r_len) // 16)
    assert x["tokens"].shape == (3, p + r) and y["prompt"].shape == (3, p)
    widths.add(p + r)
    for row, i in enumerate(x["index"]):
      prompt, resp = expected_prompt_ids(tiny_tokenizer, recs[i]), resp_ids(recs[i])
      np.testing.assert_array_equal(x["tokens"][row, p - len(prompt):p], prompt)
      np.testing.assert_array_equal(x["tokens"][row, p:p + len(resp)], resp)
      assert x["attention_mask"][row].sum() == len(prompt) + len(resp)
      assert x["response_mask"][row, p:].sum() == len(resp)
  assert len(widths) > 1  # the records' lengths differ enough to show it
  with pytest.raises(ValueError, match="bucket"):
    pipeline.make_prompt_batches(recs, tiny_tokenizer, batch_size=3,
                                 max_prompt_len=P, seed=4, bucket=0)


def test_score_maps_completions_back(tiny_tokenizer):
  recs = records()[:22]
  batches = pipeline.make_prompt_batches(recs, tiny_tokenizer, batch_size=4,
                                         max_prompt_len=P, seed=0)
  x = batches[2]
  texts = []
  for i in x["index"]:  # G = 2: one right, one wrong answer per prompt.
    texts += [f"<answer>{recs[i]['solution']}</answer>", "<answer>1+1</answer>"]
  np.testing.assert_array_equal(batches.score(texts, x)["reward"], [1, 0] * 4)


def test_argument_errors(tiny_tokenizer):
  recs = records()
  with pytest.raises(ValueError, match="batch_size"):
    pipeline.make_prompt_batches(recs, tiny_tokenizer, batch_size=0,
                                 max_prompt_len=P, seed=0)
  with pytest.raises(ValueError, match="seed"):
    pipeline.make_prompt_batches(recs, tiny_tokenizer, batch_size=2,
                                 max_prompt_len=P, seed=-1)
  with pytest.raises(ValueError, match="process_count"):
    pipeline.make_prompt_batches(recs, tiny_tokenizer, batch_size=3,
                                 max_prompt_len=P, seed=0, process_count=2)


def test_batches_from_config(tiny_tokenizer, tmp_path):
  config = ml_collections.ConfigDict({
      "seed": 0, "rollout": {"policy": "student", "max_new_tokens": 128},
      "data": {"task": "countdown", "n_numbers": 3, "batch_size": 4,
               "max_prompt_len": P, "num_problems": 40,
               "data_dir": str(tmp_path / "tfds")}})
  from_tfds = pipeline.batches_from_config(config, tiny_tokenizer)
  config.data.data_dir = None
  in_memory = pipeline.batches_from_config(config, tiny_tokenizer)
  key = lambda r: (tuple(r["numbers"]), r["target"])
  assert sorted(map(key, from_tfds.records)) == sorted(map(key, in_memory.records))
  assert len(in_memory.records) == 40 and from_tfds[3]["prompt"].shape == (4, P)
  config.rollout.policy = "dataset"
  seq = pipeline.batches_from_config(config, tiny_tokenizer)
  assert seq[0]["tokens"].shape == (4, P + 128)
  config.data.task = "gsm8k"
  with pytest.raises(ValueError, match="data.task"):
    pipeline.batches_from_config(config, tiny_tokenizer)


def test_batches_from_config_names_the_limit_no_record_fits(tiny_tokenizer):
  config = ml_collections.ConfigDict({
      "seed": 0, "rollout": {"policy": "student", "max_new_tokens": 128},
      "data": {"task": "countdown", "n_numbers": 3, "batch_size": 4,
               "max_prompt_len": 3, "num_problems": 40, "data_dir": None}})
  with pytest.raises(ValueError, match=r"^config\.data\.max_prompt_len: "
                     r"max_prompt_len=3: all 40 prompts are longer"):
    pipeline.batches_from_config(config, tiny_tokenizer)
  config.rollout.policy = "dataset"
  with pytest.raises(ValueError, match=r"^config\.data\.max_prompt_len"):
    pipeline.batches_from_config(config, tiny_tokenizer)
  config.data.max_prompt_len, config.rollout.max_new_tokens = P, 2
  with pytest.raises(ValueError, match=r"^config\.rollout\.max_new_tokens: "
                     r"max_response_len=2: all 40 responses"):
    pipeline.batches_from_config(config, tiny_tokenizer)


def test_records_task_reads_a_mixed_file(tiny_tokenizer, tmp_path):
  recs = [{"numbers": [3, 4, 5], "target": 27, "solution": "(4+5)*3"},
          {"question": "Which is even?", "options": ["3", "8"], "answer": "B",
           "response": "8 is even.\nThe answer is: B"}]
  path = tmp_path / "mine.jsonl"
  pipeline.write_records(recs, str(path))
  assert pipeline.read_records(str(path)) == recs
  config = ml_collections.ConfigDict({
      "seed": 0, "rollout": {"policy": "student", "max_new_tokens": 64},
      "data": {"task": "records", "records_file": str(path), "batch_size": 2,
               "max_prompt_len": P}})
  b = pipeline.batches_from_config(config, tiny_tokenizer)
  x = b[0]
  by_index = {int(i): int(t) for i, t in zip(x["index"], x["task"])}
  assert by_index == {0: tasks.COUNTDOWN, 1: tasks.MCQ}
  assert {int(g) for g in x["gold"]} == {-1, 1}
  config.data.records_file = None
  with pytest.raises(ValueError, match="records_file"):
    pipeline.batches_from_config(config, tiny_tokenizer)


def test_records_task_with_fewer_records_than_the_batch_is_refused(
    tiny_tokenizer, tmp_path):
  """A batch of 4 from 2 records used to repeat them without a word."""
  recs = [{"numbers": [3, 4, 5], "target": 27, "solution": "(4+5)*3"},
          {"numbers": [2, 3, 4], "target": 10, "solution": "2*3+4"}]
  path = tmp_path / "mine.jsonl"
  pipeline.write_records(recs, str(path))
  config = ml_collections.ConfigDict({
      "seed": 0, "rollout": {"policy": "student", "max_new_tokens": 64},
      "data": {"task": "records", "records_file": str(path), "batch_size": 4,
               "max_prompt_len": P}})
  with pytest.raises(ValueError, match=(
      rf"^config\.data\.batch_size: 4 is more than the 2 usable records of "
      rf"{path}")):
    pipeline.batches_from_config(config, tiny_tokenizer)
  config.data.batch_size = 2
  assert len(pipeline.batches_from_config(config, tiny_tokenizer)[0]["index"]) == 2


@pytest.mark.parametrize("line, match", [
    ('{"numbers": [1, 2], "target": "x"}', "integer"),
    ('{"question": "q", "options": ["a"], "answer": "A"}', "options"),
    ('{"question": "q", "options": ["a", "b"], "answer": "C"}', "answer"),
    ('{"prompt": "hello"}', "expected Countdown fields"),
    ('[1, 2]', "JSON object"),
    # JSON booleans are not numbers (Python's True == 1).
    ('{"numbers": [true, 2], "target": 3}', r"field 'numbers' .* \[True, 2\]"),
    ('{"numbers": [1, 2], "target": true}', "field 'target' must be an integer"),
    ('{"expression": "1+0", "value": true}', "field 'value'"),
    # Both kinds at once: which one was meant is not for us to guess.
    ('{"numbers": [1, 2], "target": 3, "question": "q", "options": ["a", "b"], '
     '"answer": "A"}', r"fields of a Countdown record \(numbers, target\) and "
     r"a multiple-choice record \(question, options, answer\)"),
    ('{"question": "Capital?", "options": ["Paris", "Rome", " Paris "], '
     '"answer": "A"}', r"field 'options': A and C are the same option 'Paris'"),
    # A missing field is named.
    ('{"question": "q", "options": ["a", "b"]}',
     "multiple-choice record has no field 'answer'"),
    ('{"target": 3, "solution": "1+2"}', "Countdown record has no field 'numbers'"),
    ('{"expression": "1+2"}', "arithmetic record has no field 'value'"),
    ('{"numbers": [1, 2], "target": 3, "solution": "1*2"}',
     "field 'solution': solution '1\\*2' does not solve"),
    ('{"question": 7, "options": ["a", "b"], "answer": "A"}', "field 'question'"),
])
def test_read_records_names_the_bad_line(tmp_path, line, match):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"numbers": [1, 2], "target": 3, "solution": "1+2"}\n'
                  + line + "\n")
  with pytest.raises(ValueError, match=match) as e:
    pipeline.read_records(str(path))
  assert str(e.value).startswith(f"{path}:2: ") and "\n" not in str(e.value)


def test_dataset_policy_records_need_a_text_naming_the_line(tiny_tokenizer,
                                                            tmp_path):
  path = tmp_path / "mine.jsonl"
  path.write_text('{"numbers": [3, 4, 5], "target": 27, "solution": "(4+5)*3"}\n'
                  '{"numbers": [3, 4, 5], "target": 12}\n')
  config = ml_collections.ConfigDict({
      "seed": 0, "rollout": {"policy": "student", "max_new_tokens": 64},
      "data": {"task": "records", "records_file": str(path), "batch_size": 2,
               "max_prompt_len": P}})
  assert len(pipeline.batches_from_config(config, tiny_tokenizer)[0]["index"]) == 2
  config.rollout.policy = "dataset"  # now the second record has nothing to train on
  with pytest.raises(ValueError, match=rf"^{path}:2: Countdown record has no "
                     "field 'solution' or 'response'"):
    pipeline.batches_from_config(config, tiny_tokenizer)


def test_teacher_prompt_is_its_own_chat_turn_on_the_same_records(
    tiny_tokenizer):
  """data.teacher_prompt: each row's teacher prompt is the template filled
  with the record's task text (and a field of its own), under the teacher's
  system message, rendered by the chat template directly."""
  recs = [dict(r, demo=f"demo {i}") for i, r in enumerate(records()[:12])]
  template = "Answer in Spanish. Example: {demo}\n{prompt}"
  batches = pipeline.make_prompt_batches(
      recs, tiny_tokenizer, batch_size=4, max_prompt_len=P, seed=3,
      system="be brief", teacher_prompt=template, teacher_system="be Spanish",
      max_teacher_prompt_len=P + 40)
  plain = pipeline.make_prompt_batches(recs, tiny_tokenizer, batch_size=4,
                                       max_prompt_len=P, seed=3,
                                       system="be brief")
  for step in range(3):
    x, y = batches[step], plain[step]
    for k in y:  # the student's keys are untouched
      np.testing.assert_array_equal(x[k], y[k])
    assert x["teacher_prompt"].shape == (4, P + 40)
    for row, i in enumerate(x["index"]):
      user = ("Answer in Spanish. Example: demo " + str(i) + "\n"
              + tasks.prompt_text(recs[i]))
      text = tiny_tokenizer.apply_chat_template(
          [{"role": "system", "content": "be Spanish"},
           {"role": "user", "content": user}],
          tokenize=False, add_generation_prompt=True)
      ids = tiny_tokenizer.encode(text, add_special_tokens=False)
      n = len(ids)
      np.testing.assert_array_equal(x["teacher_prompt"][row, -n:], ids)
      np.testing.assert_array_equal(x["teacher_prompt_mask"][row],
                                    [0] * (P + 40 - n) + [1] * n)
  assert "teacher_prompt" not in plain[0]
  # Kept only when both prompts fit.
  t_len = [len(tiny_tokenizer.encode(tiny_tokenizer.apply_chat_template(
      [{"role": "user", "content": pipeline.teacher_prompt_text(template, r)}],
      tokenize=False, add_generation_prompt=True), add_special_tokens=False))
           for r in recs]
  limit = sorted(t_len)[6]
  short = pipeline.make_prompt_batches(
      recs, tiny_tokenizer, batch_size=2, max_prompt_len=P, seed=0,
      teacher_prompt=template, max_teacher_prompt_len=limit)
  assert short.num_dropped == sum(n > limit for n in t_len)
  assert short.dropped_by == {"max_prompt_len": 0,
                              "max_teacher_prompt_len": short.num_dropped}
  # No teacher prompt fits while the student's do: the teacher's limit is
  # named, with the teacher prompts' lengths.
  with pytest.raises(ValueError, match=(
      rf"^max_teacher_prompt_len=3: all {len(recs)} teacher prompts are "
      rf"longer \(the shortest has {min(t_len)} tokens\)$")):
    pipeline.make_prompt_batches(
        recs, tiny_tokenizer, batch_size=2, max_prompt_len=P, seed=0,
        teacher_prompt=template, max_teacher_prompt_len=3)
  for bad, match in (("no task here", r"\{prompt\}"),
                     ("{prompt} {style}", "no field 'style'"),
                     ("{prompt", "format string")):
    with pytest.raises(ValueError, match=match):
      pipeline.make_prompt_batches(recs, tiny_tokenizer, batch_size=2,
                                   max_prompt_len=P, seed=0,
                                   teacher_prompt=bad)
