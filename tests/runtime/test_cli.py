"""`cast-trtllm generate`: output, --json, and a click error (no traceback) per bad input."""

import json

import pytest
import torch
from click.testing import CliRunner

from cast_trtllm.cli import main
from runtime.drafter import random_drafter, save_drafter
from runtime.drafter.config import WEIGHTS_NAME

from tests.runtime.doubles import tiny_target


@pytest.fixture(scope="session")
def exec_cache(tmp_path_factory):
    """One cache of the measured execution choice for the whole session (measured once)."""
    return tmp_path_factory.mktemp("cast-cache")


@pytest.fixture
def run(embedded_checkpoint, exec_cache, monkeypatch):
    """Invoke the CLI in-process; the one loader reuses the session's already-read checkpoint."""
    import torch

    import runtime.loader
    from runtime.loader import models_from_hf

    monkeypatch.setenv("CAST_CACHE_DIR", str(exec_cache))
    monkeypatch.setattr(runtime.loader, "load_models",
                        lambda target, drafter, device, dtype: models_from_hf(embedded_checkpoint, drafter))

    def invoke(*args):
        threads = torch.get_num_threads()
        try:
            return CliRunner().invoke(main, ["generate", *args])
        finally:
            torch.set_num_threads(threads)  # the CLI applies the measured thread count

    return invoke


def test_a_measured_bf16_pick_runs_on_a_converted_copy_and_leaves_the_loaded_model_fp32(
        run, embedded_checkpoint, tmp_path, monkeypatch):
    """The first-use probe may pick torch bf16 (it did, by a hair, in one CI run); the loaded fp32
    model must not be rounded in place. The probe's answer is set here so the branch always runs."""
    from runtime.engine import autoconfig

    def picks_bf16(model, device, device_name, key, taps=(), progress=print):
        return autoconfig.ExecChoice("torch", "bfloat16", 1, {}, device_name, key)

    monkeypatch.setenv("CAST_CACHE_DIR", str(tmp_path))  # nothing cached: the probe runs
    monkeypatch.setattr(autoconfig, "measure", picks_bf16)
    result = run("--prompt", "Hi", "--max-new-tokens", "2", "--method", "ar")
    assert result.exit_code == 0, result.output
    assert "torch bfloat16" in result.output
    assert all(p.dtype == torch.float32 for p in embedded_checkpoint.model.parameters())


def test_main_job_command_prints_text_and_summary(run):
    result = run("--prompt", "What is the capital of France?", "--max-new-tokens", "6")
    assert result.exit_code == 0, result.output
    from runtime.drafter import DEFAULT_DRAFTER

    assert (DEFAULT_DRAFTER / "config.json").is_file()
    assert any(f"execution: {backend}" in result.stderr for backend in ("torch", "onnxruntime"))
    for label in ("rounds", "mean committed length R", "decode ms/token", "tokens/s"):
        assert label in result.output


@pytest.mark.parametrize("method", ["ar", "chain", "cast"])
def test_json_output_has_the_documented_keys(run, method):
    result = run("--prompt", "Count: 1, 2, 3,", "--no-chat", "--method", method, "--max-new-tokens", "5", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output.strip().splitlines()[-1])
    for key in ("method", "text", "token_ids", "num_rounds", "accept_lengths", "mean_accept_length",
                "decode_ms_per_token"):
        assert key in payload
    assert payload["method"] == method and len(payload["token_ids"]) == 5


def test_sampled_generation_is_reproducible_with_a_seed(run):
    # a fixed budget: auto's widths follow measured timings, so its trees (and the stream they draw) may vary
    args = ("--prompt", "Tell me a joke.", "--temperature", "0.8", "--top-k", "20", "--top-p", "0.9",
            "--seed", "3", "--max-new-tokens", "6", "--budget", "7", "--json")
    first, second = run(*args), run(*args)
    assert first.exit_code == 0, first.output
    assert json.loads(first.output.splitlines()[-1])["token_ids"] == json.loads(second.output.splitlines()[-1])["token_ids"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", ""], "the prompt is empty"),
        (["--prompt", "   "], "the prompt is empty"),
        (["--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens"),
        (["--prompt", "hi", "--temperature", "-0.5"], "--temperature"),
        (["--prompt", "hi", "--top-p", "0"], "--top-p"),
        (["--prompt", "hi", "--top-p", "1.5"], "--top-p"),
        (["--prompt", "hi", "--top-k", "-1"], "--top-k"),
        (["--prompt", "hi", "--budget", "-1"], "budget must be 'auto' or an integer >= 0"),
        (["--prompt", "hi", "--budget", "wide"], "budget must be 'auto' or an integer >= 0"),
        (["--prompt", "hi", "--method", "beam"], "--method"),
    ],
)
def test_bad_arguments_are_click_errors_before_loading(args, message):
    result = CliRunner().invoke(main, ["generate", *args])
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output


def test_prompt_longer_than_the_context_window_is_rejected(run):
    result = run("--prompt", "word " * 9000, "--no-chat", "--dtype", "float32")
    assert result.exit_code == 1 and "context window holds 8192" in result.output


