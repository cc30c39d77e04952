"""`prism_wire.secret.read_secret`: the one reader of a secret given directly or in a
file, shared by the proxy, prism-sim, the SGLang launcher and the plugin."""

from __future__ import annotations

from pathlib import Path

import pytest

from prism_wire.secret import SecretError, read_secret


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "key").write_text("  s3cret\n")  # as `echo` writes it, padded
    (tmp_path / "blank").write_text(" \n\t\n")
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00")
    return {
        "key": str(tmp_path / "key"),
        "blank": str(tmp_path / "blank"),
        "binary": str(tmp_path / "binary"),
        "missing": str(tmp_path / "nope"),
        "directory": str(tmp_path),
    }


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, None),
        ({"TOKEN": "t0k"}, "t0k"),
        ({"TOKEN_FILE": "{key}"}, "s3cret"),  # surrounding whitespace is not the secret's
        ({"TOKEN": "", "TOKEN_FILE": "{key}"}, "s3cret"),  # `TOKEN=` counts as not given
        ({"TOKEN": "t0k", "TOKEN_FILE": ""}, "t0k"),
        ({"TOKEN": "", "TOKEN_FILE": ""}, None),
        ({"OTHER": "x", "OTHER_FILE": "{key}"}, None),  # only `name`'s settings are read
    ],
)
def test_the_secret_comes_from_the_value_or_the_file(
    files: dict[str, str], settings: dict[str, str], expected: str | None
) -> None:
    settings = {key: value.format(**files) for key, value in settings.items()}
    assert read_secret(settings, "TOKEN") == expected


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"TOKEN": "t0k", "TOKEN_FILE": "{key}"},
         "TOKEN: given both directly and as TOKEN_FILE; give one"),
        ({"TOKEN_FILE": "{missing}"},
         "TOKEN_FILE: cannot read {missing}: No such file or directory"),
        ({"TOKEN_FILE": "{directory}"}, "TOKEN_FILE: cannot read {directory}: Is a directory"),
        ({"TOKEN_FILE": "{blank}"}, "TOKEN_FILE: {blank} is empty"),
        ({"TOKEN_FILE": "{binary}"}, "TOKEN_FILE: {binary} is not UTF-8 text"),
    ],
)  # fmt: skip
def test_an_unusable_setting_is_an_error_naming_it(
    files: dict[str, str], settings: dict[str, str], message: str
) -> None:
    settings = {key: value.format(**files) for key, value in settings.items()}
    with pytest.raises(SecretError) as caught:
        read_secret(settings, "TOKEN")
    assert str(caught.value) == message.format(**files)


def test_the_file_setting_takes_the_callers_suffix(files: dict[str, str]) -> None:
    """The proxy's settings are `control_token` / `control_token_file`."""
    assert read_secret({"control_token_file": files["key"]}, "control_token", "_file") == "s3cret"
    with pytest.raises(SecretError, match=r"^control_token_file: .* is empty$"):
        read_secret({"control_token_file": files["blank"]}, "control_token", "_file")
