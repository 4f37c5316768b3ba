"""Lab 06's exercises (labkit.check.collectives): the checks under a real mpiexec, and how they count rounds and name
a deadlock from the recorded messages."""

import json
from pathlib import Path

import pytest
from conftest import ranks
from mpicases import mpi_cases
from solutions import REGION

from labkit.check import collectives as cc
from labkit.check.exercises import in_lab

SEND, RECV, SR_SEND, SR_RECV, STUCK_SEND, STUCK_RECV = cc.SEND, cc.RECV, cc.SR_SEND, cc.SR_RECV, cc.STUCK_SEND, cc.STUCK_RECV
# their contract (right, blank, mistakes, the grader's replay, labkit's own) is checked on every rank, under mpiexec
MPIEXEC = {name: "cases_collectives_exercise.py" for name in ("linear_reduce", "recursive_doubling", "tree_broadcast")}
ROOT = Path(__file__).resolve().parent.parent


# right answers pass on 1 to n ranks; blank ones are "not written yet"; each typical mistake is named, also when
# recorded and replayed by the grader
test_exercise_checks_pass_right_answers_and_name_mistakes_under_mpiexec = mpi_cases(
    "cases_collectives_exercise.py", ranks(2, 3, 4), marks=[pytest.mark.slow])


def test_lab_06_declares_three_exercises_with_hints():
    declared = {e.name: e for e in in_lab("06")}
    assert list(declared) == sorted(MPIEXEC)
    for e in declared.values():
        assert e.mpi and e.module == "collectives" and len(e.hints) >= 3 and e.references


def _sends(pairs):
    """Logs of a program where rank s sends to rank d, in this order, and d receives in the same order."""
    k = 1 + max(max(p) for p in pairs)
    logs = [[] for _ in range(k)]
    for s, d in pairs:
        logs[s].append((s, d, 8, SEND))
    for s, d in pairs:
        logs[d].append((s, d, 8, RECV))
    return logs


def test_rounds_on_a_one_port_machine():
    # linear broadcast from 0 on 4 ranks: the root sends one message a round
    arrived, rounds = cc.schedule(_sends([(0, 1), (0, 2), (0, 3)]))
    assert rounds == 3 and arrived == [(1, 0, 1), (2, 0, 2), (3, 0, 3)]
    # binomial tree: rank 1 forwards in round 2 what it got in round 1
    logs = [[(0, 1, 8, SEND), (0, 2, 8, SEND)], [(0, 1, 8, RECV), (1, 3, 8, SEND)], [(0, 2, 8, RECV)], [(1, 3, 8, RECV)]]
    assert cc.schedule(logs) == ([(1, 0, 1), (2, 0, 2), (2, 1, 3)], 2)
    # a linear reduce: the root receives one message a round, whatever the order they were sent in
    assert cc.schedule(_sends([(1, 0), (2, 0), (3, 0)]))[1] == 3
    # a Sendrecv exchange is one round; a Send then a Recv each way, two
    both = [[(1, 0, 8, SR_RECV), (0, 1, 8, SR_SEND)], [(0, 1, 8, SR_RECV), (1, 0, 8, SR_SEND)]]
    assert cc.schedule(both) == ([(1, 0, 1), (1, 1, 0)], 1)
    ordered = [[(0, 1, 8, SEND), (1, 0, 8, RECV)], [(0, 1, 8, RECV), (1, 0, 8, SEND)]]
    assert cc.schedule(ordered)[1] == 2
    assert "round 1: 0->1; round 2: 0->2" in cc._show_schedule(cc.schedule(_sends([(0, 1), (0, 2)]))[0])