def test_budget_auto_with_an_unreadable_profile_names_it(run, tmp_path):
    bad = tmp_path / "profile.json"
    bad.write_text("{not json")
    result = run("--prompt", "hi", "--budget", "auto", "--profile", str(bad), "--dtype", "float32")
    assert result.exit_code == 1 and "profile.json" in result.output and "Traceback" not in result.output


def test_budget_beyond_what_the_drafter_offers_is_refused_with_a_message(run):
    result = run("--prompt", "hi", "--budget", "100000", "--dtype", "float32")
    assert result.exit_code == 1 and "budget 100000 exceeds the 120 nodes the drafter can offer" in result.output
    assert "Traceback" not in result.output


def test_budget_auto_uses_the_shipped_measured_cpu_profile():
    from cast_trtllm.profile import find_measured_profile, load_profile
    from runtime.loader import MODEL_NAME

    path = find_measured_profile(MODEL_NAME, "float32", "cpu")
    assert path is not None and load_profile(path).provenance.source == "measured"
    assert find_measured_profile(MODEL_NAME, "float32", "cuda") is None  # a CPU curve never stands in for a GPU


def test_drafter_problems_are_named(run, tmp_path):
    missing = run("--prompt", "hi", "--drafter", str(tmp_path / "absent"), "--dtype", "float32")
    assert missing.exit_code == 1 and "is not a directory" in missing.output
    save_drafter(random_drafter(tiny_target()[1].config), tmp_path / "tiny")  # made for another target
    mismatch = run("--prompt", "hi", "--drafter", str(tmp_path / "tiny"), "--dtype", "float32")
    assert mismatch.exit_code == 1 and "vocab_size 64 != target vocab_size 49152" in mismatch.output
    assert "hidden_size 64 != target hidden_size 576" in mismatch.output
    save_drafter(random_drafter(_embedded_cfg()), tmp_path / "good")
    (tmp_path / "good" / WEIGHTS_NAME).write_bytes(b"junk")
    corrupt = run("--prompt", "hi", "--drafter", str(tmp_path / "good"), "--dtype", "float32")
    assert corrupt.exit_code == 1 and "corrupt or unreadable" in corrupt.output
    assert all("Traceback" not in r.output for r in (missing, mismatch, corrupt))


def _embedded_cfg():
    from runtime.model.llama import TargetConfig

    return TargetConfig(vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                        intermediate_size=1536, rms_norm_eps=1e-5, context_window=8192, rope_theta=100_000.0)


def test_help_documents_every_flag():
    text = CliRunner().invoke(main, ["generate", "--help"]).output
    for flag in ("--prompt", "--method", "--budget", "--max-new-tokens", "--temperature", "--top-k", "--top-p",
                 "--seed", "--drafter", "--json", "--threads", "--chat / --no-chat", "--stop", "--device", "--dtype", "--profile",
                 "--target", "--rank-cap", "--extra-llm-api-options", "--ignore-eos"):
        assert flag in text, flag


@pytest.mark.parametrize("pinned", [("--dtype", "float32"), ()], ids=["torch-fp32", "default-execution"])
def test_trtllm_dflash_yaml_with_every_field_runs_generate_as_the_chain(run, tmp_path, pinned):
    """Every field of TensorRT-LLM's DFlashDecodingConfig (and DecodingBaseConfig), on the pinned
    fp32 reference and on whatever autoconfig picks (onnxruntime here: the YAML's drafter check
    once crashed there, reading an attribute only the torch executor had)."""
    import yaml

    from runtime.drafter import DEFAULT_DRAFTER
    from runtime.drafter.config import DrafterConfig

    cfg = DrafterConfig.load(DEFAULT_DRAFTER)
    block = {"decoding_type": "DFlash", "max_draft_len": 15, "max_total_draft_tokens": 15,
             "speculative_model": str(DEFAULT_DRAFTER), "mask_token_id": cfg.mask_token_id,
             "target_layer_ids": list(cfg.target_layer_ids), "max_concurrency": 32, "draft_len_schedule": {1: 15},
             "load_format": "auto", "acceptance_rate_window_size": 8, "acceptance_rate_threshold": 0.1,
             "use_rejection_sampling": False, "allow_advanced_sampling": False, "advanced_sampling_mode": "full",
             "enable_penalty": False, "attention_backend": "VANILLA"}
    path = tmp_path / "dflash.yaml"
    path.write_text(yaml.safe_dump({"speculative_config": block}))
    result = run("--prompt", "Count: 1, 2, 3,", "--no-chat", "--max-new-tokens", "4", "--json", *pinned,
                 "--extra-llm-api-options", str(path))
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["method"] == "chain"
    notes = [line.removeprefix("[extra-llm-api-options] ") for line in result.stderr.splitlines()]
    for field in block:  # one line each on stderr: how it maps, or why it is ignored
        assert any(note.startswith(field) for note in notes), field


def test_the_first_use_probe_never_rounds_the_model_it_times():
    """Timing a bf16 candidate must not leave the fp32 model bf16-rounded (a round trip would)."""
    import torch

    from runtime.engine.autoconfig import measure

    _, model = tiny_target()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    choice = measure(model, torch.device("cpu"), "cpu (test)", "k")
    assert choice.backend in ("torch", "onnxruntime") and len(choice.measured_ms) >= 4
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.lm_head.weight.dtype == torch.float32
