"""dfpo.core.settings: one declaration per config field (default, meaning, bounds or choices), one parser from
command-line text, one bounds check, one generated reference, shared by the trainer, the toy and the objective
overrides."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest

from dfpo.commands import config_reference
from dfpo.core.loss import parse_objective_label, resolve_objective
from dfpo.core.loss.spec import COMPONENT_FIELDS, SPEC_FIELDS, ObjectiveSpec
from dfpo.core.settings import (
    Bounds,
    check_bounds,
    check_fields,
    field_doc,
    parse_value,
    setting,
    setting_of,
    type_hints,
)
from dfpo.toy.config import ToyConfig, check_config
from dfpo.trainer.config import Config, apply_overrides, config_from_dict, load_config

ROOT = Path(__file__).resolve().parents[2]


def trainer_sections() -> list[tuple[str, type]]:
    """(key prefix, dataclass) of the trainer's top level and each of its sections."""
    hints = type_hints(Config)
    return [("", Config)] + [(name + ".", tp) for name, tp in hints.items() if dataclasses.is_dataclass(tp)]


def every_key() -> list[tuple[str, str]]:
    """(key as the reference writes it, its meaning) of every field of every config."""
    keys = [(prefix + f.name, field_doc(cls, f.name)) for prefix, cls in trainer_sections() for f in dataclasses.fields(cls)]
    keys = [(k, d) for k, d in keys if not dataclasses.is_dataclass(type_hints(Config).get(k))]  # sections: own heading
    keys += [(f.name, field_doc(ToyConfig, f.name)) for f in dataclasses.fields(ToyConfig)]
    keys += [(name, SPEC_FIELDS[name].doc) for name in COMPONENT_FIELDS]
    return keys


@pytest.mark.parametrize("key, doc", every_key(), ids=lambda x: x if isinstance(x, str) and len(x) < 40 else "")
def test_every_field_of_every_config_has_a_meaning_and_the_reference_names_it(key, doc):
    assert doc.strip(), f"{key} has no doc"
    assert f"| `{key}` |" in config_reference()


def test_every_trainer_and_toy_field_is_declared_with_setting():
    for _, cls in [*trainer_sections(), ("", ToyConfig)]:
        for f in dataclasses.fields(cls):
            assert setting_of(f) is not None, f"{cls.__name__}.{f.name} is declared without setting(...)"


def test_every_trainer_section_has_a_heading_and_its_doc_in_the_reference():
    text = config_reference()
    for f in dataclasses.fields(Config):
        if dataclasses.is_dataclass(type_hints(Config)[f.name]):
            assert f"`[{f.name}]`" in text and setting_of(f).doc in text


def test_docs_config_md_holds_the_generated_reference():
    text = (ROOT / "docs" / "config.md").read_text()
    assert f"<!-- BEGIN generated:config -->\n{config_reference()}\n<!-- END generated:config -->" in text


@pytest.mark.parametrize(
    "text, type_, value",
    [
        ("true", bool, True),
        (" FALSE ", bool, False),
        ("True", bool, True),
        ("3", int, 3),
        ("1_000", int, 1000),
        ("0x10", int, 16),  # a TOML integer, as --set took it
        ("+3", int, 3),
        ("1e-4", float, 1e-4),
        ("3", float, 3.0),
        (".5", float, 0.5),
        ("inf", float, math.inf),
        ("gspo", str, "gspo"),
        ('"gspo"', str, "gspo"),
        ("'Q: {prompt}'", str, "Q: {prompt}"),
        ('"a\\nb"', str, "a\nb"),
        ("'a' b", str, "'a' b"),  # not one TOML string: the text as written
        ("[0.5, 0.8]", list, [0.5, 0.8]),
        ('["a", "b"]', tuple[str, ...], ("a", "b")),
        ("{eps_high = 0.28}", dict, {"eps_high": 0.28}),
        ("none", int | None, None),
        ("None", float | None, None),
        ("5", int | None, 5),
        ("true", object, True),
        ("4", object, 4),
        ("0.2", object, 0.2),
        ("distractors", object, "distractors"),
        ('"quoted"', object, "quoted"),
    ],
)
def test_one_grammar_for_every_declared_type(text, type_, value):
    parsed = parse_value("key", text, type_)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize(
    "text, type_, message",
    [
        ("yes", bool, "k takes a bool value (true or false), got k='yes'"),
        ("2.5", int, "k takes an int value, got k='2.5'"),
        ("true", int, "k takes an int value, got k='true'"),
        ("fast", float, "k takes a float value, got k='fast'"),
        ("0.5", list, "k takes a list value such as [0.5, 0.8], got k='0.5'"),
        ("x", int | None, "k takes an int or None value, got k='x'"),
    ],
)
def test_a_bad_text_names_the_key_and_the_text(text, type_, message):
    with pytest.raises(ValueError) as err:
        parse_value("k", text, type_)
    assert str(err.value) == message


