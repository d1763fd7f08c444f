"""Config-override flags come from the annotations: Literal choices, bools, optional numbers."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Literal

import pytest

from lamina.cli import main
from lamina.cli.flags import add_config_overrides, config_overrides, field_flag


@pytest.mark.parametrize(
    ("tp", "text", "value"),
    [(int, "3", 3), (float, "0.5", 0.5), (int | None, "4", 4), (float | None, "2.5", 2.5),
     (str, "x", "x"), (Literal["layer", "rms"], "rms", "rms")],
)  # fmt: skip
def test_each_annotation_gives_a_typed_flag(tp, text, value):
    p = argparse.ArgumentParser()
    p.add_argument("--f", default=None, **field_flag(tp))
    got = p.parse_args(["--f", text]).f
    assert got == value and type(got) is type(value)
    assert p.parse_args([]).f is None


def test_literal_refuses_other_values_and_bool_has_a_no_form():
    p = argparse.ArgumentParser()
    p.add_argument("--norm", default=None, **field_flag(Literal["layer", "rms"]))
    p.add_argument("--qk-norm", default=None, **field_flag(bool))
    with pytest.raises(SystemExit):
        p.parse_args(["--norm", "batch"])
    assert p.parse_args(["--no-qk-norm"]).qk_norm is False
    assert p.parse_args(["--qk-norm"]).qk_norm is True


def test_an_unsupported_annotation_is_refused():
    with pytest.raises(TypeError, match="no command-line flag"):
        field_flag(list[int])
    with pytest.raises(TypeError, match="no command-line flag"):
        field_flag(int | str)


def test_gpt_config_flags_keep_their_choices(capsys):
    """`--activation swish` is refused by the parser, before the config sees it."""
    with pytest.raises(SystemExit) as exc:
        main(["count", "tiny", "--activation", "swish"])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err
    assert main(["count", "tiny", "--activation", "relu", "--json"]) == 0


def test_overrides_hold_only_what_was_typed():
    p = argparse.ArgumentParser()
    add_config_overrides(p)
    args = p.parse_args(["--n-layers", "3", "--no-bias", "--positions", "sinusoidal"])
    assert config_overrides(args) == {"n_layers": 3, "bias": False, "positions": "sinusoidal"}
    assert config_overrides(p.parse_args([])) == {}


def test_fields_of_the_coming_kinds_get_flags():
    """RoPE / RMSNorm / GQA style fields need no new code here."""

    @dataclasses.dataclass(frozen=True)
    class Future:
        positions: Literal["learned", "sinusoidal", "rope"] = "learned"
        n_kv_heads: int | None = None
        logit_softcap: float | None = None
        qk_norm: bool = False

    p, hints = argparse.ArgumentParser(), typing.get_type_hints(Future)
    for f in dataclasses.fields(Future):
        p.add_argument("--" + f.name.replace("_", "-"), default=None, **field_flag(hints[f.name]))
    args = p.parse_args(["--positions", "rope", "--n-kv-heads", "2", "--logit-softcap", "30",
                         "--qk-norm"])  # fmt: skip
    assert (args.positions, args.n_kv_heads, args.logit_softcap, args.qk_norm) == (
        "rope", 2, 30.0, True)  # fmt: skip
