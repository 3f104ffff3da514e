"""Converters from public file formats; malformed rows name file and line."""
import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jaxdistill.data import sources


def write_jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
  return str(path)


def write_csv(path, header, rows):
  with open(path, "w", newline="", encoding="utf-8") as f:
    w = csv.writer(f)
    w.writerow(header)
    w.writerows(rows)
  return str(path)


def test_generic_jsonl_csv_parquet_agree(tmp_path):
  recs = [{"question": "2+2?", "options": ["3", "4", "5"], "answer": "B"},
          {"question": "Sky\ncolour?", "options": ["blue", "red"], "answer": "A"}]
  j = write_jsonl(tmp_path / "train.jsonl", recs)
  c = write_csv(tmp_path / "train.csv", ["question", "options", "answer"],
                [[r["question"], json.dumps(r["options"]), r["answer"]] for r in recs])
  c2 = write_csv(tmp_path / "train2.csv", ["question", "A", "B", "C", "answer"],
                 [["2+2?", "3", "4", "5", "B"], ["Sky\ncolour?", "blue", "red", "", "A"]])
  p = str(tmp_path / "train.parquet")
  pq.write_table(pa.Table.from_pylist(recs), p)
  for path in (j, c, c2, p):
    assert sources.convert_file(path) == recs, path


def test_sciq_and_gpqa_shuffle_deterministically(tmp_path):
  rows = [{"question": f"Q{i}?", "distractor1": f"w1-{i}", "distractor2": f"w2-{i}",
           "distractor3": f"w3-{i}", "correct_answer": f"right-{i}", "support": "..."}
          for i in range(24)]
  path = write_jsonl(tmp_path / "sciq_train.jsonl", rows)
  recs = sources.convert_file(path, "sciq", seed=0)
  for i, r in enumerate(recs):
    assert sorted(r["options"]) == sorted(
        [f"w1-{i}", f"w2-{i}", f"w3-{i}", f"right-{i}"])
    assert r["options"]["ABCD".index(r["answer"])] == f"right-{i}"
  assert len({r["answer"] for r in recs}) >= 3  # Not always the same slot.
  assert sources.convert_file(path, "sciq", seed=0) == recs
  assert sources.convert_file(path, "sciq", seed=1) != recs
  # Independent of file order: reversed file, same per-question permutation.
  rpath = write_jsonl(tmp_path / "rev.jsonl", rows[::-1])
  assert sources.convert_file(rpath, "sciq", seed=0) == recs[::-1]

  header = ["Record ID", "Question", "Correct Answer", "Incorrect Answer 1",
            "Incorrect Answer 2", "Incorrect Answer 3", "Explanation"]
  grows = [[f"r{i}", f"GQ{i}", f"c{i}", f"x{i}", f"y{i}", f"z{i}", "e"]
           for i in range(24)]
  gpath = write_csv(tmp_path / "gpqa_diamond.csv", header, grows)
  grecs = sources.convert_file(gpath, "gpqa", seed=3)
  assert [r["options"]["ABCD".index(r["answer"])] for r in grecs] == [
      f"c{i}" for i in range(24)]
  assert len({r["answer"] for r in grecs}) >= 3
  assert sources.split_of_file(gpath) == "test"


def test_medmcqa_cop_bases(tmp_path):
  base = {"question": "q", "opa": "a", "opb": "b", "opc": "c", "opd": "d",
          "choice_type": "single", "exp": None}
  hub = write_jsonl(tmp_path / "hub.jsonl",
                    [dict(base, cop=c) for c in (0, 3, 1)] + [dict(base, cop=-1)])
  assert [r["answer"] for r in sources.convert_file(hub, "medmcqa")] == ["A", "D", "B"]
  # The original release: 1-based, one object per line in a .json file.
  orig = tmp_path / "train.json"
  orig.write_text("".join(json.dumps(dict(base, cop=c)) + "\n" for c in (4, 1, 2)))
  assert [r["answer"] for r in sources.convert_file(str(orig), "medmcqa")] == [
      "D", "A", "B"]
  amb = write_jsonl(tmp_path / "amb.jsonl", [dict(base, cop=c) for c in (1, 2)])
  with pytest.raises(sources.DataError) as e:
    sources.convert_file(amb, "medmcqa")
  # The hint names what exists: convert_file's cop_base, write_jsonl, and
  # the generic source; following it gives the records.
  msg = str(e.value)
  assert (f"convert_file({amb!r}, 'medmcqa', cop_base=0 or 1)" in msg
          and "sources.write_jsonl" in msg and "'generic'" in msg), msg
  assert "\n" not in msg and "pass cop_base" not in msg
  recs = sources.convert_file(amb, "medmcqa", cop_base=1)
  assert [r["answer"] for r in recs] == ["A", "B"]
  sources.write_jsonl(recs, str(tmp_path / "fixed.jsonl"))
  assert sources.convert_file(str(tmp_path / "fixed.jsonl"), "generic") == recs
  both = write_jsonl(tmp_path / "both.jsonl", [dict(base, cop=c) for c in (0, 4)])
  with pytest.raises(sources.DataError, match=r"both 0 and 4.*fix the file$"):
    sources.convert_file(both, "medmcqa")


