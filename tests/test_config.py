"""model-config.json validation: every error names the field, the value and
what was expected; the CLI exits non-zero with that message."""

import copy
import json

import pytest

from colibri_build import config
from colibri_build.errors import ConfigError
from conftest import run_cli


@pytest.fixture
def valid(tiny_config):
    data = copy.deepcopy(tiny_config)
    return data


def test_synth_config_is_valid_and_defaults_fill_in(valid):
    del valid["head_dim"], valid["batch_slots"]
    out = config.validate(valid)
    assert out["head_dim"] == valid["hidden_size"] // valid["heads"]
    assert out["batch_slots"] == 8


@pytest.mark.parametrize("field, value, expected", [
    ("top_k", "two", "expected a value of type integer"),
    ("experts", 0, "expected >= 1"),
    ("architecture", "llama", 'expected one of "mixtral"'),
    ("hidden_size", 100, "expected a multiple of 8"),
    ("norm_eps", 0, "expected > 0"),
    ("name", "bad name!", "expected a string matching"),
])
def test_field_errors_name_field_value_and_expectation(valid, field, value, expected):
    valid[field] = value
    with pytest.raises(ConfigError) as err:
        config.validate(valid)
    text = str(err.value)
    assert f"field '{field}'" in text
    assert json.dumps(value) in text
    assert expected in text


def test_nested_field_path(valid):
    valid["weights"]["dtype"] = "int3"
    with pytest.raises(ConfigError, match=r"field 'weights.dtype': got \"int3\", expected one of"):
        config.validate(valid)


def test_missing_and_unknown_fields(valid):
    del valid["layers"]
    valid["layerz"] = 2
    with pytest.raises(ConfigError) as err:
        config.validate(valid)
    assert "missing field 'layers'" in str(err.value)
    assert "unknown field 'layerz'" in str(err.value)


@pytest.mark.parametrize("change, message", [
    ({"top_k": 9}, "field 'top_k': got 9, expected <= experts (8)"),
    ({"kv_heads": 3}, "field 'kv_heads': got 3, expected a divisor of heads (4)"),
    ({"vocab_size": 257}, "field 'tokenizer.chat_roles.system': got 258, expected < vocab_size (257)"),
])
def test_cross_field_rules(valid, change, message):
    valid.update(change)
    with pytest.raises(ConfigError) as err:
        config.validate(valid)
    assert message in str(err.value)


def test_cli_reports_invalid_config_with_nonzero_exit(tmp_path, valid):
    valid["top_k"] = -1
    path = tmp_path / "model-config.json"
    path.write_text(json.dumps(valid))
    done = run_cli("--model", path, "--target", "native", check=False)
    assert done.returncode == 2
    assert "field 'top_k': got -1, expected >= 1" in done.stderr
    assert str(path) in done.stderr


def test_cli_reports_broken_json_and_missing_file(tmp_path):
    bad = tmp_path / "model-config.json"
    bad.write_text('{"name": "x",')
    done = run_cli("--model", bad, check=False)
    assert done.returncode == 2 and "not valid JSON" in done.stderr and "line 1" in done.stderr
    done = run_cli("--model", tmp_path / "nope" / "model-config.json", check=False)
    assert done.returncode == 2 and "no such file" in done.stderr


def test_canonical_hash_ignores_formatting(tmp_path, valid):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(valid))
    b.write_text(json.dumps(valid, indent=4, sort_keys=True))
    assert config.load(a).canonical_hash() == config.load(b).canonical_hash()
    valid["batch_slots"] = 4
    b.write_text(json.dumps(valid))
    assert config.load(a).canonical_hash() != config.load(b).canonical_hash()
