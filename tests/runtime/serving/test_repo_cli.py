"""`cast-trtllm triton-repo` writes the serving settings a user asked for."""

from __future__ import annotations

from click.testing import CliRunner

from runtime.serving.cli import triton_repo


def _write_options(path, body: str):
    path.write_text(body)
    return str(path)


def test_llm_api_options_set_the_drafter_and_profile_as_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "head").mkdir()
    (tmp_path / "profile.json").write_text("{}")
    options = _write_options(tmp_path / "opts.yaml", (
        "speculative_config:\n  decoding_type: CAST\n  max_draft_len: 7\n"
        "  speculative_model: head\n  budget: auto\n  width_profile: profile.json\n"))
    result = CliRunner().invoke(triton_repo, ["--out", "repo", "--extra-llm-api-options", options])
    assert result.exit_code == 0, result.output
    config = (tmp_path / "repo" / "ensemble" / "config.pbtxt").read_text()
    assert f'"{tmp_path / "head"}"' in config and f'"{tmp_path / "profile.json"}"' in config


def test_bad_llm_api_options_name_the_field(tmp_path):
    options = _write_options(tmp_path / "bad.yaml", "speculative_config:\n  decoding_type: Foo\n  max_draft_len: 7\n")
    result = CliRunner().invoke(triton_repo, ["--out", str(tmp_path / "repo"), "--extra-llm-api-options", options])
    assert result.exit_code == 2 and "speculative_config.decoding_type" in result.output
    assert not (tmp_path / "repo").exists()


def test_instance_group_flags_reach_config_pbtxt_and_bad_ones_are_refused(tmp_path):
    args = ["--out", str(tmp_path / "repo"), "--instances", "2", "--kind", "gpu", "--gpus", "0,1"]
    assert CliRunner().invoke(triton_repo, args).exit_code == 0
    config = (tmp_path / "repo" / "ensemble" / "config.pbtxt").read_text()
    assert "count: 2\n    kind: KIND_GPU\n    gpus: [ 0, 1 ]" in config
    result = CliRunner().invoke(triton_repo, ["--out", str(tmp_path / "bad"), "--gpus", "0"])
    assert result.exit_code == 2 and "a GPU list needs instance kind 'gpu'" in result.output
