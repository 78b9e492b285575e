"""How the perfect-score shortcut changed the search (docs/design.md §4.3, docs/paper.md §12.1).

Compares a run with the shortcut to the strict run with the same seed, round by
round. Rounds are matched by (request_id, round) and only compared while the two trees
agree on the round's membership: after the first divergence, later rounds of that
request have different members and are counted as downstream of a divergence.
"""
from __future__ import annotations

import pandas as pd


def shortcut_divergence(with_shortcut: pd.DataFrame, strict: pd.DataFrame) -> pd.DataFrame:
    """One row per round of the shortcut run with `closed_by`, `same_members`,
    `selection_differs` (same members, different selected keys), `after_divergence`."""
    ref = {(r.request_id, r.round): r for r in strict.itertuples()}
    rows = []
    diverged: set[int] = set()
    for r in with_shortcut.sort_values(["request_id", "round"]).itertuples():
        other = ref.get((r.request_id, r.round))
        same_members = other is not None and list(r.member_keys) == list(other.member_keys)
        differs = bool(same_members and sorted(r.selected_keys) != sorted(other.selected_keys))
        after = r.request_id in diverged
        if differs or not same_members:
            diverged.add(r.request_id)
        rows.append(
            {
                "request_id": r.request_id, "round": r.round, "closed_by": r.closed_by,
                "same_members": same_members, "selection_differs": differs, "after_divergence": after,
            }
        )
    return pd.DataFrame(rows)
