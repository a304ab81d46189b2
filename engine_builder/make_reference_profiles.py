"""Write the paper's measured latency tables as reference width profiles.

Reads the transcription `../shared/data/cast_paper_tables.json` (CAST paper Tables 5, 6,
11 and the Appendix F batch costs) and writes one profile per GPU x target into
`cast_trtllm/profiles/reference/`. The shipped JSONs are this script's output; the
transcription itself is not copied into the repository.

    python -m engine_builder.make_reference_profiles            # regenerate
    python -m engine_builder.make_reference_profiles --check    # verify committed files
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from cast_trtllm.profile import REFERENCE_DIR, Provenance, WidthProfile, build_profile, save_profile

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TABLES = REPO.parent / "shared" / "data" / "cast_paper_tables.json"
PREFIX = {"1k": 1024, "4k": 4096, "8k": 8192, "16k": 16384}  # the paper's "1k" = 1024 tokens
SKU = {  # paper GPU label -> engine_builder/skus/<name>.yaml
    "Blackwell (RTX PRO 6000 Server)": "rtx-pro-6000-blackwell",
    "Blackwell": "rtx-pro-6000-blackwell",
    "A6000": "a6000",
    "A100": "a100",
    "H100 NVL": "h100-nvl",
    "H100 SXM": "h100-sxm",
}
PAPER_FIT_RANGE = (16, 128)  # §3.1: "Over n in [16, 128] a linear fit ..."
APPENDIX_F_DRAFTER = "drafter forward 3.2 ms at batch 1 (paper Appendix F)"


def _paper(gpu: str, target: str, packed: list[int], latency_ms: dict, source: str, notes: str,
           device: str | None = None, fit_range: tuple[int, int] = PAPER_FIT_RANGE, **extra) -> WidthProfile:
    """A bf16 reference profile of the paper's `source`, one bucket per published packed count."""
    return build_profile(sku=SKU[gpu], device=device or gpu, target=target, dtype="bfloat16", packed_counts=packed,
                         latency_ms=latency_ms, provenance=Provenance(f"reference: CAST paper {source}", notes=notes),
                         fit_range=fit_range, buckets=packed, **extra)


def table5(tables: dict) -> dict[str, WidthProfile]:
    t = tables["table5_verify_latency_ms_1k_prefix"]
    drafter_b1 = tables["appendix_F_batch_costs_blackwell_qwen3_8b"]["drafter_forward_ms"]["B=1"]
    out = {}
    for label, ms in t["rows"].items():
        gpu, target = (s.strip() for s in label.rsplit(",", 1))
        blackwell_8b = SKU[gpu] == "rtx-pro-6000-blackwell" and target == "Qwen3-8B"
        notes = ("Target-forward latency, bf16, 1k-token KV prefix (stored as 1024), batch 1; "
                 "random packed tokens, 8 warmups, 30 timed iterations.")
        if blackwell_8b:
            notes += f" drafter_ms: {APPENDIX_F_DRAFTER}."
        out[_name(gpu, target, "table5")] = _paper(gpu, target, t["packed_n"], {1024: {1: ms}}, "Table 5", notes,
                                                   drafter_ms={1: drafter_b1} if blackwell_8b else None)
    return out


def by_prefix(tables: dict, key: str, gpu: str, source: str, notes) -> dict[str, WidthProfile]:
    """One profile per row ("target[ kind]" -> {prefix label: latencies}) of a batch-1 table by KV prefix."""
    t, out = tables[key], {}
    for label, row in t["rows"].items():
        target = label.split()[0]  # "Qwen3.6-27B dense hybrid" -> "Qwen3.6-27B"
        out[_name(gpu, target, source.lower().replace(" ", ""))] = _paper(
            gpu, target, t["packed_n"], {PREFIX[p]: {1: ms} for p, ms in row.items()}, source, notes(label))
    return out


