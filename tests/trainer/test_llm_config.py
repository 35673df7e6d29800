"""Config parsing of `dfpo train`: strict keys, typed values, --set, and a TOML round trip."""

import re
import tomllib

import pytest

from dfpo.trainer.config import Config, apply_overrides, config_from_dict, config_to_toml, load_config


def test_defaults_validate():
    cfg = config_from_dict({})
    assert cfg == Config()


def test_unknown_key_names_key_and_valid_keys():
    with pytest.raises(ValueError, match=r"unknown config key optim\.lrr.*valid keys of \[optim\].*\blr\b"):
        config_from_dict({"optim": {"lrr": 1e-4}})
    with pytest.raises(ValueError, match="unknown config key 'bogus'"):
        config_from_dict({"bogus": 1})


@pytest.mark.parametrize(
    "raw, pattern",
    [
        ({"optim": {"lr": "fast"}}, r"optim\.lr must be of type float"),
        ({"optim": {"lr": -1.0}}, r"optim\.lr must be > 0"),
        ({"rollout": {"group_size": 1}}, r"rollout\.group_size must be >= 2"),
        ({"objective": {"name": "ppo2"}}, r"objective\.name: unknown objective='ppo2'; known: grpo"),
        ({"objective": {"overrides": {"eps_hgh": 0.3}}}, r"objective\.overrides.*eps_hgh"),
        ({"rollout": {"prompts_per_step": 6}, "optim": {"minibatch_groups": 4}}, r"minibatch_groups=4 must divide"),
        ({"optim": {"minibatch_groups": 4, "microbatch_groups": 3}}, r"microbatch_groups=3 must divide"),
        ({"data": {"task": "jsonl"}}, r"needs data\.path"),
        ({"device": "tpu"}, r"device must be one of"),
        ({"optim": {"warmup_ratio": 1.5}}, r"warmup_ratio must be in"),
        ({"reward": {"kind": "user"}}, r"module:function"),
    ],
)
def test_invalid_values_say_what_to_change(raw, pattern):
    with pytest.raises(ValueError, match=pattern):
        config_from_dict(raw)


def test_set_overrides_parse_toml_values_and_bare_words():
    raw = apply_overrides({}, ["optim.lr=3e-4", "objective.name=gspo", "objective.overrides.eps_high=0.3", "log.progress=false"])
    cfg = config_from_dict(raw)
    assert cfg.optim.lr == 3e-4
    assert cfg.objective.name == "gspo"
    assert cfg.objective.overrides == {"eps_high": 0.3}
    assert cfg.log.progress is False


def test_int_is_accepted_for_float_and_bool_is_not_int():
    assert config_from_dict({"optim": {"lr": 1}}).optim.lr == 1.0
    with pytest.raises(ValueError, match="train.steps must be an integer"):
        config_from_dict({"train": {"steps": True}})


def test_resolved_config_round_trips_through_toml(tmp_path):
    cfg = config_from_dict(apply_overrides({}, ["objective.overrides.eps_low=0.1", 'data.prompt_template="Q: {prompt}\\nA:"']))
    text = config_to_toml(cfg)
    assert config_from_dict(tomllib.loads(text)) == cfg
    path = tmp_path / "c.toml"
    path.write_text(text)
    assert load_config(path) == cfg


