"""`cast-trtllm build`: export the SKU's graphs and build its engines."""

from __future__ import annotations

import json
from pathlib import Path

import click

from engine_builder.build import MANIFEST_NAME, VERIFY_FILES, build as run_build
from engine_builder.skus import list_skus


@click.command()
@click.option("--sku", required=True, help=f"GPU SKU spec: one of {', '.join(list_skus())}, or a spec .yaml path.")
@click.option("--target", default="embedded", show_default=True,
              help="Target model: embedded (SmolLM2-135M-Instruct) | an HF model directory | a .gguf file.")
@click.option("--drafter", default="default", show_default=True,
              help="DFlash drafter: default (the head shipped for the embedded target) | a z-lab DFlash "
                   "checkpoint directory | none (no draft graphs: the directory runs AR only).")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Output directory for the ONNX files, plugin PTX, manifest and engines.")
@click.option("--num-layers", type=click.IntRange(min=1), default=None,
              help="Export only the first K target layers (smoke builds; its logits are not the full model's).")
@click.option("--flavour", type=click.Choice(["both", *VERIFY_FILES]), default="both", show_default=True,
              help="Verify-graph attention: standard ONNX ops (onnxruntime), the cast::tree_attention node "
                   "(TensorRT), or both.")
@click.option("--onnx-only", is_flag=True, help="Stop after the ONNX files and manifest; do not try TensorRT.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON instead of a summary.")
def build(sku: str, target: str, drafter: str, out: Path, num_layers: int | None, flavour: str,
          onnx_only: bool, as_json: bool) -> None:
    """Export the verify graph (one optimization profile per width bucket), the DFlash draft
    graphs and the plugin PTX for SKU, write a build manifest, and build TensorRT engines
    where TensorRT is importable. Without TensorRT a GPU SKU exits 1 with the reason (after
    writing the files); the CPU SKU exits 0: its graphs are what `--engine DIR` runs, and
    the TensorRT step is for GPU SKUs."""
    flavours = tuple(VERIFY_FILES) if flavour == "both" else (flavour,)
    try:
        manifest = run_build(sku, target, out, drafter, num_layers, flavours,
                             progress=lambda msg: click.echo(f"[build] {msg}", err=True), try_engines=not onnx_only)
    except ValueError as err:
        raise click.ClickException(str(err)) from err
    if as_json:
        click.echo(json.dumps(manifest, indent=2))
    else:
        click.echo(f"{'file':<28} {'bytes':>14}")
        for record in manifest["graphs"].values():
            click.echo(f"{record['file']:<28} {record['bytes']:>14,}")
        for record in manifest["plugin"]["ptx"] + manifest["engines"]:
            click.echo(f"{record['file']:<28}")
        buckets = [p["bucket"] for p in manifest["optimization_profiles"]["verify"]]
        click.echo(f"buckets (one optimization profile each): {buckets}")
        click.echo(f"manifest: {out / MANIFEST_NAME}")
    if not manifest["engines"] and not onnx_only and manifest["sku"]["compute_capability"] is not None:
        raise click.ClickException(manifest["tensorrt"])
    click.echo(manifest["tensorrt"], err=True)
