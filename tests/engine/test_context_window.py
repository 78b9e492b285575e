"""A path ends, terminal, when its history fills the generator's context window."""
from __future__ import annotations

from cfg_helpers import compose_cfg
from specscale.cell import build_server
from specscale.search.candidate import END_PATH_CAP


def test_paths_stop_at_the_context_window():
    server = build_server(compose_cfg("policy=spec", "beam=4", "search.path_token_cap=100000"))
    prompt_len = max(len(server.backend.prompt_tokens(r.problem)) for r in server.waiting)
    window = prompt_len + 30
    server.backend.max_model_len = window
    server.gen.max_len = window  # the engine reads the window from its backend when built
    rec = server.run()
    assert rec.leaked_blocks == 0
    ended = [(req, c) for req in server.finished for c in req.search.candidates if c.end_reason is not None]
    capped = [c for _, c in ended if c.end_reason == END_PATH_CAP]
    assert capped and all(c.terminal for c in capped)
    assert max(len(req.prompt) + c.path_tokens for req, c in ended) == window
