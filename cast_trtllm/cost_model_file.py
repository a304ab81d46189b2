"""`OnlineCostModel`'s file: what it learned about one machine, as JSON (`cast_trtllm.cost_cache` names it).

Readings are stored as the model holds them, at the table's own speed (`cast_trtllm.machine_speed`); a model
loaded from the file starts at speed 1 and follows today's from its first readings of known cells.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cast_trtllm.json_fields import fields_of, int_keyed, milliseconds, milliseconds_list

if TYPE_CHECKING:
    from cast_trtllm.cost_model import OnlineCostModel

SCHEMA_VERSION = 2  # 2: a verify reading carries the walk, commit and KV compaction after the pass


def to_dict(model: OnlineCostModel) -> dict[str, Any]:
    """What was learned about this machine (readings, buckets, prior); not the policy knobs."""
    return {
        "schema_version": SCHEMA_VERSION, "buckets": list(model.buckets),
        "prior": None if model.prior is None else {str(n): ms for n, ms in model.prior.items()},
        "prior_draft_ms": model.prior_draft_ms, "window": model.window,
        "verify_ms": {str(b): {str(k): list(v) for k, v in row.items()} for b, row in model.verify.items()},
        "draft_ms": {str(b): list(v) for b, v in model.draft.items()},
    }


def from_dict(cls: type[OnlineCostModel], data: dict[str, Any], **knobs: Any) -> OnlineCostModel:
    """Parse and validate `to_dict` output; `knobs` set the policy fields (rank_cap, ..., and `window`:
    a file's own `window` says what it was written with; each cell keeps its newest `window` readings)."""
    data = fields_of(data, "cost_model", {"schema_version", "buckets", "prior", "prior_draft_ms",
                                          "window", "verify_ms", "draft_ms"})
    if data["schema_version"] != SCHEMA_VERSION:
        raise ValueError(f"cost_model.schema_version: this build reads version {SCHEMA_VERSION}, "
                         f"got {data['schema_version']}")
    prior = None if data["prior"] is None else int_keyed(data["prior"], "cost_model.prior")
    model = cls(buckets=data["buckets"], prior=prior, prior_draft_ms=data["prior_draft_ms"], **knobs)
    for b, row in int_keyed(data["verify_ms"], "cost_model.verify_ms").items():
        path = f'cost_model.verify_ms["{b}"]'
        for bucket, values in int_keyed(row, path).items():
            if bucket not in model.buckets:
                raise ValueError(f'{path}["{bucket}"]: not one of the buckets {list(model.buckets)}')
            readings = milliseconds_list(values, f'{path}["{bucket}"]')
            model.verify.setdefault(b, {})[bucket] = list(readings[-model.window:])
    for b, values in int_keyed(data["draft_ms"], "cost_model.draft_ms").items():
        model.draft[b] = [milliseconds(v, f'cost_model.draft_ms["{b}"][{i}]', positive=False)
                          for i, v in enumerate(values)][-model.window:]
    return model


def save(model: OnlineCostModel, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(to_dict(model), indent=1) + "\n")


def load(cls: type[OnlineCostModel], path: str | Path, **knobs: Any) -> OnlineCostModel:
    try:
        return from_dict(cls, json.loads(Path(path).read_text()), **knobs)
    except (ValueError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: {err}") from err