def test_shipped_configs_parse():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "configs"
    files = sorted(root.glob("*.toml"))
    assert files, "no configs shipped"
    for f in files:
        load_config(f)


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("model.sft_batch_size=0", "model.sft_batch_size must be >= 1, got 0"),
        ("model.tiny_hidden=0", "model.tiny_hidden must be in [1, 4096], got 0"),
        ("data.train_size=0", "data.train_size must be >= 1, got 0"),
        ("objective.overrides.adv_eps=-1", "adv_eps must be >= 0, got -1.0"),
        ("model.sft_lr=-1", "model.sft_lr must be > 0, got -1.0"),
        ("optim.beta1=2.0", "optim.beta1 must be in [0, 1), got 2.0"),
        ("rollout.top_p=0", "rollout.top_p must be in (0, 1], got 0.0"),
        ("rollout.group_size=1", "rollout.group_size must be >= 2, got 1"),
        ("model.lora_dropout=1.0", "model.lora_dropout must be in [0, 1), got 1.0"),
        ("device=tpu", "device must be one of auto, cpu, cuda; got 'tpu'"),
        ("seed=-3", "seed must be in [0, 4294967295], got -3"),
    ],
)
def test_every_numeric_key_is_bounded_in_validation_naming_the_key(assignment, message):
    from dfpo.trainer.config import load_config

    with pytest.raises(ValueError) as err:
        load_config("configs/tiny-cpu.toml", [assignment])
    assert message in str(err.value)


def test_every_numeric_and_choice_field_declares_its_bounds_with_its_definition():
    """A new numeric key cannot be added without bounds: validation reads them from the field's Setting."""
    import dataclasses
    import typing

    from dfpo.core.settings import setting_of
    from dfpo.trainer import config as C

    for section in [C.Config, *(t for t in typing.get_type_hints(C.Config).values() if dataclasses.is_dataclass(t))]:
        hints = typing.get_type_hints(section)
        for f in dataclasses.fields(section):
            info = setting_of(f)
            assert info is not None and info.doc.strip(), f"{section.__name__}.{f.name} is not declared with setting(...)"
            if hints[f.name] in (int, float):
                assert info.bounds is not None, f"{section.__name__}.{f.name} has no bounds"
                assert info.bounds.contains(f.default), f"{section.__name__}.{f.name}: default {f.default} outside its bounds"


def test_the_advantage_estimator_is_set_in_one_place():
    """objective.advantage_scale is gone: an old config is refused with where the setting lives now,
    and objective.overrides.adv_scale is what the trainer passes to group_advantages."""
    with pytest.raises(ValueError, match="objective.advantage_scale is no longer read: .*objective.overrides.adv_scale"):
        config_from_dict({"objective": {"advantage_scale": "batch"}})
    cfg = config_from_dict({"objective": {"name": "grpo", "overrides": {"adv_scale": "rloo"}}})
    from dfpo import resolve_objective

    assert resolve_objective(cfg.objective.name, **cfg.objective.overrides).adv_scale == "rloo"
    with pytest.raises(ValueError, match="adv_scale must be one of"):
        config_from_dict({"objective": {"name": "grpo", "overrides": {"adv_scale": "auto"}}})


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("optim.lr=fast", "optim.lr takes a float value, got optim.lr='fast'"),
        ("train.steps=2.5", "train.steps takes an int value, got train.steps='2.5'"),
        ("log.progress=maybe", "log.progress takes a bool value (true or false), got log.progress='maybe'"),
        ("objective.overrides.eps_low=wide", "objective.overrides.eps_low takes a float value, got objective.overrides.eps_low='wide'"),
    ],
)
def test_a_set_value_of_the_wrong_type_names_the_key_and_the_value(assignment, message):
    """--set parses with dfpo.core.settings.parse_value into the key's declared type (an objective override
    into its ObjectiveSpec field's type)."""
    with pytest.raises(ValueError) as err:
        apply_overrides({}, [assignment])
    assert message in str(err.value)


def test_set_keeps_every_toml_form_it_took_before():
    """Numbers as TOML writes them, quoted strings with escapes, arrays, inline tables, bare words; None for
    an optional objective override; an unknown key is parsed untyped and then refused by name."""
    raw = apply_overrides(
        {},
        [
            "train.steps=0x10",
            "optim.lr=1",
            "optim.weight_decay=1_0e-2",
            "log.energy_buckets=[0.3, 0.9]",
            "objective.overrides={eps_high = 0.28}",
            "objective.overrides.max_completion_length=none",
            "objective.name='gspo'",
            "log.tensorboard=false",
        ],
    )
    cfg = config_from_dict(raw)
    assert cfg.train.steps == 16 and cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.optim.weight_decay == 0.1 and cfg.log.energy_buckets == [0.3, 0.9] and cfg.log.tensorboard is False
    assert cfg.objective.overrides == {"eps_high": 0.28, "max_completion_length": None} and cfg.objective.name == "gspo"
    with pytest.raises(ValueError, match=r"unknown config key optim\.lrr"):
        config_from_dict(apply_overrides({}, ["optim.lrr=1e-4"]))


