"""bench/gate.py choose: the gate grid recomputed by hand on a one-answer memory, and the rule."""
from __future__ import annotations

import json

from test_split_guard import load_bench


def _run() -> dict:
    """One answer (taught 3 times, radius 0) whose generic questions' best cosines are 0.1-0.4:
    mean 0.25, std 0.1118, so the null is 0.5955 at z 3.09, 0.5105 at 2.33, 0.4334 at 1.64, 0.3618
    at 1; with K = 64 bits the nearest-question margin is 1/8."""
    def q(best, nearest):
        return {"ids": [0], "best": [best], "nearest": nearest}
    return {"key_dim": 64, "generic_best": [[0.1], [0.2], [0.3], [0.4]], "counts": [3], "radius": [0.0],
            "on": [q(0.55, 0.2), q(0.65, 0.1)],  # the first passes below z 3.09; the second everywhere
            "off": [q(0.45, 0.5)],  # near a generic question: only the test stops it (passes alone at z 1.64)
            "questions": [q(0.40, 0.2)]}  # passes alone at z 1, declined at 1.64 either way


def test_gate_grid_shares_by_hand():
    g = load_bench("gate")
    run = _run()
    assert g.shares(run, 3.09, False) == {"on": 50.0, "off": 0.0, "questions": 0.0}
    assert g.shares(run, 2.33, True) == {"on": 100.0, "off": 0.0, "questions": 0.0}
    assert g.shares(run, 1.64, False) == {"on": 100.0, "off": 100.0, "questions": 0.0}
    assert g.shares(run, 1.64, True) == {"on": 100.0, "off": 0.0, "questions": 0.0}
    assert g.shares(run, 1.0, False)["questions"] == 100.0 and g.shares(run, 1.0, True)["questions"] == 100.0


def test_gate_rule_takes_the_most_on_topic_point_no_looser_than_shipped_ties_to_the_larger_z(tmp_path):
    g = load_bench("gate")
    f = tmp_path / "run.json"
    f.write_text(json.dumps(_run()))
    assert g.choose([f]) == (2.33, True)  # 2.33 and 1.64 both steer every on-topic row and no off-topic one
    # an off-topic question that only z 1.64 lets through makes 1.64 looser than shipped: 2.33 stays
    run = _run()
    run["questions"].append({"ids": [0], "best": [0.47], "nearest": 0.1})
    f.write_text(json.dumps(run))
    assert g.shares(run, 1.64, True)["questions"] == 50.0
    assert g.choose([f]) == (2.33, True)
    # nothing below 3.09 steers more on-topic rows: 3.09 with the test (the shipped rule, tightened)
    run = _run()
    run["on"] = [run["on"][1]]
    f.write_text(json.dumps(run))
    assert g.choose([f]) == (3.09, True)