def table6(tables: dict) -> dict[str, WidthProfile]:
    return by_prefix(tables, "table6_h100_sxm_verify_latency_ms_by_prefix", "H100 SXM", "Table 6", lambda label: (
        "Target-forward latency across KV-prefix lengths (1k/4k/8k/16k stored as "
        "1024/4096/8192/16384), bf16, batch 1; measured in a session separate from Table 5."))


def table11(tables: dict) -> dict[str, WidthProfile]:
    return by_prefix(tables, "table11_hybrid_blackwell_verify_latency_ms", "Blackwell (RTX PRO 6000 Server)",
                     "Table 11", lambda label: (f"{label}: verify-forward latency, bf16, batch 1, medians of 15 "
                                                "timed forwards after 5 warmups, each on an untimed copy of the "
                                                "prefix cache (App. D.1)."))


def appendix_f(tables: dict) -> dict[str, WidthProfile]:
    """Batch costs: only RATIOS ell(W=64)/ell(W=1) are published, so each batch row is
    anchored at Table 5's batch-1 n=1 latency; absolute B > 1 values are an assumption."""
    f = tables["appendix_F_batch_costs_blackwell_qwen3_8b"]
    table5_rows = tables["table5_verify_latency_ms_1k_prefix"]["rows"]
    anchor = table5_rows["Blackwell (RTX PRO 6000 Server), Qwen3-8B"][0]
    rows = {int(k[2:]): [anchor, round(anchor * (1 + float(v.strip("+%")) / 100), 4)]
            for k, v in f["verify_cost_at_W64_over_W1"].items()}
    notes = ("Dense batched prototype. The paper gives only the verify cost at W=64 per request "
             "over W=1 (+10%/+79%/+237% at B=1/8/32; W read as packed tokens per request) and "
             f"the drafter forward (3.2 ms at B=1, 19.3 ms at B=32). Each batch row is anchored "
             f"at Table 5's batch-1 n=1 latency ({anchor} ms): ratios within a row are the "
             "paper's, absolute values for B > 1 are NOT measured. Prefix length not stated; "
             "stored as 1024.")
    return {_name("Blackwell", "Qwen3-8B", "appendix-f"): _paper(
        "Blackwell", "Qwen3-8B", [1, 64], {1024: dict(sorted(rows.items()))}, "Appendix F", notes,
        device="Blackwell (RTX PRO 6000 Server)", fit_range=(1, 64),
        drafter_ms={int(k[2:]): v for k, v in f["drafter_forward_ms"].items()})}


def generate(tables: dict) -> dict[str, WidthProfile]:
    """File name -> reference profile, for every table."""
    return {**table5(tables), **table6(tables), **table11(tables), **appendix_f(tables)}


def _name(gpu: str, target: str, source: str) -> str:
    return f"{SKU[gpu]}__{target.lower()}__{source}.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=Path, default=DEFAULT_TABLES,
                        help="path of cast_paper_tables.json (default: ../shared/data/)")
    parser.add_argument("--out", type=Path, default=REFERENCE_DIR,
                        help="output folder (default: cast_trtllm/profiles/reference/)")
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if the committed files differ from the output")
    args = parser.parse_args(argv)
    profiles = generate(json.loads(args.tables.read_text()))
    if not args.check:
        args.out.mkdir(parents=True, exist_ok=True)
        for name, profile in profiles.items():
            save_profile(profile, args.out / name)
        print(f"wrote {len(profiles)} reference profiles to {args.out}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, profile in profiles.items():
            save_profile(profile, Path(tmp) / name)
        stale = [name for name in profiles if not (args.out / name).exists()
                 or (args.out / name).read_text() != (Path(tmp) / name).read_text()]
    extra = sorted({p.name for p in args.out.glob("*.json")} - set(profiles))
    for name in stale:
        print(f"stale or missing: {name}")
    for name in extra:
        print(f"not generated by this script: {name}")
    return 1 if stale or extra else 0

if __name__ == "__main__":
    sys.exit(main())