def test_the_trainer_the_toy_and_objective_labels_parse_with_the_one_parser(tmp_path, capsys):
    """The same bad override fails with the same message, naming key and value, in all three places; the same good
    texts give the same values."""
    from dfpo.cli import main

    def message(key: str) -> str:
        with pytest.raises(ValueError) as err:
            parse_value(key, "wide", float)
        return str(err.value)

    with pytest.raises(ValueError) as trainer:
        apply_overrides({}, ["objective.overrides.eps_low=wide"])
    with pytest.raises(ValueError) as label:
        parse_objective_label("gspo:eps_low=wide")
    assert main(["toy", "run", "--override", "eps_low=wide", "--out", str(tmp_path / "run")]) == 2
    toy = capsys.readouterr().err
    assert str(trainer.value) == message("objective.overrides.eps_low")
    assert message("eps_low") in str(label.value) and message("eps_low") in toy
    for key, text in [("eps_low", "0.2"), ("max_completion_length", "none"), ("mask_renormalise", "True"), ("stopgrad", "score")]:
        want = parse_value(key, text, type_hints(ObjectiveSpec)[key])
        assert apply_overrides({}, [f"objective.overrides.{key}={text}"])["objective"]["overrides"][key] == want
        assert parse_objective_label(f"gspo:{key}={text}")[1][key] == want
        from dfpo.core.loss.objectives import parse_override
        from dfpo.toy.cli import _pairs

        assert _pairs([f"{key}={text}"], "--override", parse_override)[key] == want


def outside(bounds: Bounds) -> list[float]:
    """Values just outside ``bounds`` (numbers only)."""
    low, high = bounds.resolve()
    values = []
    if math.isfinite(low):
        values.append(low if bounds.low_open else low - 1)
    if math.isfinite(high):
        values.append(high if bounds.high_open else high + 1)
    return values


def bounded_fields(cls) -> list[tuple[str, Bounds, type]]:
    hints = type_hints(cls)
    return [(f.name, setting_of(f).bounds, hints[f.name]) for f in dataclasses.fields(cls) if setting_of(f) and setting_of(f).bounds]


@pytest.mark.parametrize(
    "prefix, name, bounds, type_", [(p, *b) for p, cls in trainer_sections() for b in bounded_fields(cls)], ids=lambda x: str(x)
)
def test_trainer_bounds_are_enforced_from_the_declaration(prefix, name, bounds, type_):
    for value in outside(bounds):
        value = type_(value)
        with pytest.raises(ValueError) as err:
            load_config(None, [f"{prefix}{name}={value}"])
        assert f"{prefix}{name} must be {bounds.phrase()}, got {value!r}" in str(err.value)
    if isinstance(bounds.low, (int, float)) and math.isfinite(bounds.low) and not bounds.low_open:
        config_from_dict(apply_overrides({}, [f"{prefix}{name}={type_(bounds.low)}"]))  # the closed end itself is allowed