def test_a_deadlock_is_named_from_what_each_rank_was_stuck_in():
    both_send = [[(0, 1, 8, STUCK_SEND)], [(1, 0, 8, STUCK_SEND)]]
    assert "ranks 0 and 1 both wait in Send to each other" in cc.deadlock(both_send, 3)
    both_recv = [[(1, 0, 0, STUCK_RECV)], [(0, 1, 0, STUCK_RECV)]]
    assert "both wait to receive from each other" in cc.deadlock(both_recv, 3)
    gone = [[], [(0, 1, 0, STUCK_RECV)]]
    assert cc.deadlock(gone, 3) == ("rank 1 waited 3 s for a message from rank 0, which never came: rank 0 returned "
                                    "without a matching Send to rank 1")
    chain = [[(0, 2, 8, SEND)], [(2, 1, 0, STUCK_RECV)], [(2, 3, 8, STUCK_SEND)], []]
    assert "rank 2 was itself stuck sending to rank 3" in cc.deadlock(chain, 3)
    assert cc.deadlock([[], []], 3) is None


def test_a_one_sided_pairing_and_a_result_never_sent_back_are_named_apart_from_a_missing_sendrecv():
    # (r + 1) % 4 as the partner: every rank stuck in an exchange with a rank that exchanges with another
    ring = [[((r + 1) % 4, r, 0, STUCK_RECV), (r, (r + 1) % 4, 8, STUCK_SEND)] for r in range(4)]
    what, hint = cc.stuck_hint(ring, "recursive doubling", 3)
    assert "partners are not mutual: rank 0 waits to exchange with rank 1, but rank 1 waits to exchange with rank 2" \
        in what and "0 with 1, 1 with 2, 2 with 3, 3 with 0" in what
    assert "pair off" in hint and "Sendrecv" not in hint
    # 3 ranks: rank 2 handed its x to rank 0, which returned without sending the result back
    kept = [[(2, 0, 8, RECV)], [], [(2, 0, 8, SEND), (0, 2, 0, STUCK_RECV)]]
    what, hint = cc.stuck_hint(kept, "recursive doubling", 3)
    assert what is None and "rank 0 took in rank 2's x and returned without sending rank 2 the result" in hint
    assert "Sendrecv" not in hint
    # both Send first: that one is about Sendrecv
    assert "Sendrecv" in cc.stuck_hint([[(0, 1, 8, STUCK_SEND)], [(1, 0, 8, STUCK_SEND)]], "recursive doubling", 3)[1]
    # a deadlock no mistake explains gets no hint: the derivation's next step is given instead
    assert cc.stuck_hint([[], [(0, 1, 0, STUCK_RECV)]], "recursive doubling", 3) == (None, "")


def _solution_code() -> str:
    nb = json.loads((ROOT / "notebooks" / "06_mpi_collectives.ipynb").read_text())
    cells = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in nb["cells"]]
    return "\n".join(m.group(1) for text in cells for m in REGION.finditer(text))


# what the answers are made of: none of it may reach a hint
ANSWERS = {"linear_reduce": ["COMBINE[", "out=out", "x.copy()", "empty_like", "range(p)"],
           "tree_broadcast": ["% p", "v + d", "v - d", "d *= 2", "2 * d", "1 << ", "x.copy()"],
           "recursive_doubling": ["^ d", " ^ ", "p2 +", "- p2", "r + p2", "bit_length", "1 << ", "x.copy()"]}


def test_the_hints_lead_to_the_answers_but_never_hold_them():
    lines = [ln.strip() for ln in _solution_code().splitlines() if len(ln.strip()) >= 12 and not ln.strip().startswith("#")]
    assert lines, "the notebook's solution regions"
    for e in in_lab("06"):
        text = " ".join(e.hints)
        assert not [ln for ln in lines if ln.split("  #")[0].strip() in text], e.name
        assert not [bit for bit in ANSWERS[e.name] if bit in text], e.name
        assert e.hints[-1].rstrip().endswith("?"), f"{e.name}: the last step asks, it does not tell"


def test_the_text_states_the_goals_and_leaves_the_rules_to_the_hints():
    nb = json.loads((ROOT / "notebooks" / "06_mpi_collectives.ipynb").read_text())
    text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    for dictated in ("sends its `x` straight to the root", "the root combines what it receives",
                     "hand their `x` to partners", "get the result back", "2(p - p_2)"):
        assert dictated not in text, dictated
