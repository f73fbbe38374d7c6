"""Miita.longest_answer: the server's reply limit reads it; re-derived from the template's targets."""
from __future__ import annotations

from miita_edge import Example, Miita
from miita_edge.runtime.engine import EngineConfig


def test_longest_answer_is_the_longest_stored_target_and_follows_each_version(tmp_path):
    with Miita(memory=tmp_path / "mem", engine_config=EngineConfig(n_threads=1)) as m:
        assert m.longest_answer == 0  # an empty memory
        short, long_ = "billing desk", "please call the billing desk on weekdays between nine and five"
        m.ingest([Example("I was charged twice", short), Example("my card was billed twice", short)], progress=False)

        def tokens(y):
            return len(m.engine.tokenize(m.template.render_target(y), add_bos=False))
        assert m.longest_answer == tokens(short)
        m.ingest([Example("when can I call about a charge?", long_)], progress=False)
        assert m.longest_answer == tokens(long_) > tokens(short)