@pytest.mark.parametrize("name, bounds, type_", bounded_fields(ToyConfig), ids=lambda x: str(x))
def test_toy_bounds_are_enforced_from_the_declaration(name, bounds, type_):
    for value in outside(bounds):
        value = type_(value)
        with pytest.raises(ValueError) as err:
            check_config(dataclasses.replace(ToyConfig(), **{name: value}))
        assert str(err.value) == f"{name} must be {bounds.phrase()}, got {value!r}"


def test_toy_choices_and_types_come_from_the_declaration():
    with pytest.raises(ValueError, match=r"^optimizer must be one of adam, sgd; got 'lbfgs'$"):
        check_config(ToyConfig(optimizer="lbfgs"))
    with pytest.raises(ValueError, match=r"^seeds must be an integer, got True$"):
        check_config(ToyConfig(seeds=True))
    with pytest.raises(ValueError, match=r"^lr must be a finite number, got nan$"):
        check_config(ToyConfig(lr=math.nan))
    check_config(ToyConfig(lr=1))  # an int where a float is declared


def test_objective_bounds_use_the_same_check():
    """An ObjectiveSpec bound and a config bound give the same message for the same value."""
    bounds = SPEC_FIELDS["eps_low"].bounds_for(ObjectiveSpec(name="x", description="y"))
    with pytest.raises(ValueError) as expected:
        check_bounds("eps_low", -1.0, bounds)
    with pytest.raises(ValueError) as spec:
        resolve_objective("grpo", eps_low=-1.0)
    assert str(spec.value) == str(expected.value) == "eps_low must be in [0, 1], got -1.0"
    with pytest.raises(ValueError, match=r"cov_clip_high must be >= 2, got 1.0"):  # an end that names a field
        resolve_objective("grpo", cov_control="clip_cov", cov_clip_low=2.0, cov_clip_high=1.0)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, True, False, "1", None, [1.0]])
def test_what_is_not_a_finite_number_is_refused_by_the_one_check_and_by_bounds(value):
    """finite_number is the one finite-number check: NaN, an infinity, a bool or a non-number fail it, and a bound
    refuses exactly those values in one sentence."""
    from dfpo.core.settings import finite_number

    bounds = SPEC_FIELDS["eps_low"].bounds_for(ObjectiveSpec(name="x", description="y"))
    assert not finite_number(value)
    with pytest.raises(ValueError, match=r"^eps_low must be a finite number, got "):
        check_bounds("eps_low", value, bounds)


@pytest.mark.parametrize("value", [0, 1, -3, 0.5, 1e300, -0.0])
def test_a_finite_int_or_float_is_a_finite_number(value):
    from dfpo.core.settings import finite_number

    assert finite_number(value)


def test_a_new_declaration_is_checked_parsed_and_documented():
    """The mechanism is not tied to the three configs: a dataclass declared with setting() gets all of it."""

    @dataclasses.dataclass(frozen=True)
    class Probe:
        rate: float = setting(0.5, "A rate.", bounds=Bounds(0, 1, high_open=True))
        kind: str = setting("a", "A kind.", choices=("a", "b"))
        items: list = setting(factory=list, doc="Some items.")

    check_fields(Probe())
    with pytest.raises(ValueError, match=r"^rate must be in \[0, 1\), got 1.0$"):
        check_fields(Probe(rate=1.0))
    with pytest.raises(ValueError, match=r"^kind must be one of a, b; got 'c'$"):
        check_fields(Probe(kind="c"))
    with pytest.raises(ValueError, match="doc"):
        setting(1, " ")
    assert parse_value("rate", "0.25", type_hints(Probe)["rate"]) == 0.25


def test_the_settings_module_and_the_toy_config_stay_light():
    code = "import sys, dfpo.core.settings, dfpo.toy.config; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("text", ["\udcff{prompt}", "a\ud800"])
def test_a_string_that_is_not_text_names_the_key(text):
    """Bytes that are not UTF-8 on a command line reach Python as lone surrogates: a tokenizer or a file writer used to
    fail on them far from the setting."""
    with pytest.raises(ValueError, match=r"^data.prompt_template holds .*, which is not text: character \d+ is a lone surrogate"):
        load_config(None, [f"data.prompt_template={text}"])