def test_a_config_file_with_a_byte_order_mark_reads_as_without_it(tmp_path):
    """Windows editors may start a UTF-8 file with U+FEFF, which TOML does not allow: it used to say 'Invalid statement'."""
    path = tmp_path / "c.toml"
    path.write_text("\ufeffseed = 3\n[optim]\nlr = 0.001\n", encoding="utf-8")
    assert load_config(path) == config_from_dict({"seed": 3, "optim": {"lr": 0.001}})


def test_a_directory_or_a_fifo_given_as_config_is_named_as_such(tmp_path):
    """Both used to say 'no such file'."""
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=rf"^--config '{tmp_path}' is a directory, expected a file$"):
        load_config(tmp_path)
    with pytest.raises(ValueError, match=rf"^--config '{fifo}' is not a regular file"):
        load_config(fifo)
    with pytest.raises(ValueError, match=rf"^--config '{tmp_path / 'none.toml'}': no such file$"):
        load_config(tmp_path / "none.toml")


@pytest.mark.parametrize("key", ["rollout.temperature", "eval.temperature"])
def test_a_temperature_that_overflows_the_logits_is_refused_naming_the_key(key):
    """1e-300 passed validation and then divided the logits into inf and NaN inside sampling (a traceback)."""
    for value in ("1e-300", "5e-324", "0.001"):
        with pytest.raises(ValueError, match=rf"^{key} must be >= 0.01, got {float(value)!r}$"):
            load_config(None, [f"{key}={value}"])
    assert getattr(load_config(None, [f"{key}=0.01"]), key.split(".")[0]).temperature == 0.01


@pytest.mark.parametrize(
    "key, value, bound",
    [("model.tiny_hidden", 10_000_000, 4096), ("model.tiny_intermediate", 10**9, 16384), ("model.tiny_layers", 1000, 64)],
)
def test_the_tiny_presets_dimensions_are_bounded(key, value, bound):
    """A 'tiny' model with a hidden size of ten million used to pass validation and then grow memory with no message."""
    with pytest.raises(ValueError, match=rf"^{key} must be in \[1, {bound}\], got {value}$"):
        load_config(None, [f"{key}={value}"])


@pytest.mark.parametrize(
    "assignment, where",
    [
        ("rollout.correction=token_truncate", "objective.overrides.rollout_correction"),
        ("rollout.correction_low=0.4", "objective.overrides.rollout_low"),
        ("rollout.correction_cap=3", "objective.overrides.rollout_cap"),
        ("objective.advantage_eps=0.01", "objective.overrides.adv_eps"),
    ],
)
def test_a_setting_has_one_key_and_its_old_key_says_where_it_moved(assignment, where):
    """The rollout correction and the std's epsilon are components of the objective: one key each, in
    objective.overrides (two keys for one setting could disagree); the old key names the new one."""
    from dfpo.trainer.config import load_config

    with pytest.raises(ValueError, match=rf"{re.escape(assignment.split('=')[0])} is no longer read: .*{re.escape(where)}"):
        load_config(None, [assignment])


def test_the_objective_carries_the_advantage_epsilon_the_trainer_uses(tmp_path):
    from dfpo.trainer.config import load_config
    from dfpo.trainer.train import objective_spec

    assert objective_spec(load_config(None, ["objective.overrides.adv_eps=0.01"])).adv_eps == 0.01
    assert objective_spec(load_config(None, [])).adv_eps == 1e-4  # TRL's and DeepSeekMath's
