"""`cast-trtllm generate`: output, --json, and a click error (no traceback) per bad input."""

import json

import pytest
from click.testing import CliRunner

from cast_trtllm.cli import main
from runtime.drafter import random_drafter, save_drafter
from runtime.drafter.config import WEIGHTS_NAME

from tests.runtime.doubles import tiny_target


@pytest.fixture
def run(embedded, monkeypatch):
    """Invoke the CLI in-process on the session's already-loaded embedded target."""
    import runtime.embedded

    monkeypatch.setattr(runtime.embedded, "load_embedded", lambda device, dtype: embedded)

    def invoke(*args):
        return CliRunner().invoke(main, ["generate", *args])

    return invoke


def test_main_job_command_prints_text_and_summary(run):
    result = run("--prompt", "What is the capital of France?", "--max-new-tokens", "6")
    assert result.exit_code == 0, result.output
    from runtime.drafter import DEFAULT_DRAFTER

    shipped = (DEFAULT_DRAFTER / "config.json").is_file()
    assert ("random DFlash head" in result.stderr) != shipped  # warns only without a shipped head
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
    args = ("--prompt", "Tell me a joke.", "--temperature", "0.8", "--top-k", "20", "--top-p", "0.9",
            "--seed", "3", "--max-new-tokens", "6", "--json")
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
        (["--prompt", "hi", "--budget", "0"], "budget must be >= 1"),
        (["--prompt", "hi", "--budget", "wide"], "neither an integer nor 'auto'"),
        (["--prompt", "hi", "--method", "beam"], "--method"),
    ],
)
def test_bad_arguments_are_click_errors_before_loading(args, message):
    result = CliRunner().invoke(main, ["generate", *args])
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output


def test_prompt_longer_than_the_context_window_is_rejected(run):
    result = run("--prompt", "word " * 9000, "--no-chat")
    assert result.exit_code == 2 and "context window holds 8192" in result.output


def test_budget_auto_with_an_unreadable_profile_names_it(run, tmp_path):
    bad = tmp_path / "profile.json"
    bad.write_text("{not json")
    result = run("--prompt", "hi", "--budget", "auto", "--profile", str(bad))
    assert result.exit_code == 2 and "--profile" in result.output and "Traceback" not in result.output


def test_budget_auto_uses_the_shipped_measured_cpu_profile():
    from cast_trtllm.profile import find_measured_profile, load_profile
    from runtime.embedded import MODEL_NAME

    path = find_measured_profile(MODEL_NAME, "float32", "cpu")
    assert path is not None and load_profile(path).provenance.source == "measured"
    assert find_measured_profile(MODEL_NAME, "float32", "cuda") is None  # a CPU curve never stands in for a GPU


def test_drafter_problems_are_named(run, tmp_path):
    missing = run("--prompt", "hi", "--drafter", str(tmp_path / "absent"))
    assert missing.exit_code == 2 and "does not exist" in missing.output
    save_drafter(random_drafter(tiny_target()[1].config), tmp_path / "tiny")  # made for another target
    mismatch = run("--prompt", "hi", "--drafter", str(tmp_path / "tiny"))
    assert mismatch.exit_code == 2 and "vocab_size 64 != target vocab_size 49152" in mismatch.output
    assert "hidden_size 64 != target hidden_size 576" in mismatch.output
    save_drafter(random_drafter(_embedded_cfg()), tmp_path / "good")
    (tmp_path / "good" / WEIGHTS_NAME).write_bytes(b"junk")
    corrupt = run("--prompt", "hi", "--drafter", str(tmp_path / "good"))
    assert corrupt.exit_code == 2 and "corrupt or unreadable" in corrupt.output
    assert all("Traceback" not in r.output for r in (missing, mismatch, corrupt))


def _embedded_cfg():
    from runtime.model.llama import TargetConfig

    return TargetConfig(vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                        intermediate_size=1536, rms_norm_eps=1e-5, context_window=8192)


def test_help_documents_every_flag():
    text = CliRunner().invoke(main, ["generate", "--help"]).output
    for flag in ("--prompt", "--method", "--budget", "--max-new-tokens", "--temperature", "--top-k", "--top-p",
                 "--seed", "--drafter", "--json", "--threads", "--chat / --no-chat", "--stop", "--device", "--dtype", "--profile"):
        assert flag in text, flag
