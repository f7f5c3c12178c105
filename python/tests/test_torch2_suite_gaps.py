"""torch_suite.py --gaps: the gaps with gloo are judged against a list of
explained ones. Exact: 0; a gap not listed, or a listed one that now
passes: counted and named; a malformed list: refused, naming the line.
(The suite itself runs in test_torch2_suite.py and make test-torch-suite.)"""

import os
import sys
import types

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import torch_suite  # noqa: E402


def res(**status):
    return {("test_" + k): {"status": v, "reason": "why %s" % k} for k, v in status.items()}


BACKENDS = ["gloo", "gorun"]
RESULTS = {("gloo", 2): res(a="PASS", b="PASS", c="PASS", d="SKIP"),
           ("gorun", 2): res(a="PASS", b="SKIP", c="ERROR", d="SKIP")}


def missing_of(results):
    out = []
    for name, r in sorted(results[("gloo", 2)].items()):
        o = results[("gorun", 2)].get(name)
        if r["status"] == "PASS" and (o is None or o["status"] != "PASS"):
            out.append((2, "gorun", name, o))
    return out


def judge(tmp_path, rows, results=RESULTS):
    p = tmp_path / "gaps.tsv"
    p.write_text("# comment\n\n" + "".join("\t".join(r) + "\n" for r in rows))
    args = types.SimpleNamespace(gaps=str(p))
    return torch_suite.judge_gaps(args, BACKENDS, [2], results, missing_of(results),
                                  torch_suite.load_gaps(str(p)))


def test_exactly_the_explained_gaps_pass(tmp_path, capsys):
    assert judge(tmp_path, [("gorun", "test_b", "gate"), ("gorun", "test_c", "bug"),
                            ("gorun", "test_d", "gloo skips it: no gap, not stale")]) == 0
    assert "each explained" in capsys.readouterr().out


def test_a_new_gap_fails_naming_it(tmp_path, capsys):
    assert judge(tmp_path, [("gorun", "test_b", "gate")]) == 1
    out = capsys.readouterr().out
    assert "unexplained gap: world 2 gorun test_c: ERROR why c" in out


def test_an_explained_gap_that_now_passes_fails_naming_it(tmp_path, capsys):
    rows = [("gorun", "test_a", "was broken"), ("gorun", "test_b", "gate"), ("gorun", "test_c", "bug")]
    assert judge(tmp_path, rows) == 1
    assert "explained gap now passes: world 2 gorun test_a" in capsys.readouterr().out


def test_rows_of_a_column_not_compared_count_neither_way(tmp_path):
    rows = [("gorun", "test_b", "gate"), ("gorun", "test_c", "bug"), ("gorun@gloo", "test_a", "other column")]
    assert judge(tmp_path, rows) == 0


@pytest.mark.parametrize("text,words", [
    ("gorun\ttest_a\n", ["gaps.tsv:1", "backend<TAB>test_name<TAB>reason"]),
    ("gorun test_a reason\n", ["gaps.tsv:1"]),
    ("gorun\ttest_a\tx\ngorun\ttest_a\ty\n", ["gaps.tsv:2", "listed twice"]),
    ("gorun\ta\treason\n", ["gaps.tsv:1"]),
])
def test_a_malformed_list_is_refused_naming_the_line(tmp_path, text, words):
    p = tmp_path / "gaps.tsv"
    p.write_text(text)
    with pytest.raises(SystemExit) as e:
        torch_suite.load_gaps(str(p))
    for w in words:
        assert w in str(e.value)


def test_the_checked_in_list_parses():
    gaps = torch_suite.load_gaps(os.path.join(os.path.dirname(__file__), "..", "..", "scripts",
                                              "torch-suite-gaps.tsv"))
    assert gaps and all(b in ("gorun", "gorun@gloo") for b, _ in gaps)