def test_medqa_and_pubmedqa(tmp_path):
  medqa = write_jsonl(tmp_path / "US_test.jsonl", [
      {"question": "Which drug?", "answer": "Aspirin",
       "options": {"B": "Aspirin", "A": "Heparin", "C": "Warfarin", "D": "None"},
       "meta_info": "step1", "answer_idx": "B"},
      {"question": "Which organ?", "answer": "Liver",
       "options": [{"key": "A", "value": "Liver"}, {"key": "B", "value": "Lung"}],
       "answer_idx": "A"}])
  recs = sources.convert_file(medqa, "medqa")
  assert recs[0] == {"question": "Which drug?",
                     "options": ["Heparin", "Aspirin", "Warfarin", "None"],
                     "answer": "B"}
  assert recs[1]["options"] == ["Liver", "Lung"] and recs[1]["answer"] == "A"

  ori = tmp_path / "ori_pqal.json"
  ori.write_text(json.dumps({
      "123": {"QUESTION": "Does X help?", "CONTEXTS": ["Part one.", "Part two."],
              "final_decision": "maybe", "LONG_ANSWER": "..."}}))
  (rec,) = sources.convert_file(str(ori), "pubmedqa")
  assert rec["options"] == ["yes", "no", "maybe"] and rec["answer"] == "C"
  assert rec["question"] == "Context: Part one.\nPart two.\n\nQuestion: Does X help?"
  hub = str(tmp_path / "pqa_labeled_train.parquet")
  pq.write_table(pa.Table.from_pylist([
      {"pubid": 1, "question": "Does Y help?",
       "context": {"contexts": ["Abstract."], "labels": ["A"]},
       "long_answer": "...", "final_decision": "no"}]), hub)
  (rec,) = sources.convert_file(hub, "pubmedqa")
  assert rec["answer"] == "B" and rec["question"].endswith("Question: Does Y help?")


def test_malformed_rows_name_file_and_line(tmp_path):
  good = json.dumps({"question": "q", "options": ["a", "b"], "answer": "A"})
  bad_json = tmp_path / "train.jsonl"
  bad_json.write_text(f"{good}\n\n{good}\n{{not json\n{good}\n")
  with pytest.raises(sources.DataError, match=r"train\.jsonl:4: invalid JSON"):
    sources.convert_file(str(bad_json))

  missing = tmp_path / "val.jsonl"
  missing.write_text(f"{good}\n" + json.dumps({"question": "q", "answer": "A"}) + "\n")
  with pytest.raises(sources.DataError, match=r"val\.jsonl:2: missing field 'options'"):
    sources.convert_file(str(missing))

  bad_letter = tmp_path / "x.jsonl"
  bad_letter.write_text(json.dumps({"question": "q", "options": ["a", "b"],
                                    "answer": "C"}) + "\n")
  with pytest.raises(sources.DataError, match=r"x\.jsonl:1: 'answer' 'C'"):
    sources.convert_file(str(bad_letter))

  # A quoted multi-line field shifts physical lines: the error must still point
  # at the line where the bad record starts (line 5 here).
  csv_path = write_csv(tmp_path / "dev.csv", ["question", "options", "answer"],
                       [["multi\nline", '["a", "b"]', "A"], ["q2", '["a", "b"]', "B"]])
  with open(csv_path, "a") as f:
    f.write('q3,"[""a"", ""b""]"\n')
  with pytest.raises(sources.DataError, match=r"dev\.csv:5: 2 fields"):
    sources.convert_file(csv_path)

  gpqa = write_csv(tmp_path / "gpqa.csv", ["Question", "Correct Answer",
                                          "Incorrect Answer 1", "Incorrect Answer 2",
                                          "Incorrect Answer 3"],
                   [["q", "c", "x", "y", "z"], ["q2", "", "x", "y", "z"]])
  with pytest.raises(sources.DataError, match=r"gpqa\.csv:3: field 'Correct Answer' is empty"):
    sources.convert_file(gpqa, "gpqa")

  pq_path = str(tmp_path / "t.parquet")
  pq.write_table(pa.Table.from_pylist([
      {"question": "q", "options": ["a", "b"], "answer": "A"},
      {"question": "q", "options": ["a", "b"], "answer": "Z"}]), pq_path)
  with pytest.raises(sources.DataError, match=r"t\.parquet: row 1"):
    sources.convert_file(pq_path)

  ori = tmp_path / "ori_pqal.json"
  ori.write_text(json.dumps({"7": {"QUESTION": "q", "final_decision": "perhaps"}}))
  with pytest.raises(sources.DataError, match=r"ori_pqal\.json: key '7'"):
    sources.convert_file(str(ori), "pubmedqa")


def test_bad_arguments(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.jsonl"):
    sources.convert_file(str(tmp_path / "nope.jsonl"))
  (tmp_path / "a.txt").write_text("x")
  with pytest.raises(ValueError, match="unknown file format"):
    sources.convert_file(str(tmp_path / "a.txt"))
  with pytest.raises(ValueError, match="source"):
    sources.convert_file(str(tmp_path / "a.txt"), "mmlu")
  with pytest.raises(FileNotFoundError, match="no .jsonl"):
    sources.find_files(str(tmp_path))
